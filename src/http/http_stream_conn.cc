#include "http/http_stream_conn.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace minions::http_internal {
namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

}  // namespace

std::string ResponseHead(int status, const std::string& content_type, int64_t content_length, bool keep_alive,
                         const std::map<std::string, std::string>& headers) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n");
  absl::StrAppend(&out, "Content-Type: ", content_type, "\r\n");
  if (content_length >= 0) {
    absl::StrAppend(&out, "Content-Length: ", content_length, "\r\n");
  } else {
    absl::StrAppend(&out, "Transfer-Encoding: chunked\r\n");
  }
  absl::StrAppend(&out, "Connection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  // Nothing here is meant to be framed, sniffed or followed elsewhere.
  // same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with the
  // dashboard's own login form, which must then be told from an opaque origin's (refused).
  absl::StrAppend(&out, "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: same-origin\r\n");
  if (absl::StartsWith(content_type, "text/html")) {
    absl::StrAppend(&out,
                    "Content-Security-Policy: default-src 'self'; frame-ancestors 'none'; form-action 'self'\r\n");
  }
  for (const auto& [name, value] : headers) {
    // Handlers are ours, but a header value must never end the header block.
    if (value.find_first_of("\r\n") != std::string::npos || name.find_first_of("\r\n:") != std::string::npos) continue;
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  absl::StrAppend(&out, "\r\n");
  return out;
}

}  // namespace minions::http_internal
