#pragma once
// HttpGet / HttpPost: one plain request for tests (libcurl), giving the status, the content type,
// the response headers and the body. Redirects are not followed.

#include <curl/curl.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"

namespace minions::testing {

struct HttpReply {
  long status = 0;  // 0: no answer (connection refused, timeout, TLS refused)
  std::string content_type;
  std::string body;
  std::map<std::string, std::string> headers;  // names in lower case
};

struct HttpOptions {
  long timeout_ms = 10000;
  std::vector<std::string> headers;  // "Name: value"
  std::string ca_file;               // https: the CA to check the server against
  std::string post_body;             // POST this (application/x-www-form-urlencoded) when set
  bool post = false;
  std::string method;                // another method ("DELETE") when set
};

inline HttpReply HttpRequestOnce(const std::string& url, const HttpOptions& options) {
  HttpReply reply;
  CURL* curl = curl_easy_init();
  if (!curl) return reply;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, options.timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
    static_cast<std::string*>(out)->append(data, size * n);
    return size * n;
  });
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &reply.headers);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
    std::string line(data, size * n);
    auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = absl::AsciiStrToLower(line.substr(0, colon));
      (*static_cast<std::map<std::string, std::string>*>(out))[name] =
          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    return size * n;
  });
  curl_slist* headers = nullptr;
  for (const auto& h : options.headers) headers = curl_slist_append(headers, h.c_str());
  if (headers) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
  if (options.post) {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, options.post_body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(options.post_body.size()));
  }
  if (!options.method.empty()) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, options.method.c_str());
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
    char* type = nullptr;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
    if (type) reply.content_type = type;
  }
  if (headers) curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return reply;
}

inline HttpReply HttpGet(const std::string& url, long timeout_ms = 10000, std::vector<std::string> headers = {}) {
  HttpOptions options;
  options.timeout_ms = timeout_ms;
  options.headers = std::move(headers);
  return HttpRequestOnce(url, options);
}

inline HttpReply HttpPost(const std::string& url, const std::string& body, std::vector<std::string> headers = {}) {
  HttpOptions options;
  options.post = true;
  options.post_body = body;
  options.headers = std::move(headers);
  return HttpRequestOnce(url, options);
}

}  // namespace minions::testing
