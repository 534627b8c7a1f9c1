#include "http/http_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"

namespace minions {

struct HttpServer::Impl {
  httplib::Server server;
  std::map<std::string, HttpHandler> routes;
};

HttpServer::HttpServer(int threads) : impl_(std::make_unique<Impl>()) {
  // A few workers suffice: scrapes and dashboard polls are small; the default pool would start a
  // thread per core.
  impl_->server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server bind
  // the same port silently instead of failing.
  impl_->server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl_->server.set_read_timeout(5, 0);
  impl_->server.set_write_timeout(5, 0);
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, HttpHandler handler) { impl_->routes[path] = std::move(handler); }

absl::Status HttpServer::Start(const std::string& listen) {
  std::string host;
  int port = 0;
  if (auto s = SplitHostPort(listen, &host, &port); !s.ok()) return s;
  // Every path goes through one dispatcher: exact routes, 404 otherwise.
  auto dispatch = [this](const httplib::Request& req, httplib::Response& res) {
    auto it = impl_->routes.find(req.path);
    if (it == impl_->routes.end()) {
      res.status = 404;
      res.set_content(absl::StrCat("no page at ", req.path, "\n"), "text/plain; charset=utf-8");
      return;
    }
    HttpRequest request;
    request.path = req.path;
    for (const auto& [k, v] : req.params) request.query[k] = v;
    HttpResponse response;
    try {
      response = it->second(request);
    } catch (const std::exception& e) {
      response = {500, "text/plain; charset=utf-8", absl::StrCat("internal error: ", e.what(), "\n"), {}};
    }
    res.status = response.status;
    for (const auto& [k, v] : response.headers) res.set_header(k, v);
    res.set_content(std::move(response.body), response.content_type);
  };
  impl_->server.Get(".*", dispatch);
  bool bound;
  if (port == 0) {
    port_ = impl_->server.bind_to_any_port(host);
    bound = port_ > 0;
  } else {
    bound = impl_->server.bind_to_port(host, port);
    port_ = port;
  }
  if (!bound) {
    port_ = 0;
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", listen, " (is another process there?)"));
  }
  thread_ = std::thread([this] { impl_->server.listen_after_bind(); });
  // Stop() only stops a server that is running: wait for the loop to start, so a Stop right after
  // Start cannot miss it and hang in join().
  for (int i = 0; i < 5000 && !impl_->server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  impl_->server.stop();
  thread_.join();
}

}  // namespace minions
