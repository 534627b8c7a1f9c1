#pragma once
// HttpGet: one plain GET for tests (libcurl), giving the status, the content type and the body.

#include <curl/curl.h>

#include <string>

namespace minions::testing {

struct HttpReply {
  long status = 0;  // 0: no answer (connection refused, timeout)
  std::string content_type;
  std::string body;
};

inline HttpReply HttpGet(const std::string& url, long timeout_ms = 10000) {
  HttpReply reply;
  CURL* curl = curl_easy_init();
  if (!curl) return reply;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
    static_cast<std::string*>(out)->append(data, size * n);
    return size * n;
  });
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
    char* type = nullptr;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
    if (type) reply.content_type = type;
  }
  curl_easy_cleanup(curl);
  return reply;
}

}  // namespace minions::testing
