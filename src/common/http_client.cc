#include "common/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace minions {
namespace {

void GlobalCurlInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// What libcurl's callbacks work on during one exchange.
struct Transfer {
  CURL* curl = nullptr;
  HttpClient::Response* response = nullptr;
  const std::function<bool(std::string_view)>* sink = nullptr;
  std::string_view upload;
};

size_t OnWrite(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->sink != nullptr && status >= 200 && status < 300) {
    t->response->sink_used = true;
    if (!(*t->sink)(std::string_view(data, n))) {
      t->response->sink_stopped = true;
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    return n;
  }
  t->response->body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->response->headers.clear();  // a new response (after 100 Continue or a redirect)
    return n;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    t->response->headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return n;
}

size_t OnRead(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = std::min(size * count, t->upload.size());
  std::copy_n(t->upload.data(), n, buffer);
  t->upload.remove_prefix(n);
  return n;
}

}  // namespace

std::string RedactedUrl(std::string_view url) { return std::string(url.substr(0, url.find('?'))); }

HttpClient::HttpClient(Clock* clock, Options options) : clock_(clock), options_(options) {}

HttpClient::Response HttpClient::Exchange(const Request& request) const {
  GlobalCurlInit();
  Response response;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    response.transport_error = "curl_easy_init failed";
    return response;
  }
  Transfer transfer{curl, &response, request.sink, request.body};
  char error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  for (const std::string& header : request.headers) headers = curl_slist_append(headers, header.c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  // A stalled transfer (under 1 byte/s for 60 s) is a failure, not a hang.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnWrite);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(curl, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  response.reached = code == CURLE_OK || response.sink_stopped;
  if (!response.reached) response.transport_error = error[0] != '\0' ? error : curl_easy_strerror(code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return response;
}

absl::StatusOr<HttpClient::Response> HttpClient::Send(
    absl::FunctionRef<Request()> request,
    absl::FunctionRef<std::optional<std::string>(const Response&)> transient) const {
  std::string last_error;
  absl::Duration backoff = options_.initial_backoff;
  for (int attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    if (attempt > 1) {
      clock_->SleepFor(backoff);
      backoff *= 2;
    }
    const Request made = request();
    Response response = Exchange(made);
    if (!response.reached) {
      last_error = absl::StrCat("cannot reach '", RedactedUrl(made.url), "': ", response.transport_error);
      // Part of the body went to the sink already: a retry would hand it over twice.
      if (response.sink_used) return absl::UnavailableError(last_error);
      continue;
    }
    std::optional<std::string> reason = transient(response);
    if (!reason) return response;
    last_error = std::move(*reason);
  }
  return absl::UnavailableError(absl::StrCat(last_error, " (gave up after ", options_.max_attempts, " attempts)"));
}

}  // namespace minions
