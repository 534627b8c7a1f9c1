#include "executor/blob_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "blob/local/local_blob_store.h"

namespace minions {
namespace {

bool IsHttpUrl(const std::string& url) {
  return absl::StartsWithIgnoreCase(url, "http://") || absl::StartsWithIgnoreCase(url, "https://");
}

// The URL without its query: presigned URLs carry credentials-derived signatures that have no
// place in logs or error messages.
std::string Redacted(const std::string& url) { return url.substr(0, url.find('?')); }

// The <Code> and <Message> of an S3 error body, or the start of any other body.
std::string DescribeBody(const std::string& body) {
  auto value = [&](std::string_view tag) -> std::string {
    std::string open = absl::StrCat("<", std::string(tag), ">"), close = absl::StrCat("</", std::string(tag), ">");
    size_t a = body.find(open);
    if (a == std::string::npos) return "";
    a += open.size();
    size_t b = body.find(close, a);
    return b == std::string::npos ? "" : body.substr(a, b - a);
  };
  std::string code = value("Code"), message = value("Message");
  if (!code.empty() || !message.empty()) return absl::StrCat(code, code.empty() || message.empty() ? "" : ": ", message);
  return body.substr(0, 200);
}

struct HttpResult {
  CURLcode code = CURLE_OK;
  std::string error;
  long status = 0;
  std::string body;
};

struct Upload {
  std::string_view rest;
};

size_t Append(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

size_t ReadUpload(char* buffer, size_t size, size_t count, void* user) {
  auto* upload = static_cast<Upload*>(user);
  size_t n = std::min(size * count, upload->rest.size());
  std::copy_n(upload->rest.data(), n, buffer);
  upload->rest.remove_prefix(n);
  return n;
}

HttpResult Perform(const std::string& url, const std::string* range, const std::string_view* put_body,
                   absl::Duration connect_timeout) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  HttpResult result;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    result.code = CURLE_FAILED_INIT;
    result.error = "curl_easy_init failed";
    return result;
  }
  char error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = curl_slist_append(nullptr, "Expect:");
  std::string range_header;
  if (range != nullptr) {
    range_header = absl::StrCat("Range: ", *range);
    headers = curl_slist_append(headers, range_header.c_str());
  }
  Upload upload;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body);
  if (put_body != nullptr) {
    upload.rest = *put_body;
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadUpload);
    curl_easy_setopt(curl, CURLOPT_READDATA, &upload);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(put_body->size()));
  }
  result.code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  if (result.code != CURLE_OK) result.error = error[0] ? error : curl_easy_strerror(result.code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return result;
}

// Runs `attempt` until it gives an answer that is not transient.
absl::StatusOr<HttpResult> WithRetries(const UrlBlobClient::Options& options, const std::string& url,
                                       const std::function<HttpResult()>& attempt) {
  std::string last;
  absl::Duration backoff = options.initial_backoff;
  for (int i = 1; i <= options.max_attempts; ++i) {
    if (i > 1) {
      absl::SleepFor(backoff);
      backoff *= 2;
    }
    HttpResult r = attempt();
    if (r.code != CURLE_OK) {
      last = absl::StrCat("cannot reach '", Redacted(url), "': ", r.error);
      continue;
    }
    if (r.status >= 500 || r.status == 429) {
      last = absl::StrCat("'", Redacted(url), "' answered HTTP ", r.status, ": ", DescribeBody(r.body));
      continue;
    }
    return r;
  }
  return absl::UnavailableError(absl::StrCat(last, " (gave up after ", options.max_attempts, " attempts)"));
}

absl::Status HttpError(const HttpResult& r, const std::string& what, const std::string& url) {
  std::string detail = absl::StrCat(what, " '", Redacted(url), "': HTTP ", r.status, " ", DescribeBody(r.body));
  if (r.status == 404) return absl::NotFoundError(detail);
  if (r.status == 403 || r.status == 401) return absl::PermissionDeniedError(detail);
  if (r.status == 400) return absl::InvalidArgumentError(detail);
  return absl::InternalError(detail);
}

}  // namespace

absl::StatusOr<std::string> UrlBlobClient::GetRange(const std::string& url, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin) return absl::InvalidArgumentError("bad byte range");
  if (IsHttpUrl(url)) {
    if (begin == end) return std::string();
    const std::string range = absl::StrCat("bytes=", begin, "-", end - 1);
    auto r = WithRetries(options_, url, [&] { return Perform(url, &range, nullptr, options_.connect_timeout); });
    if (!r.ok()) return r.status();
    const size_t want = static_cast<size_t>(end - begin);
    std::string out;
    if (r->status == 206) {
      out = std::move(r->body);
    } else if (r->status == 200) {  // the server ignored the range
      if (r->body.size() > static_cast<size_t>(begin)) out = r->body.substr(static_cast<size_t>(begin), want);
    } else if (r->status != 416) {
      return HttpError(*r, "cannot fetch", url);
    }
    if (out.size() > want) out.resize(want);
    if (out.size() != want) {
      return absl::DataLossError(absl::StrCat("input '", Redacted(url), "' is shorter than the task's byte range"));
    }
    return out;
  }
  auto path = FileUrlPath(url);
  if (!path.ok()) {
    return absl::UnimplementedError(absl::StrCat("cannot fetch '", Redacted(url), "': only file://, http:// and https:// URLs are supported"));
  }
  int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("input '", *path, "' does not exist"));
    return absl::UnavailableError(absl::StrCat("cannot open '", *path, "': ", std::strerror(errno)));
  }
  std::string out(static_cast<size_t>(end - begin), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::pread(fd, out.data() + got, out.size() - got, begin + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != out.size()) {
    return absl::DataLossError(absl::StrCat("input '", *path, "' is shorter than the task's byte range"));
  }
  return out;
}

absl::Status UrlBlobClient::Put(const std::string& url, std::string_view data) {
  if (IsHttpUrl(url)) {
    auto r = WithRetries(options_, url, [&] { return Perform(url, nullptr, &data, options_.connect_timeout); });
    if (!r.ok()) return r.status();
    if (r->status != 200 && r->status != 201 && r->status != 204) return HttpError(*r, "cannot upload to", url);
    return absl::OkStatus();
  }
  auto path = FileUrlPath(url);
  if (!path.ok()) {
    return absl::UnimplementedError(absl::StrCat("cannot upload to '", Redacted(url), "': only file://, http:// and https:// URLs are supported"));
  }
  return WriteFileAtomically(*path, data);
}

}  // namespace minions
