#include "blob/s3/s3_blob_store.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "blob/read_whole.h"

namespace minions {

namespace {

// ---- tiny XML helpers (S3 responses are flat enough) ----

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out.push_back('&');
      continue;
    }
    std::string_view entity = s.substr(i + 1, semi - i - 1);
    if (entity == "amp") out.push_back('&');
    else if (entity == "lt") out.push_back('<');
    else if (entity == "gt") out.push_back('>');
    else if (entity == "quot") out.push_back('"');
    else if (entity == "apos") out.push_back('\'');
    else if (!entity.empty() && entity[0] == '#') {
      uint32_t code = 0;
      bool ok = entity.size() > 1 && entity[1] == 'x'
                    ? absl::SimpleHexAtoi(std::string(entity.substr(2)), &code)
                    : absl::SimpleAtoi(std::string(entity.substr(1)), &code);
      if (!ok || code > 0x7f) {  // keys here are ASCII; keep anything else verbatim
        out.append(s.substr(i, semi - i + 1));
      } else {
        out.push_back(static_cast<char>(code));
      }
    } else {
      out.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

std::vector<std::string> XmlValues(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  std::string open = absl::StrCat("<", std::string(tag), ">"), close = absl::StrCat("</", std::string(tag), ">");
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    size_t start = pos + open.size();
    size_t end = xml.find(close, start);
    if (end == std::string_view::npos) break;
    out.push_back(XmlUnescape(xml.substr(start, end - start)));
    pos = end + close.size();
  }
  return out;
}

std::string XmlValue(std::string_view xml, std::string_view tag) {
  auto values = XmlValues(xml, tag);
  return values.empty() ? std::string() : values.front();
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

bool IsThrottleCode(const std::string& code) {
  return code == "SlowDown" || code == "Throttling" || code == "ThrottlingException" || code == "RequestTimeout" ||
         code == "InternalError" || code == "ServiceUnavailable";
}

std::string Describe(const std::string& body) {
  std::string code = XmlValue(body, "Code"), message = XmlValue(body, "Message");
  if (code.empty() && message.empty()) return std::string(absl::StripAsciiWhitespace(body.substr(0, 200)));
  if (message.empty()) return code;
  if (code.empty()) return message;
  return absl::StrCat(code, ": ", message);
}

}  // namespace

// Maps an unsuccessful S3 response to a status.
static absl::Status ErrorStatus(const HttpClient::Response& response, const std::string& what) {
  std::string code = XmlValue(response.body, "Code");
  std::string detail = Describe(response.body);
  std::string suffix = detail.empty() ? "" : absl::StrCat(": ", detail);
  if (response.status == 404 || code == "NoSuchKey") {
    if (code == "NoSuchBucket") return absl::FailedPreconditionError(absl::StrCat(what, ": the bucket does not exist", suffix));
    return absl::NotFoundError(absl::StrCat(what, ": no such object", suffix));
  }
  if (response.status == 403) return absl::PermissionDeniedError(absl::StrCat(what, ": S3 refused access", suffix));
  if (response.status == 400) return absl::InvalidArgumentError(absl::StrCat(what, ": S3 answered 400", suffix));
  return absl::InternalError(absl::StrCat(what, ": S3 answered HTTP ", response.status, suffix));
}

S3Config S3ConfigFromEnvironment(S3Config config) {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  auto fill = [](std::string& field, const std::string& value) {
    if (field.empty() && !value.empty()) field = value;
  };
  fill(config.access_key, env("AWS_ACCESS_KEY_ID"));
  fill(config.secret_key, env("AWS_SECRET_ACCESS_KEY"));
  fill(config.session_token, env("AWS_SESSION_TOKEN"));
  fill(config.endpoint, env("AWS_ENDPOINT_URL_S3"));
  fill(config.endpoint, env("AWS_ENDPOINT_URL"));
  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (!region.empty() && (config.region.empty() || config.region == S3Config().region)) config.region = region;
  return config;
}

S3BlobStore::S3BlobStore(S3Config config)
    : config_(std::move(config)),
      clock_(config_.clock != nullptr ? config_.clock : &real_clock_),
      http_(clock_, HttpClient::Options{config_.max_attempts, config_.initial_backoff, config_.connect_timeout}) {}

absl::StatusOr<std::unique_ptr<S3BlobStore>> S3BlobStore::Open(S3Config config) {
  if (config.bucket.empty()) return absl::InvalidArgumentError("S3: no bucket configured");
  if (config.region.empty()) return absl::InvalidArgumentError("S3: no region configured");
  if (config.access_key.empty() || config.secret_key.empty()) {
    return absl::InvalidArgumentError(
        "S3: no credentials (set access_key/secret_key or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)");
  }
  if (config.max_attempts < 1) return absl::InvalidArgumentError("S3: max_attempts must be at least 1");
  if (config.part_size < 1) return absl::InvalidArgumentError("S3: part_size must be positive");
  if (config.list_page_size < 1) return absl::InvalidArgumentError("S3: list_page_size must be positive");
  std::string endpoint = config.endpoint.empty() ? absl::StrCat("https://s3.", config.region, ".amazonaws.com")
                                                 : config.endpoint;
  std::string rest = endpoint;
  std::string scheme;
  if (absl::StartsWith(rest, "https://")) scheme = "https";
  else if (absl::StartsWith(rest, "http://")) scheme = "http";
  else return absl::InvalidArgumentError(absl::StrCat("S3: endpoint '", endpoint, "' is not an http(s) URL"));
  rest = rest.substr(scheme.size() + 3);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos || rest.find('?') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("S3: endpoint '", endpoint, "' must be scheme://host[:port]"));
  }
  while (!config.prefix.empty() && config.prefix.back() == '/') config.prefix.pop_back();
  while (!config.prefix.empty() && config.prefix.front() == '/') config.prefix.erase(0, 1);
  if (!config.prefix.empty()) {
    if (auto s = ValidateBlobKey(config.prefix); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("S3: bad key prefix: ", s.message()));
    }
  }
  auto store = std::unique_ptr<S3BlobStore>(new S3BlobStore(std::move(config)));
  store->scheme_ = scheme;
  store->host_ = std::string(rest);
  return store;
}

std::string S3BlobStore::ObjectKey(const std::string& key) const {
  return config_.prefix.empty() ? key : absl::StrCat(config_.prefix, "/", key);
}

std::string S3BlobStore::PathFor(const std::string& object_key) const {
  if (config_.path_style) return object_key.empty() ? absl::StrCat("/", config_.bucket) : absl::StrCat("/", config_.bucket, "/", object_key);
  return absl::StrCat("/", object_key);
}

absl::StatusOr<HttpClient::Response> S3BlobStore::Send(const std::string& method, const std::string& path,
                                               const sigv4::Pairs& query, const sigv4::Pairs& extra_headers,
                                               std::string_view body,
                                               const std::function<bool(std::string_view)>* sink) {
  const std::string host = config_.path_style ? host_ : absl::StrCat(config_.bucket, ".", host_);
  std::string url = absl::StrCat(scheme_, "://", host, sigv4::UriEncode(path, true));
  if (!query.empty()) absl::StrAppend(&url, "?", sigv4::CanonicalQuery(query));
  const std::string payload_hash = sigv4::Sha256Hex(body);
  const sigv4::Credentials credentials{config_.access_key, config_.secret_key, config_.session_token};
  // Signed again for each try: the signature carries the time.
  auto signed_request = [&] {
    const absl::Time now = Now();
    sigv4::Request request{method, path, query, extra_headers, payload_hash};
    request.headers.emplace_back("host", host);
    request.headers.emplace_back("x-amz-date", sigv4::AmzDate(now));
    request.headers.emplace_back("x-amz-content-sha256", payload_hash);
    if (!credentials.session_token.empty()) request.headers.emplace_back("x-amz-security-token", credentials.session_token);
    HttpClient::Request http{method, url, {}, body, sink};
    for (const auto& [name, value] : request.headers) http.headers.push_back(absl::StrCat(name, ": ", value));
    http.headers.push_back(
        absl::StrCat("Authorization: ", sigv4::AuthorizationHeader(request, credentials, config_.region, now)));
    if (method == "POST") http.headers.push_back("Content-Type: application/xml");
    return http;
  };
  auto transient = [&](const HttpClient::Response& response) -> std::optional<std::string> {
    std::string code = response.status >= 300 ? XmlValue(response.body, "Code") : std::string();
    if (response.status >= 500 || response.status == 429 || IsThrottleCode(code)) {
      return absl::StrCat("S3 answered HTTP ", response.status, " to ", method, " ", path,
                          code.empty() ? "" : absl::StrCat(" (", Describe(response.body), ")"));
    }
    return std::nullopt;
  };
  return http_.Send(signed_request, transient);
}

absl::Status S3BlobStore::Put(const std::string& key, std::string_view data) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  auto response = Send("PUT", PathFor(ObjectKey(key)), {}, {}, data);
  if (!response.ok()) return response.status();
  if (response->status != 200) return ErrorStatus(*response, absl::StrCat("put '", key, "'"));
  return absl::OkStatus();
}

absl::Status S3BlobStore::PutStream(const std::string& key,
                                    const std::function<absl::StatusOr<std::string>()>& source) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  std::string buffer;
  while (static_cast<int64_t>(buffer.size()) < config_.part_size) {
    auto chunk = source();
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) return Put(key, buffer);  // small: one PUT
    buffer += *chunk;
  }
  return PutMultipart(ObjectKey(key), std::move(buffer), source);
}

absl::Status S3BlobStore::PutMultipart(const std::string& object_key, std::string buffer,
                                       const std::function<absl::StatusOr<std::string>()>& source) {
  const std::string path = PathFor(object_key);
  const std::string what = absl::StrCat("multipart upload of '", object_key, "'");
  auto created = Send("POST", path, {{"uploads", ""}}, {}, "");
  if (!created.ok()) return created.status();
  if (created->status != 200) return ErrorStatus(*created, what);
  const std::string upload_id = XmlValue(created->body, "UploadId");
  if (upload_id.empty()) return absl::InternalError(absl::StrCat(what, ": S3 gave no UploadId"));

  auto abort = [&](absl::Status status) {
    (void)Send("DELETE", path, {{"uploadId", upload_id}}, {}, "");
    return status;
  };
  std::vector<std::string> etags;
  auto upload_part = [&](std::string_view part) -> absl::Status {
    int number = static_cast<int>(etags.size()) + 1;
    auto r = Send("PUT", path, {{"partNumber", absl::StrCat(number)}, {"uploadId", upload_id}}, {}, part);
    if (!r.ok()) return r.status();
    if (r->status != 200) return ErrorStatus(*r, absl::StrCat(what, ", part ", number));
    auto etag = r->headers.find("etag");
    if (etag == r->headers.end()) return absl::InternalError(absl::StrCat(what, ": part ", number, " has no ETag"));
    etags.push_back(etag->second);
    return absl::OkStatus();
  };

  const size_t part_size = static_cast<size_t>(config_.part_size);
  bool done = false;
  while (!done) {
    // Parts are cut only while more than a part is buffered, so the last part is never empty.
    while (buffer.size() > part_size) {
      if (auto s = upload_part(std::string_view(buffer).substr(0, part_size)); !s.ok()) return abort(s);
      buffer.erase(0, part_size);
    }
    auto chunk = source();
    if (!chunk.ok()) return abort(chunk.status());
    if (chunk->empty()) {
      done = true;
    } else {
      buffer += *chunk;
    }
  }
  if (!buffer.empty()) {
    if (auto s = upload_part(buffer); !s.ok()) return abort(s);
  }
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    absl::StrAppend(&xml, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>", XmlEscape(etags[i]), "</ETag></Part>");
  }
  xml += "</CompleteMultipartUpload>";
  auto completed = Send("POST", path, {{"uploadId", upload_id}}, {}, xml);
  if (!completed.ok()) return abort(completed.status());
  // S3 can answer 200 and still fail, with an <Error> body.
  if (completed->status != 200 || absl::StrContains(completed->body, "<Error>")) {
    return abort(ErrorStatus(*completed, what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3BlobStore::Get(const std::string& key) { return ReadWhole(*this, key); }

absl::StatusOr<std::string> S3BlobStore::GetRange(const std::string& key, int64_t offset, int64_t length) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  if (offset < 0 || length < 0) return absl::InvalidArgumentError("negative range");
  if (length == 0) {
    auto size = Size(key);  // still NotFound for a missing object
    if (!size.ok()) return size.status();
    return std::string();
  }
  auto response = Send("GET", PathFor(ObjectKey(key)), {},
                       {{"range", absl::StrCat("bytes=", offset, "-", offset + length - 1)}}, "");
  if (!response.ok()) return response.status();
  switch (response->status) {
    case 206:
      if (static_cast<int64_t>(response->body.size()) > length) response->body.resize(static_cast<size_t>(length));
      return std::move(response->body);
    case 200: {  // the server ignored the range
      const std::string& all = response->body;
      if (offset >= static_cast<int64_t>(all.size())) return std::string();
      return all.substr(static_cast<size_t>(offset), static_cast<size_t>(length));
    }
    case 416:  // the range starts at or past the end
      return std::string();
    default:
      return ErrorStatus(*response, absl::StrCat("get '", key, "'"));
  }
}

absl::Status S3BlobStore::Read(const std::string& key, const std::function<bool(std::string_view)>& sink) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  auto response = Send("GET", PathFor(ObjectKey(key)), {}, {}, "", &sink);
  if (!response.ok()) return response.status();
  if (response->status != 200) return ErrorStatus(*response, absl::StrCat("get '", key, "'"));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> S3BlobStore::Size(const std::string& key) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  auto response = Send("HEAD", PathFor(ObjectKey(key)), {}, {}, "");
  if (!response.ok()) return response.status();
  if (response->status != 200) return ErrorStatus(*response, absl::StrCat("size of '", key, "'"));
  auto it = response->headers.find("content-length");
  int64_t size = 0;
  if (it == response->headers.end() || !absl::SimpleAtoi(it->second, &size)) {
    return absl::InternalError(absl::StrCat("size of '", key, "': S3 sent no Content-Length"));
  }
  return size;
}

absl::StatusOr<std::vector<std::string>> S3BlobStore::List(const std::string& prefix) {
  const std::string full_prefix = config_.prefix.empty() ? prefix : absl::StrCat(config_.prefix, "/", prefix);
  const size_t strip = config_.prefix.empty() ? 0 : config_.prefix.size() + 1;
  std::vector<std::string> keys;
  std::string token;
  while (true) {
    sigv4::Pairs query = {{"list-type", "2"}, {"max-keys", absl::StrCat(config_.list_page_size)}};
    if (!full_prefix.empty()) query.emplace_back("prefix", full_prefix);
    if (!token.empty()) query.emplace_back("continuation-token", token);
    auto response = Send("GET", PathFor(""), query, {}, "");
    if (!response.ok()) return response.status();
    if (response->status != 200) return ErrorStatus(*response, absl::StrCat("list '", prefix, "'"));
    for (auto& key : XmlValues(response->body, "Key")) {
      if (key.size() >= strip && absl::StartsWith(key, full_prefix)) keys.push_back(key.substr(strip));
    }
    token = XmlValue(response->body, "NextContinuationToken");
    if (XmlValue(response->body, "IsTruncated") != "true" || token.empty()) break;
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

absl::Status S3BlobStore::Delete(const std::string& key) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  auto response = Send("DELETE", PathFor(ObjectKey(key)), {}, {}, "");
  if (!response.ok()) return response.status();
  if (response->status == 200 || response->status == 204 || response->status == 404) return absl::OkStatus();
  return ErrorStatus(*response, absl::StrCat("delete '", key, "'"));
}

absl::StatusOr<std::string> S3BlobStore::Url(const std::string& key, UrlAccess access, absl::Duration ttl) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  // SigV4 presigned URLs live from 1 second to 7 days.
  int64_t seconds = std::clamp<int64_t>(absl::ToInt64Seconds(ttl), 1, 7 * 24 * 3600);
  const std::string host = config_.path_style ? host_ : absl::StrCat(config_.bucket, ".", host_);
  const std::string path = PathFor(ObjectKey(key));
  const sigv4::Credentials credentials{config_.access_key, config_.secret_key, config_.session_token};
  auto presigned = sigv4::Presign(access == UrlAccess::kRead ? "GET" : "PUT", host, path, {}, credentials,
                                  config_.region, Now(), seconds);
  return absl::StrCat(scheme_, "://", host, sigv4::UriEncode(path, true), "?", presigned.query);
}

}  // namespace minions
