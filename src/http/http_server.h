#pragma once
// HttpServer: a small HTTP/1.1 server for the observability endpoints and the web dashboard
// (/metrics, /healthz, /readyz, the dashboard, its JSON and its login). GET, HEAD and POST (small
// forms); exact paths; query parameters and urlencoded forms decoded. Not for bulk data: the gRPC
// port carries the API.
//
// Built for a hostile network:
//   - One I/O thread multiplexes every connection (poll); handlers run on a small pool of worker
//     threads and never touch a socket. A slow or silent client therefore holds a connection, not
//     a thread: it cannot starve /readyz (six slow clients used to make it time out).
//   - A request must arrive whole within `request_timeout` of its first byte (or of the
//     connection), headers and body within their byte limits; a response must be taken within
//     `write_timeout`; an idle keep-alive connection is closed after `idle_timeout`.
//   - At most `max_connections` connections, and `max_connections_per_peer` from one address;
//     beyond that a new connection is closed at once.
//   - TLS (a certificate and key) on the same terms: the handshake is part of the request's time.
//     Without TLS, Start refuses any address but loopback.
//   - Every response says nosniff, no framing, no referrer; HTML gets a same-origin CSP.
//
//   - Streamed routes (HandleStream: bulk uploads and downloads, any method under a path prefix)
//     are handed, once their headers have arrived, to a thread of their own that reads the body
//     and writes the response as they go (HttpStream), so no request or response is ever held
//     whole. Each read and write must progress within `request_timeout`/`write_timeout`, and a
//     client must move at least `min_transfer_rate` bytes/s on average once it has kept the
//     stream waiting for `request_timeout` in all (a client dripping a byte every few seconds is
//     dropped). At most `max_streams` run at once (beyond that a request gets 503), at most
//     `max_streams_per_peer` from one address and `max_streams_per_principal` for one caller
//     (beyond those, 429), so that one client cannot take every slot; the connection closes
//     after the response, and its slot is given back as soon as the handler returns.
//   - A streamed route may have an admission (HttpAdmitter), run on a worker thread once the
//     headers are in and before any slot is taken: it checks the credential and refuses (the
//     refusal is written by the I/O thread: a refused request holds no slot and no thread), or
//     says the request is small (its body, up to a limit, is read like any other and the handler
//     runs on a worker thread against a buffered HttpStream: no slot), or a stream of a caller.
//   - Health probes (`health_paths`, /healthz and /readyz) are served by a worker of their own,
//     so that busy handlers never delay them, and, with `health_listen`, on a second listener of
//     their own that serves nothing else, so that no number of clients on the main port starves
//     them.
//
// Ownership: owns its listening socket, its connections and its threads.
// Threads: Handle*/Start/Stop from the owning thread (Handle before Start); handlers run on the
// worker threads (streamed ones on their own threads), several at once, and must be thread-safe.

#include <any>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions {

struct HttpRequest {
  std::string method;  // GET, HEAD or POST (and DELETE on streamed routes)
  std::string path;
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // POST only (streamed routes: read from the HttpStream)
  std::string peer;                            // the client's address
  bool tls = false;                            // it came over TLS
  std::any admitted;                           // streamed routes: what the route's admission found

  std::string Param(const std::string& name) const {
    auto it = query.find(name);
    return it == query.end() ? "" : it->second;
  }
  std::string Header(const std::string& lower_case_name) const {
    auto it = headers.find(lower_case_name);
    return it == headers.end() ? "" : it->second;
  }
  // A cookie's value ("" when absent).
  std::string Cookie(const std::string& name) const;
  // The fields of an application/x-www-form-urlencoded body.
  std::map<std::string, std::string> Form() const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::map<std::string, std::string> headers;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// The connection of a request on a streamed route, as its handler sees it: the request body to
// read (Content-Length or chunked, decoded; "Expect: 100-continue" answered on the first read)
// and the response to write. One thread (the handler's) uses it.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // Up to `size` bytes of the request body; 0 at its end. An error when the client stalls past
  // the read timeout, hangs up, or sends malformed chunked framing.
  virtual absl::StatusOr<size_t> ReadBody(char* buffer, size_t size) = 0;
  // Sends the status line and headers; `content_length` < 0 sends the body chunked. Once only.
  virtual absl::Status WriteHead(int status, const std::string& content_type, int64_t content_length,
                                 const std::map<std::string, std::string>& headers = {}) = 0;
  // Body bytes after WriteHead (nothing for HEAD).
  virtual absl::Status Write(std::string_view data) = 0;
  // Ends a chunked body. (Called for the handler when it returns without calling it.)
  virtual absl::Status Finish() = 0;
  // Whether WriteHead was called.
  virtual bool head_written() const = 0;
  // A whole small response (HttpResponse), when nothing was written yet.
  absl::Status Respond(const HttpResponse& response);
};
using HttpStreamHandler = std::function<void(const HttpRequest&, HttpStream&)>;

// How a request on a streamed route is taken, decided from its headers (HttpServer's comment).
struct HttpAdmission {
  enum class Kind {
    kRefuse,  // answer `refusal` without reading the body
    kSmall,   // read the body (up to max_body_bytes) and run the handler on a worker, no slot
    kStream,  // a stream of its own (a slot counted against `principal`)
  };
  Kind kind = Kind::kStream;
  HttpResponse refusal;
  std::string principal;      // whose slot ("" counts only against the total and the peer)
  size_t max_body_bytes = 0;  // kSmall: larger bodies get 413
  std::any admitted;          // handed to the handler as HttpRequest::admitted
};
using HttpAdmitter = std::function<HttpAdmission(const HttpRequest&)>;

struct HttpServerOptions {
  int threads = 4;  // handler threads
  absl::Duration request_timeout = absl::Seconds(10);
  absl::Duration write_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(30);
  size_t max_connections = 512;
  size_t max_connections_per_peer = 32;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 16 << 10;
  // Streamed routes running at once (each holds a thread while it runs), of them from one
  // address, and for one principal (an admission's).
  size_t max_streams = 32;
  size_t max_streams_per_peer = 8;
  size_t max_streams_per_principal = 8;
  // The slowest average a stream's client may keep up (bytes/s, reading and writing together),
  // judged once it has kept the stream waiting `request_timeout` in all. 0: no floor.
  int64_t min_transfer_rate = 1024;
  // Paths answered by the health worker ("/healthz", "/readyz"), and where else to serve them
  // alone ("" nowhere else). A health listener holds at most `max_health_connections`.
  std::set<std::string> health_paths = {"/healthz", "/readyz"};
  std::string health_listen;
  size_t max_health_connections = 64;
  // TLS: PEM files of the certificate (then its chain) and key. Both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options = {});
  explicit HttpServer(int threads);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // GET (and HEAD) of `path`.
  void Handle(const std::string& path, HttpHandler handler);
  // POST to `path`.
  void HandlePost(const std::string& path, HttpHandler handler);
  // Every method (GET, HEAD, POST, DELETE) on every path that starts with `prefix`, streamed (see
  // the class comment). Exact routes are matched first.
  // `admit` (optional) decides how each request is taken before any slot is (see above).
  void HandleStream(const std::string& prefix, HttpStreamHandler handler, HttpAdmitter admit = nullptr);
  // Binds `listen` ("host:port"; port 0 picks a free one) and serves on background threads.
  // FailedPrecondition for plain text off loopback; Unavailable when the port is taken.
  absl::Status Start(const std::string& listen);
  int port() const { return port_; }
  // The health listener's port (0: none).
  int health_port() const { return health_port_; }
  // Streamed requests holding a slot now.
  size_t streams_open() const;
  // Stops accepting, closes every connection, lets handlers in flight finish, joins the threads.
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  int health_port_ = 0;
};

// "%41" -> "A", "+" -> " ".
std::string UrlDecode(const std::string& text);

}  // namespace minions
