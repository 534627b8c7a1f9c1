#include "executor/blob_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "blob/local/local_blob_store.h"

namespace minions {
namespace {

bool IsHttpUrl(const std::string& url) {
  return absl::StartsWithIgnoreCase(url, "http://") || absl::StartsWithIgnoreCase(url, "https://");
}

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

// Connection failures are retried by HttpClient; 5xx and 429 too.
std::optional<std::string> Transient(const HttpClient::Response& r, const std::string& url) {
  if (r.status >= 500 || r.status == 429) {
    return absl::StrCat("'", RedactedUrl(url), "' answered HTTP ", r.status, ": ", DescribeBody(r.body));
  }
  return std::nullopt;
}

absl::Status HttpError(const HttpClient::Response& r, const std::string& what, const std::string& url) {
  std::string detail = absl::StrCat(what, " '", RedactedUrl(url), "': HTTP ", r.status, " ", DescribeBody(r.body));
  if (r.status == 404) return absl::NotFoundError(detail);
  if (r.status == 403 || r.status == 401) return absl::PermissionDeniedError(detail);
  if (r.status == 400) return absl::InvalidArgumentError(detail);
  return absl::InternalError(detail);
}

}  // namespace

UrlBlobClient::UrlBlobClient(Options options)
    : http_(options.clock != nullptr ? options.clock : &real_clock_,
            HttpClient::Options{options.max_attempts, options.initial_backoff, options.connect_timeout}) {}

absl::StatusOr<std::string> UrlBlobClient::GetRange(const std::string& url, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin) return absl::InvalidArgumentError("bad byte range");
  if (IsHttpUrl(url)) {
    if (begin == end) return std::string();
    const HttpClient::Request request{"GET", url, {absl::StrCat("Range: bytes=", begin, "-", end - 1)}};
    auto r = http_.Send([&] { return request; }, [&](const HttpClient::Response& response) { return Transient(response, url); });
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
      return absl::DataLossError(absl::StrCat("input '", RedactedUrl(url), "' is shorter than the task's byte range"));
    }
    return out;
  }
  auto path = FileUrlPath(url);
  if (!path.ok()) {
    return absl::UnimplementedError(absl::StrCat("cannot fetch '", RedactedUrl(url), "': only file://, http:// and https:// URLs are supported"));
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
    const HttpClient::Request request{"PUT", url, {}, data};
    auto r = http_.Send([&] { return request; }, [&](const HttpClient::Response& response) { return Transient(response, url); });
    if (!r.ok()) return r.status();
    if (r->status != 200 && r->status != 201 && r->status != 204) return HttpError(*r, "cannot upload to", url);
    return absl::OkStatus();
  }
  auto path = FileUrlPath(url);
  if (!path.ok()) {
    return absl::UnimplementedError(absl::StrCat("cannot upload to '", RedactedUrl(url), "': only file://, http:// and https:// URLs are supported"));
  }
  return WriteFileAtomically(*path, data);
}

}  // namespace minions
