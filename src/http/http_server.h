#pragma once
// HttpServer: a small HTTP/1.1 server for the observability endpoints (/metrics, /healthz, the
// web dashboard and its JSON). GET and HEAD only; exact paths; query parameters decoded. Not for
// bulk data: the gRPC port carries the API.
//
// Ownership: owns its listening socket and a small pool of worker threads.
// Threads: Handle() before Start(); Start/Stop from the owning thread; handlers run on the worker
// threads, several at once, and must be thread-safe.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace minions {

struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> query;
  std::string Param(const std::string& name) const {
    auto it = query.find(name);
    return it == query.end() ? "" : it->second;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::map<std::string, std::string> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  explicit HttpServer(int threads = 4);
  ~HttpServer();

  void Handle(const std::string& path, HttpHandler handler);
  // Binds `listen` ("host:port"; port 0 picks a free one) and serves on a background thread.
  absl::Status Start(const std::string& listen);
  int port() const { return port_; }
  // Stops accepting, finishes the requests in flight, joins the threads. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::thread thread_;
};


}  // namespace minions
