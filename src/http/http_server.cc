#include "http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/time.h>

#include <atomic>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/host_port.h"
#include "common/logging.h"

namespace minions {
namespace {

constexpr char kPlain[] = "text/plain; charset=utf-8";

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

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::map<std::string, std::string> ParseUrlEncoded(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view pair : absl::StrSplit(text, '&', absl::SkipEmpty())) {
    auto eq = pair.find('=');
    std::string key = UrlDecode(std::string(pair.substr(0, eq)));
    std::string value = eq == absl::string_view::npos ? "" : UrlDecode(std::string(pair.substr(eq + 1)));
    out.emplace(std::move(key), std::move(value));
  }
  return out;
}

std::string PeerAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

std::string UrlDecode(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 && HexValue(text[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string HttpRequest::Cookie(const std::string& name) const {
  for (absl::string_view part : absl::StrSplit(Header("cookie"), ';')) {
    part = absl::StripAsciiWhitespace(part);
    auto eq = part.find('=');
    if (eq != absl::string_view::npos && part.substr(0, eq) == name) return std::string(part.substr(eq + 1));
  }
  return "";
}

std::map<std::string, std::string> HttpRequest::Form() const { return ParseUrlEncoded(body); }

absl::Status HttpStream::Respond(const HttpResponse& response) {
  if (auto s = WriteHead(response.status, response.content_type, static_cast<int64_t>(response.body.size()),
                         response.headers);
      !s.ok()) {
    return s;
  }
  return Write(response.body);
}

namespace {

// The status line and headers of a response (`content_length` < 0: chunked).
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
  absl::StrAppend(&out, "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n");
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

// A detached connection serving one request of a streamed route, on the handler's thread, with
// blocking I/O bounded by per-operation timeouts. Owns the socket (and its TLS) until destroyed.
class StreamConn final : public HttpStream {
 public:
  StreamConn(int fd, SSL* ssl, std::string buffered, const HttpRequest& request, absl::Duration read_timeout,
             absl::Duration write_timeout)
      : fd_(fd), ssl_(ssl), in_(std::move(buffered)), head_only_(request.method == "HEAD") {
    int flags = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    SetTimeout(SO_RCVTIMEO, read_timeout);
    SetTimeout(SO_SNDTIMEO, write_timeout);
    chunked_ = absl::AsciiStrToLower(request.Header("transfer-encoding")).find("chunked") != std::string::npos;
    if (!chunked_) {
      int64_t length = 0;
      if (absl::SimpleAtoi(request.Header("content-length"), &length) && length > 0) remaining_ = length;
    }
    body_done_ = !chunked_ && remaining_ == 0;
    expect_continue_ = absl::EqualsIgnoreCase(request.Header("expect"), "100-continue");
  }
  ~StreamConn() override {
    if (ssl_) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
    close(fd_);
  }

  absl::StatusOr<size_t> ReadBody(char* buffer, size_t size) override {
    if (body_done_ || size == 0) return 0;
    if (expect_continue_) {
      expect_continue_ = false;
      if (!head_written_) {
        if (auto s = WriteAll("HTTP/1.1 100 Continue\r\n\r\n"); !s.ok()) return s;
      }
    }
    if (!chunked_) {
      if (auto s = Fill(); !s.ok()) return s;
      size_t n = std::min({size, in_.size() - in_pos_, static_cast<size_t>(remaining_)});
      memcpy(buffer, in_.data() + in_pos_, n);
      in_pos_ += n;
      remaining_ -= static_cast<int64_t>(n);
      body_done_ = remaining_ == 0;
      return n;
    }
    if (chunk_left_ == 0) {
      if (need_crlf_) {
        auto line = ReadLine();
        if (!line.ok()) return line.status();
        if (!line->empty()) return absl::InvalidArgumentError("malformed chunked body: a chunk overran its size");
        need_crlf_ = false;
      }
      auto line = ReadLine();
      if (!line.ok()) return line.status();
      std::string hex(absl::StripAsciiWhitespace(line->substr(0, line->find(';'))));
      uint64_t chunk = 0;
      if (hex.empty() || hex.size() > 15 || !absl::SimpleHexAtoi(hex, &chunk)) {
        return absl::InvalidArgumentError("malformed chunked body: a bad chunk size");
      }
      if (chunk == 0) {
        while (true) {  // trailers, up to the empty line
          auto trailer = ReadLine();
          if (!trailer.ok()) return trailer.status();
          if (trailer->empty()) break;
        }
        body_done_ = true;
        return 0;
      }
      chunk_left_ = static_cast<int64_t>(chunk);
      need_crlf_ = true;
    }
    if (auto s = Fill(); !s.ok()) return s;
    size_t n = std::min({size, in_.size() - in_pos_, static_cast<size_t>(chunk_left_)});
    memcpy(buffer, in_.data() + in_pos_, n);
    in_pos_ += n;
    chunk_left_ -= static_cast<int64_t>(n);
    return n;
  }

  absl::Status WriteHead(int status, const std::string& content_type, int64_t content_length,
                         const std::map<std::string, std::string>& headers) override {
    if (head_written_) return absl::FailedPreconditionError("the response head was written already");
    head_written_ = true;
    response_chunked_ = content_length < 0 && !head_only_;
    return WriteAll(ResponseHead(status, content_type, head_only_ ? std::max<int64_t>(content_length, 0) : content_length,
                                 false, headers));
  }

  absl::Status Write(std::string_view data) override {
    if (!head_written_) return absl::FailedPreconditionError("write the response head first");
    if (head_only_ || data.empty()) return absl::OkStatus();
    if (!response_chunked_) return WriteAll(data);
    if (auto s = WriteAll(absl::StrCat(absl::Hex(data.size()), "\r\n")); !s.ok()) return s;
    if (auto s = WriteAll(data); !s.ok()) return s;
    return WriteAll("\r\n");
  }

  absl::Status Finish() override {
    if (!response_chunked_ || finished_) return absl::OkStatus();
    finished_ = true;
    return WriteAll("0\r\n\r\n");
  }

  bool head_written() const override { return head_written_; }

  // After the response: reads (and drops) what is left of a body the handler did not want, for a
  // little while (2 s, 16 MiB at most, so a client dripping bytes cannot hold the thread), so that
  // closing does not reset the connection before the client has read the answer.
  void Linger() {
    // (A client still waiting for "100 Continue" sends no body: there is nothing to drain.)
    if (body_done_ || broken_ || expect_continue_) return;
    SetTimeout(SO_RCVTIMEO, absl::Milliseconds(500));
    const absl::Time until = absl::Now() + absl::Seconds(2);
    char drop[16384];
    for (size_t dropped = 0; dropped < (16u << 20) && absl::Now() < until;) {
      auto n = RawRead(drop, sizeof(drop));
      if (!n.ok() || *n == 0) break;
      dropped += *n;
    }
  }

 private:
  void SetTimeout(int option, absl::Duration timeout) {
    timeval tv = absl::ToTimeval(std::max(timeout, absl::Milliseconds(1)));
    setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv));
  }

  // Bytes from the socket: > 0, or 0 at the client's end of stream.
  absl::StatusOr<size_t> RawRead(char* buffer, size_t size) {
    while (true) {
      if (ssl_) {
        int n = SSL_read(ssl_, buffer, static_cast<int>(std::min<size_t>(size, INT32_MAX)));
        if (n > 0) return static_cast<size_t>(n);
        int error = SSL_get_error(ssl_, n);
        ERR_clear_error();
        if (error == SSL_ERROR_ZERO_RETURN) return 0;
        broken_ = true;
        return absl::DeadlineExceededError("the client stopped sending (or the TLS session broke)");
      }
      ssize_t n = recv(fd_, buffer, size, 0);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      broken_ = true;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::DeadlineExceededError("the client stopped sending");
      return absl::UnavailableError("the client's connection broke");
    }
  }

  // Makes sure unread input is buffered; an error at the end of stream (the body is not whole).
  absl::Status Fill() {
    if (in_pos_ < in_.size()) return absl::OkStatus();
    in_.resize(64 << 10);
    in_pos_ = 0;
    auto n = RawRead(in_.data(), in_.size());
    if (!n.ok()) {
      in_.clear();
      return n.status();
    }
    in_.resize(*n);
    if (*n == 0) {
      broken_ = true;
      return absl::DataLossError("the client closed the connection before the body ended");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadLine() {
    std::string line;
    while (true) {
      if (auto s = Fill(); !s.ok()) return s;
      size_t eol = in_.find('\n', in_pos_);
      size_t end = eol == std::string::npos ? in_.size() : eol;
      line.append(in_, in_pos_, end - in_pos_);
      in_pos_ = eol == std::string::npos ? in_.size() : eol + 1;
      if (line.size() > 4096) return absl::InvalidArgumentError("malformed chunked body: a line too long");
      if (eol != std::string::npos) break;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }

  absl::Status WriteAll(std::string_view data) {
    while (!data.empty()) {
      if (ssl_) {
        int n = SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 20)));
        if (n <= 0) {
          ERR_clear_error();
          broken_ = true;
          return absl::UnavailableError("the client stopped reading the response");
        }
        data.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        broken_ = true;
        return absl::UnavailableError("the client stopped reading the response");
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  int fd_;
  SSL* ssl_;
  std::string in_;  // read from the socket, not yet consumed from in_pos_
  size_t in_pos_ = 0;
  const bool head_only_;
  bool chunked_ = false;
  int64_t remaining_ = 0;   // Content-Length bytes not yet read
  int64_t chunk_left_ = 0;  // of the current chunk
  bool need_crlf_ = false;  // a chunk's data ended; its CRLF is next
  bool body_done_ = false;
  bool expect_continue_ = false;
  bool head_written_ = false;
  bool response_chunked_ = false;
  bool finished_ = false;
  bool broken_ = false;
};

}  // namespace

struct HttpServer::Impl {
  // A connection, owned by the I/O thread.
  struct Conn {
    enum class Phase { kHandshake, kReading, kHandling, kWriting };
    int fd = -1;
    SSL* ssl = nullptr;
    std::string peer;
    Phase phase = Phase::kReading;
    std::string in;
    std::string out;
    size_t out_sent = 0;
    absl::Time deadline;
    bool started = false;      // the current request's first byte has arrived
    bool keep_alive = true;    // after the response is written
    bool want_read = true;     // what the socket (or TLS) waits for
    bool want_write = false;
    bool peer_closed = false;  // the client will send nothing more
  };
  struct Job {
    uint64_t conn;
    HttpRequest request;
  };
  struct Done {
    uint64_t conn;
    std::string bytes;
    bool keep_alive;
  };

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  HttpServerOptions options;
  std::map<std::string, HttpHandler> get_routes;
  std::map<std::string, HttpHandler> post_routes;
  std::map<std::string, HttpStreamHandler> stream_routes;  // by path prefix
  int listen_fd = -1;
  int wake_read = -1, wake_write = -1;
  SSL_CTX* ssl_ctx = nullptr;
  std::atomic<bool> stopping{false};
  std::thread io_thread;
  std::vector<std::thread> workers;

  absl::Mutex mu;
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  std::deque<Done> done ABSL_GUARDED_BY(mu);
  bool workers_stop ABSL_GUARDED_BY(mu) = false;

  // Streamed requests in flight (their threads are detached; Stop waits for the count to drop).
  absl::Mutex streams_mu;
  size_t active_streams ABSL_GUARDED_BY(streams_mu) = 0;
  std::set<int> stream_fds ABSL_GUARDED_BY(streams_mu);

  // The I/O thread's own.
  std::map<uint64_t, Conn> conns;
  std::map<std::string, size_t> per_peer;
  uint64_t next_id = 1;

  void Wake() {
    char byte = 1;
    (void)!write(wake_write, &byte, 1);
  }

  // --- workers ---

  void WorkerLoop() {
    while (true) {
      Job job;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->mu) {
              return impl->workers_stop || !impl->jobs.empty();
            },
            this));
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      bool keep_alive = KeepAlive(job.request);
      std::string bytes = Respond(job.request, keep_alive);
      {
        absl::MutexLock lock(&mu);
        done.push_back({job.conn, std::move(bytes), keep_alive});
      }
      Wake();
    }
  }

  static bool KeepAlive(const HttpRequest& request) {
    std::string connection = absl::AsciiStrToLower(request.Header("connection"));
    if (request.Header(":version") == "HTTP/1.0") return connection == "keep-alive";
    return connection != "close";
  }

  std::string Respond(const HttpRequest& request, bool keep_alive) {
    HttpResponse response;
    const bool head = request.method == "HEAD";
    const auto& routes = request.method == "POST" ? post_routes : get_routes;
    auto it = routes.find(request.path);
    if (it == routes.end()) {
      bool other_method = (request.method == "POST" ? get_routes : post_routes).count(request.path) > 0;
      response = other_method ? HttpResponse{405, kPlain, absl::StrCat(request.method, " is not allowed here\n"), {}}
                              : HttpResponse{404, kPlain, absl::StrCat("no page at ", request.path, "\n"), {}};
    } else {
      try {
        response = it->second(request);
      } catch (const std::exception& e) {
        response = {500, kPlain, "internal error\n", {}};
        MINIONS_LOG(Warning) << "HTTP handler for " << request.path << " failed: " << e.what();
      }
    }
    return Serialize(response, head, keep_alive);
  }

  static std::string Serialize(const HttpResponse& response, bool head, bool keep_alive) {
    std::string out = ResponseHead(response.status, response.content_type, static_cast<int64_t>(response.body.size()),
                                   keep_alive, response.headers);
    if (!head) out += response.body;
    return out;
  }

  // --- streamed routes ---

  // The streamed route serving `path` (null: none).
  const HttpStreamHandler* StreamRoute(const std::string& method, const std::string& path) const {
    if ((method == "GET" || method == "HEAD") && get_routes.count(path)) return nullptr;
    if (method == "POST" && post_routes.count(path)) return nullptr;
    for (const auto& [prefix, handler] : stream_routes) {
      if (absl::StartsWith(path, prefix)) return &handler;
    }
    return nullptr;
  }

  // Runs on a thread of its own; owns `conn`.
  void ServeStream(std::unique_ptr<StreamConn> conn, HttpRequest request, const HttpStreamHandler* handler,
                   int fd) {
    try {
      (*handler)(request, *conn);
    } catch (const std::exception& e) {
      MINIONS_LOG(Warning) << "HTTP handler for " << request.path << " failed: " << e.what();
    }
    if (!conn->head_written()) (void)conn->Respond(HttpResponse{500, kPlain, "internal error\n", {}});
    (void)conn->Finish();
    conn->Linger();
    {
      absl::MutexLock lock(&streams_mu);
      stream_fds.erase(fd);
    }
    conn.reset();
    absl::MutexLock lock(&streams_mu);
    --active_streams;
  }

  // --- the I/O thread ---

  void Close(uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    Conn& c = it->second;
    if (c.ssl) {
      SSL_shutdown(c.ssl);  // best effort; never waits
      SSL_free(c.ssl);
    }
    close(c.fd);
    if (auto p = per_peer.find(c.peer); p != per_peer.end() && --p->second == 0) per_peer.erase(p);
    conns.erase(it);
  }

  // Bytes read (> 0), 0 when the socket has nothing now, -1 when the connection is over.
  ssize_t ReadSome(Conn& c, char* buffer, size_t size) {
    if (!c.ssl) {
      ssize_t n = recv(c.fd, buffer, size, 0);
      if (n > 0) return n;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        c.want_read = true;
        return 0;
      }
      return -1;
    }
    int n = SSL_read(c.ssl, buffer, static_cast<int>(size));
    if (n > 0) return n;
    int error = SSL_get_error(c.ssl, n);
    if (error == SSL_ERROR_WANT_READ) {
      c.want_read = true;
      return 0;
    }
    if (error == SSL_ERROR_WANT_WRITE) {
      c.want_write = true;
      return 0;
    }
    ERR_clear_error();
    return -1;
  }

  ssize_t WriteSome(Conn& c, const char* data, size_t size) {
    if (!c.ssl) {
      ssize_t n = send(c.fd, data, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        c.want_write = true;
        return 0;
      }
      return -1;
    }
    int n = SSL_write(c.ssl, data, static_cast<int>(size));
    if (n > 0) return n;
    int error = SSL_get_error(c.ssl, n);
    if (error == SSL_ERROR_WANT_WRITE) {
      c.want_write = true;
      return 0;
    }
    if (error == SSL_ERROR_WANT_READ) {
      c.want_read = true;
      return 0;
    }
    ERR_clear_error();
    return -1;
  }

  void Accept(absl::Time now) {
    while (conns.size() < options.max_connections) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string peer = PeerAddress(addr);
      size_t& from_peer = per_peer[peer];
      if (from_peer >= options.max_connections_per_peer) {
        close(fd);  // one address may not hold the whole server
        continue;
      }
      ++from_peer;
      int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
      Conn c;
      c.fd = fd;
      c.peer = peer;
      c.deadline = now + options.request_timeout;
      if (ssl_ctx) {
        c.ssl = SSL_new(ssl_ctx);
        SSL_set_fd(c.ssl, fd);
        SSL_set_accept_state(c.ssl);
        c.phase = Conn::Phase::kHandshake;
      }
      conns.emplace(next_id++, std::move(c));
    }
  }

  // Advances a connection as far as its socket allows; false when it is over.
  bool Progress(uint64_t id, Conn& c, absl::Time now) {
    c.want_read = c.want_write = false;
    if (c.phase == Conn::Phase::kHandshake) {
      int r = SSL_do_handshake(c.ssl);
      if (r != 1) {
        int error = SSL_get_error(c.ssl, r);
        if (error == SSL_ERROR_WANT_READ) {
          c.want_read = true;
          return true;
        }
        if (error == SSL_ERROR_WANT_WRITE) {
          c.want_write = true;
          return true;
        }
        ERR_clear_error();
        return false;  // plain text to a TLS port, a client that distrusts us, garbage
      }
      c.phase = Conn::Phase::kReading;
    }
    if (c.phase == Conn::Phase::kReading) {
      char buffer[16384];
      while (true) {
        ssize_t n = ReadSome(c, buffer, sizeof(buffer));
        if (n < 0) {
          c.peer_closed = true;  // a request it finished sending is still answered
          break;
        }
        if (n == 0) break;
        if (!c.started) {
          c.started = true;
          c.deadline = std::min(c.deadline, now + options.request_timeout);
        }
        c.in.append(buffer, static_cast<size_t>(n));
        if (c.in.size() > options.max_header_bytes + options.max_body_bytes + 4) break;
      }
      if (!TryParse(id, c, now)) return false;
      return !(c.peer_closed && c.phase == Conn::Phase::kReading);
    }
    if (c.phase == Conn::Phase::kWriting) {
      while (c.out_sent < c.out.size()) {
        ssize_t n = WriteSome(c, c.out.data() + c.out_sent, c.out.size() - c.out_sent);
        if (n < 0) return false;
        if (n == 0) return true;
        c.out_sent += static_cast<size_t>(n);
      }
      if (!c.keep_alive) return false;
      c.out.clear();
      c.out_sent = 0;
      c.phase = Conn::Phase::kReading;
      c.started = !c.in.empty();
      c.deadline = now + (c.started ? options.request_timeout : options.idle_timeout);
      return TryParse(id, c, now);  // a pipelined request may be waiting already
    }
    return true;  // handling: nothing to do until the worker answers
  }

  // Refuses the request with `status` and closes the connection after the answer.
  bool Refuse(Conn& c, int status, const std::string& message, absl::Time now) {
    c.out = Serialize(HttpResponse{status, kPlain, message + "\n", {}}, false, false);
    c.out_sent = 0;
    c.keep_alive = false;
    c.phase = Conn::Phase::kWriting;
    c.deadline = now + options.write_timeout;
    return true;
  }

  // When `c.in` holds a whole request, hands it to a worker.
  bool TryParse(uint64_t id, Conn& c, absl::Time now) {
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c.in.size() > options.max_header_bytes) return Refuse(c, 431, "request headers too large", now);
      return true;
    }
    if (end > options.max_header_bytes) return Refuse(c, 431, "request headers too large", now);
    HttpRequest request;
    request.peer = c.peer;
    request.tls = c.ssl != nullptr;
    std::vector<std::string> lines = absl::StrSplit(c.in.substr(0, end), "\r\n");
    std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
    if (first.size() != 3 || first[1].empty() || first[1][0] != '/' ||
        (first[2] != "HTTP/1.1" && first[2] != "HTTP/1.0")) {
      return Refuse(c, 400, "malformed request line", now);
    }
    request.method = first[0];
    if (request.method != "GET" && request.method != "HEAD" && request.method != "POST" && request.method != "DELETE") {
      return Refuse(c, 405, "only GET, HEAD, POST and DELETE are served", now);
    }
    request.headers[":version"] = first[2];
    for (size_t i = 1; i < lines.size(); ++i) {
      auto colon = lines[i].find(':');
      if (colon == std::string::npos || colon == 0 || lines[i][0] == ' ' || lines[i][0] == '\t') {
        return Refuse(c, 400, "malformed header line", now);
      }
      std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
      std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
      auto [it, fresh] = request.headers.emplace(name, value);
      if (!fresh) it->second += (name == "cookie" ? "; " : ", ") + value;
    }
    std::string target = first[1];
    auto question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = ParseUrlEncoded(target.substr(question + 1));
    if (const HttpStreamHandler* handler = StreamRoute(request.method, request.path)) {
      return Detach(id, c, std::move(request), c.in.substr(end + 4), handler, now);
    }
    if (request.method == "DELETE") return Refuse(c, 405, "DELETE is not allowed here", now);
    if (!request.Header("transfer-encoding").empty()) {
      return Refuse(c, 501, "chunked request bodies are not accepted; send Content-Length", now);
    }
    size_t length = 0;
    if (std::string cl = request.Header("content-length"); !cl.empty()) {
      if (!absl::SimpleAtoi(cl, &length)) return Refuse(c, 400, "bad Content-Length", now);
      if (length > options.max_body_bytes) return Refuse(c, 413, "request body too large", now);
    }
    if (c.in.size() < end + 4 + length) return true;  // the body is still coming
    request.body = c.in.substr(end + 4, length);
    c.in.erase(0, end + 4 + length);
    c.phase = Conn::Phase::kHandling;
    {
      absl::MutexLock lock(&mu);
      jobs.push_back({id, std::move(request)});
    }
    return true;
  }

  // Hands the connection of a streamed request to a thread of its own (it leaves the I/O loop).
  bool Detach(uint64_t id, Conn& c, HttpRequest request, std::string buffered, const HttpStreamHandler* handler,
              absl::Time now) {
    if (request.headers.count("content-length") && request.headers.count("transfer-encoding")) {
      return Refuse(c, 400, "a request may not have both Content-Length and Transfer-Encoding", now);
    }
    int64_t length = 0;
    if (std::string cl = request.Header("content-length"); !cl.empty() && (!absl::SimpleAtoi(cl, &length) || length < 0)) {
      return Refuse(c, 400, "bad Content-Length", now);
    }
    if (std::string te = absl::AsciiStrToLower(request.Header("transfer-encoding")); !te.empty() && te != "chunked") {
      return Refuse(c, 501, "only the chunked transfer coding is accepted", now);
    }
    {
      absl::MutexLock lock(&streams_mu);
      if (active_streams >= options.max_streams) {
        return Refuse(c, 503, "too many uploads and downloads at once; try again shortly", now);
      }
      ++active_streams;
      stream_fds.insert(c.fd);
    }
    const int fd = c.fd;
    auto conn = std::make_unique<StreamConn>(fd, c.ssl, std::move(buffered), request, options.request_timeout,
                                             options.write_timeout);
    // The connection is the stream's now: forget it without closing it.
    if (auto p = per_peer.find(c.peer); p != per_peer.end() && --p->second == 0) per_peer.erase(p);
    conns.erase(id);
    std::thread([this, conn = std::move(conn), request = std::move(request), handler, fd]() mutable {
      ServeStream(std::move(conn), std::move(request), handler, fd);
    }).detach();
    return false;  // the caller must not touch `c` (nor close it): see Progress
  }

  void TakeAnswers(absl::Time now) {
    char drain[256];
    while (read(wake_read, drain, sizeof(drain)) > 0) {
    }
    std::deque<Done> answers;
    {
      absl::MutexLock lock(&mu);
      answers.swap(done);
    }
    for (Done& answer : answers) {
      auto it = conns.find(answer.conn);
      if (it == conns.end() || it->second.phase != Conn::Phase::kHandling) continue;  // gone meanwhile
      Conn& c = it->second;
      c.out = std::move(answer.bytes);
      c.out_sent = 0;
      c.keep_alive = answer.keep_alive && !c.peer_closed;
      c.phase = Conn::Phase::kWriting;
      c.deadline = now + options.write_timeout;
      if (!Progress(answer.conn, c, now)) Close(answer.conn);
    }
  }

  void IoLoop() {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    while (!stopping.load()) {
      absl::Time now = absl::Now();
      fds.clear();
      ids.clear();
      fds.push_back({wake_read, POLLIN, 0});
      fds.push_back({listen_fd, static_cast<short>(conns.size() < options.max_connections ? POLLIN : 0), 0});
      absl::Time next = now + absl::Seconds(1);
      for (auto& [id, c] : conns) {
        short events = 0;
        if (c.phase != Conn::Phase::kHandling) {
          if (c.want_read || (!c.want_write && c.phase != Conn::Phase::kWriting)) events |= POLLIN;
          if (c.want_write || c.phase == Conn::Phase::kWriting) events |= POLLOUT;
          next = std::min(next, c.deadline);
        }
        // A connection whose request is being handled is not polled (a hang-up would be reported
        // on every pass); its answer finds out.
        fds.push_back({c.phase == Conn::Phase::kHandling ? -1 : c.fd, events, 0});
        ids.push_back(id);
      }
      int timeout_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next - now) + 1));
      int ready = poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) break;
      now = absl::Now();
      if (fds[0].revents & POLLIN) TakeAnswers(now);
      if (fds[1].revents & POLLIN) Accept(now);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        short revents = fds[i + 2].revents;
        if (c.phase == Conn::Phase::kHandling) continue;
        if (revents != 0 && !Progress(ids[i], c, now)) {
          Close(ids[i]);
          continue;
        }
        // Too slow: a request that has not arrived, or a response not taken, in time.
        if (c.phase != Conn::Phase::kHandling && now >= c.deadline) Close(ids[i]);
      }
    }
    std::vector<uint64_t> all;
    for (const auto& [id, c] : conns) all.push_back(id);
    for (uint64_t id : all) Close(id);
  }
};

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::HttpServer(int threads) : HttpServer([threads] {
  HttpServerOptions options;
  options.threads = threads;
  return options;
}()) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, HttpHandler handler) { impl_->get_routes[path] = std::move(handler); }

void HttpServer::HandlePost(const std::string& path, HttpHandler handler) {
  impl_->post_routes[path] = std::move(handler);
}

void HttpServer::HandleStream(const std::string& prefix, HttpStreamHandler handler) {
  impl_->stream_routes[prefix] = std::move(handler);
}

absl::Status HttpServer::Start(const std::string& listen) {
  std::string host;
  int port = 0;
  if (auto s = SplitHostPort(listen, &host, &port); !s.ok()) return s;
  const HttpServerOptions& options = impl_->options;
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (!tls && !IsLoopbackHost(host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve HTTP in plain text on ", listen,
        ", which other machines can reach: give the server a TLS certificate (--tls-cert, --tls-key) or listen on "
        "127.0.0.1"));
  }
  if (tls) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) return absl::InternalError("openssl: cannot make a TLS context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, options.tls_cert_file.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, options.tls_key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      ERR_clear_error();
      SSL_CTX_free(ctx);
      return absl::InvalidArgumentError(absl::StrCat("the TLS certificate ", options.tls_cert_file, " and key ",
                                                     options.tls_key_file, " cannot be used together"));
    }
    impl_->ssl_ctx = ctx;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve the HTTP address ", listen));
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  // SO_REUSEADDR only: SO_REUSEPORT would let a second server bind the same port silently.
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  bool bound = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 256) == 0;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", listen, " (is another process there?)"));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int wake[2];
  if (pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(fd);
    return absl::InternalError("cannot make a pipe");
  }
  // A client that hangs up mid-write must not kill the process (TLS writes go through write(2)).
  signal(SIGPIPE, SIG_IGN);
  impl_->listen_fd = fd;
  impl_->wake_read = wake[0];
  impl_->wake_write = wake[1];
  for (int i = 0; i < std::max(1, options.threads); ++i) impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
  impl_->io_thread = std::thread([this] { impl_->IoLoop(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (!impl_->io_thread.joinable()) return;
  impl_->stopping = true;
  impl_->Wake();
  impl_->io_thread.join();
  {
    // Streamed requests: their sockets are shut so that blocked reads and writes end at once.
    absl::MutexLock lock(&impl_->streams_mu);
    for (int fd : impl_->stream_fds) shutdown(fd, SHUT_RDWR);
    impl_->streams_mu.Await(absl::Condition(
        +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->streams_mu) { return impl->active_streams == 0; },
        impl_.get()));
  }
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->workers_stop = true;
    impl_->jobs.clear();
  }
  for (auto& worker : impl_->workers) worker.join();
  impl_->workers.clear();
  close(impl_->listen_fd);
  close(impl_->wake_read);
  close(impl_->wake_write);
  if (impl_->ssl_ctx) SSL_CTX_free(impl_->ssl_ctx);
  impl_->ssl_ctx = nullptr;
}

}  // namespace minions
