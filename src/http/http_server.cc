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
#include <optional>
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
#include "http/http_stream_conn.h"

namespace minions {
namespace {

constexpr char kPlain[] = "text/plain; charset=utf-8";

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

using http_internal::BufferedStream;
using http_internal::ResponseHead;
using http_internal::StreamConn;

struct HttpServer::Impl {
  // A connection, owned by the I/O thread.
  struct Conn {
    // kDraining: a refusal was sent before the body was read; what the client still sends is
    // dropped for a little while, so that closing does not reset the connection before the
    // client has read the answer.
    enum class Phase { kHandshake, kReading, kHandling, kWriting, kDraining };
    int fd = -1;
    SSL* ssl = nullptr;
    std::string peer;
    bool health_only = false;  // came to the health listener: health paths only
    bool drain = false;        // after the response, drain (see kDraining)
    size_t drained = 0;
    bool continue_sent = false;
    // A streamed route's admission of the request being read (none yet: not asked, or no route).
    std::optional<HttpAdmission> admission;
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
  struct StreamRoute {
    HttpStreamHandler handler;
    HttpAdmitter admit;  // may be empty
  };
  struct Job {
    enum class Kind { kPlain, kAdmit, kSmall };
    uint64_t conn;
    HttpRequest request;
    Kind kind = Kind::kPlain;
    const StreamRoute* route = nullptr;  // kAdmit, kSmall
  };
  struct Done {
    uint64_t conn;
    std::string bytes;
    bool keep_alive;
    std::optional<HttpAdmission> admission;  // the answer of a kAdmit job
  };

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  HttpServerOptions options;
  std::map<std::string, HttpHandler> get_routes;
  std::map<std::string, HttpHandler> post_routes;
  std::map<std::string, StreamRoute> stream_routes;  // by path prefix
  int listen_fd = -1;
  int health_fd = -1;
  int wake_read = -1, wake_write = -1;
  SSL_CTX* ssl_ctx = nullptr;
  std::atomic<bool> stopping{false};
  std::thread io_thread;
  std::vector<std::thread> workers;

  absl::Mutex mu;
  std::deque<Job> jobs ABSL_GUARDED_BY(mu);
  std::deque<Job> health_jobs ABSL_GUARDED_BY(mu);  // the health worker's
  std::deque<Done> done ABSL_GUARDED_BY(mu);
  bool workers_stop ABSL_GUARDED_BY(mu) = false;

  // Streamed requests: the slots held (by address and principal too), and the threads alive
  // (detached: Stop waits for them; a thread gives its slot back before it lingers).
  absl::Mutex streams_mu;
  size_t active_streams ABSL_GUARDED_BY(streams_mu) = 0;
  std::map<std::string, size_t> streams_per_peer ABSL_GUARDED_BY(streams_mu);
  std::map<std::string, size_t> streams_per_principal ABSL_GUARDED_BY(streams_mu);
  size_t stream_threads ABSL_GUARDED_BY(streams_mu) = 0;
  std::set<int> stream_fds ABSL_GUARDED_BY(streams_mu);

  // The I/O thread's own.
  std::map<uint64_t, Conn> conns;
  std::map<std::string, size_t> per_peer;  // by listener and address (PeerKey)
  size_t main_conns = 0, health_conns = 0;
  uint64_t next_id = 1;

  static std::string PeerKey(const Conn& c) { return (c.health_only ? "health " : "") + c.peer; }

  void Wake() {
    char byte = 1;
    (void)!write(wake_write, &byte, 1);
  }

  // --- workers ---

  // Hands a request to the workers (health probes to the health worker). I/O thread.
  void Enqueue(Job job) {
    absl::MutexLock lock(&mu);
    if (job.kind == Job::Kind::kPlain && options.health_paths.count(job.request.path)) {
      health_jobs.push_back(std::move(job));
    } else {
      jobs.push_back(std::move(job));
    }
  }

  // `health`: the health worker, which serves health_jobs only.
  void WorkerLoop(bool health) {
    std::deque<Job>& queue = health ? health_jobs : jobs;
    std::pair<Impl*, std::deque<Job>*> args(this, &queue);
    while (true) {
      Job job;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](std::pair<Impl*, std::deque<Job>*>* args) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return args->first->workers_stop || !args->second->empty();
            },
            &args));
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      Done answer{job.conn, "", false, std::nullopt};
      if (job.kind == Job::Kind::kAdmit) {
        answer.admission = Admit(job);
      } else {
        // A streamed route's small request closes its connection after the answer, as its bulk
        // ones do, so that a client sees one behaviour on the route.
        answer.keep_alive = job.kind == Job::Kind::kPlain && KeepAlive(job.request);
        answer.bytes = job.kind == Job::Kind::kSmall ? RespondSmall(job, answer.keep_alive)
                                                     : Respond(job.request, answer.keep_alive);
      }
      {
        absl::MutexLock lock(&mu);
        done.push_back(std::move(answer));
      }
      Wake();
    }
  }

  static HttpAdmission Admit(const Job& job) {
    try {
      return job.route->admit(job.request);
    } catch (const std::exception& e) {
      MINIONS_LOG(Warning) << "HTTP admission for " << job.request.path << " failed: " << e.what();
      HttpAdmission refused;
      refused.kind = HttpAdmission::Kind::kRefuse;
      refused.refusal = {500, kPlain, "internal error\n", {}};
      return refused;
    }
  }

  // A small request of a streamed route, run whole against a BufferedStream.
  std::string RespondSmall(const Job& job, bool keep_alive) {
    BufferedStream stream(job.request.body, job.request.method == "HEAD");
    try {
      job.route->handler(job.request, stream);
    } catch (const std::exception& e) {
      MINIONS_LOG(Warning) << "HTTP handler for " << job.request.path << " failed: " << e.what();
    }
    if (!stream.head_written()) return Serialize({500, kPlain, "internal error\n", {}}, stream.head_only(), keep_alive);
    return Serialize(stream.response(), stream.head_only(), keep_alive);
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
  const StreamRoute* FindStreamRoute(const std::string& method, const std::string& path) const {
    if ((method == "GET" || method == "HEAD") && get_routes.count(path)) return nullptr;
    if (method == "POST" && post_routes.count(path)) return nullptr;
    for (const auto& [prefix, route] : stream_routes) {
      if (absl::StartsWith(path, prefix)) return &route;
    }
    return nullptr;
  }

  // Gives back a stream's slot (and its address's and principal's share of it).
  void ReleaseSlot(const std::string& peer, const std::string& principal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu) {
    --active_streams;
    if (auto p = streams_per_peer.find(peer); p != streams_per_peer.end() && --p->second == 0) {
      streams_per_peer.erase(p);
    }
    if (auto p = streams_per_principal.find(principal); p != streams_per_principal.end() && --p->second == 0) {
      streams_per_principal.erase(p);
    }
  }

  // Runs on a thread of its own; owns `conn`.
  void ServeStream(std::unique_ptr<StreamConn> conn, HttpRequest request, const HttpStreamHandler* handler, int fd,
                   std::string principal) {
    try {
      (*handler)(request, *conn);
    } catch (const std::exception& e) {
      MINIONS_LOG(Warning) << "HTTP handler for " << request.path << " failed: " << e.what();
    }
    if (!conn->head_written()) (void)conn->Respond(HttpResponse{500, kPlain, "internal error\n", {}});
    (void)conn->Finish();
    bool linger = false;
    {
      // The answer is out: the slot is free for the next request, whatever the client does now.
      // A thread still lingers on the rest of the body, but only as many as there are slots.
      absl::MutexLock lock(&streams_mu);
      ReleaseSlot(request.peer, principal);
      linger = stream_threads <= active_streams + options.max_streams;
    }
    if (linger) conn->Linger();
    {
      absl::MutexLock lock(&streams_mu);
      stream_fds.erase(fd);
    }
    conn.reset();
    absl::MutexLock lock(&streams_mu);
    --stream_threads;
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
    Forget(id);
  }

  // Drops a connection from the books (not closing it).
  void Forget(uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    Conn& c = it->second;
    if (auto p = per_peer.find(PeerKey(c)); p != per_peer.end() && --p->second == 0) per_peer.erase(p);
    --(c.health_only ? health_conns : main_conns);
    conns.erase(it);
  }

  // Bytes read (> 0), 0 when the socket has nothing now, -1 when the connection is over.
  ssize_t ReadSome(Conn& c, char* buffer, size_t size) {
    if (c.ssl) return SslOutcome(c, SSL_read(c.ssl, buffer, static_cast<int>(size)));
    ssize_t n = recv(c.fd, buffer, size, 0);
    if (n > 0) return n;
    if (n < 0 && WouldBlock()) {
      c.want_read = true;
      return 0;
    }
    return -1;
  }

  // Bytes written (>= 0; 0 when the socket takes nothing now), -1 when the connection is over.
  ssize_t WriteSome(Conn& c, const char* data, size_t size) {
    if (c.ssl) return SslOutcome(c, SSL_write(c.ssl, data, static_cast<int>(size)));
    ssize_t n = send(c.fd, data, size, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (WouldBlock()) {
      c.want_write = true;
      return 0;
    }
    return -1;
  }

  static bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

  // What an SSL_read or SSL_write that returned `n` did: bytes (> 0); 0 when TLS waits for the
  // socket to be readable or writable (either may be needed whichever way the data goes); -1
  // when the connection is over.
  static ssize_t SslOutcome(Conn& c, int n) {
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

  // Accepts on the main listener, or (`health`) on the health listener.
  void Accept(absl::Time now, bool health) {
    size_t& count = health ? health_conns : main_conns;
    const size_t limit = health ? options.max_health_connections : options.max_connections;
    while (count < limit) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = accept4(health ? health_fd : listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      Conn c;
      c.peer = PeerAddress(addr);
      c.health_only = health;
      size_t& from_peer = per_peer[PeerKey(c)];
      if (from_peer >= options.max_connections_per_peer) {
        close(fd);  // one address may not hold the whole server
        continue;
      }
      ++from_peer;
      ++count;
      int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
      c.fd = fd;
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
      if (!c.keep_alive) {
        // A refusal sent before the body was read: drop what is still coming for a little
        // while (2 s, 16 MiB), holding a connection, never a thread.
        if (!c.drain || c.ssl || c.peer_closed) return false;
        shutdown(c.fd, SHUT_WR);
        c.phase = Conn::Phase::kDraining;
        c.deadline = now + absl::Seconds(2);
        return Progress(id, c, now);
      }
      c.out.clear();
      c.out_sent = 0;
      c.phase = Conn::Phase::kReading;
      c.started = !c.in.empty();
      c.deadline = now + (c.started ? options.request_timeout : options.idle_timeout);
      return TryParse(id, c, now);  // a pipelined request may be waiting already
    }
    if (c.phase == Conn::Phase::kDraining) {
      char buffer[16384];
      while (true) {
        ssize_t n = ReadSome(c, buffer, sizeof(buffer));
        if (n < 0) return false;
        if (n == 0) return true;
        c.drained += static_cast<size_t>(n);
        if (c.drained > (16u << 20)) return false;
      }
    }
    return true;  // handling: nothing to do until the worker answers
  }

  // Refuses the request with `status` and closes the connection after the answer.
  bool Refuse(Conn& c, int status, const std::string& message, absl::Time now) {
    return Refuse(c, HttpResponse{status, kPlain, message + "\n", {}}, now);
  }
  bool Refuse(Conn& c, const HttpResponse& response, absl::Time now) {
    c.out = Serialize(response, false, false);
    c.out_sent = 0;
    c.keep_alive = false;
    c.drain = true;
    c.admission.reset();
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
    if (c.health_only && !options.health_paths.count(request.path)) {
      return Refuse(c, 404, "this port serves health probes only", now);
    }
    Job job{id, {}, Job::Kind::kPlain, FindStreamRoute(request.method, request.path)};
    size_t max_body = options.max_body_bytes;
    if (job.route && !job.route->admit) return Detach(id, c, std::move(request), end, job.route, "", now);
    if (job.route) {
      if (!c.admission) {
        // Asked before any slot is taken or any body read; the answer comes back to TakeAnswers.
        c.phase = Conn::Phase::kHandling;
        Enqueue({id, std::move(request), Job::Kind::kAdmit, job.route});
        return true;
      }
      if (c.admission->kind == HttpAdmission::Kind::kStream) {
        std::string principal = c.admission->principal;
        request.admitted = std::move(c.admission->admitted);
        c.admission.reset();
        return Detach(id, c, std::move(request), end, job.route, principal, now);
      }
      job.kind = Job::Kind::kSmall;
      max_body = c.admission->max_body_bytes;
    }
    if (request.method == "DELETE" && !job.route) return Refuse(c, 405, "DELETE is not allowed here", now);
    if (!request.Header("transfer-encoding").empty()) {
      return Refuse(c, 501, "chunked request bodies are not accepted; send Content-Length", now);
    }
    size_t length = 0;
    if (std::string cl = request.Header("content-length"); !cl.empty()) {
      if (!absl::SimpleAtoi(cl, &length)) return Refuse(c, 400, "bad Content-Length", now);
      if (length > max_body) return Refuse(c, 413, "request body too large", now);
    }
    if (c.in.size() < end + 4 + length) {  // the body is still coming
      if (!c.continue_sent && absl::EqualsIgnoreCase(request.Header("expect"), "100-continue")) {
        // Best effort: a client that misses it sends the body after its own wait.
        c.continue_sent = true;
        static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        (void)WriteSome(c, kContinue, sizeof(kContinue) - 1);
      }
      return true;
    }
    request.body = c.in.substr(end + 4, length);
    c.in.erase(0, end + 4 + length);
    c.phase = Conn::Phase::kHandling;
    c.continue_sent = false;
    if (c.admission) request.admitted = std::move(c.admission->admitted);
    c.admission.reset();
    job.request = std::move(request);
    Enqueue(std::move(job));
    return true;
  }

  // Hands the connection of a streamed request to a thread of its own (it leaves the I/O loop).
  // `end`: where the headers end in c.in (the body's bytes already read follow them).
  bool Detach(uint64_t id, Conn& c, HttpRequest request, size_t end, const StreamRoute* route,
              const std::string& principal, absl::Time now) {
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
      auto from_peer = streams_per_peer.find(c.peer);
      if (from_peer != streams_per_peer.end() && from_peer->second >= options.max_streams_per_peer) {
        return Refuse(c, 429, "too many uploads and downloads from your address at once; try again shortly", now);
      }
      auto of_principal = streams_per_principal.find(principal);
      if (!principal.empty() && of_principal != streams_per_principal.end() &&
          of_principal->second >= options.max_streams_per_principal) {
        return Refuse(c, 429, "too many uploads and downloads of your key at once; try again shortly", now);
      }
      ++active_streams;
      ++streams_per_peer[c.peer];
      if (!principal.empty()) ++streams_per_principal[principal];
      ++stream_threads;
      stream_fds.insert(c.fd);
    }
    const int fd = c.fd;
    auto conn = std::make_unique<StreamConn>(fd, c.ssl, c.in.substr(end + 4), request, options.request_timeout,
                                             options.write_timeout, options.min_transfer_rate);
    // The connection is the stream's now: forget it without closing it.
    Forget(id);
    std::thread([this, conn = std::move(conn), request = std::move(request), handler = &route->handler, fd,
                 principal]() mutable {
      ServeStream(std::move(conn), std::move(request), handler, fd, principal);
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
      if (answer.admission) {
        if (answer.admission->kind == HttpAdmission::Kind::kRefuse) {
          Refuse(c, answer.admission->refusal, now);
        } else {
          // Read on: the body (small) or up to the hand-over to a stream (the request is parsed again).
          c.admission = std::move(answer.admission);
          c.phase = Conn::Phase::kReading;
          if (!TryParse(answer.conn, c, now)) continue;   // handed over to a stream
          if (c.phase != Conn::Phase::kWriting) continue;  // the body is still coming, or handled
        }
        if (!Progress(answer.conn, c, now)) Close(answer.conn);
        continue;
      }
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
      fds.push_back({listen_fd, static_cast<short>(main_conns < options.max_connections ? POLLIN : 0), 0});
      fds.push_back({health_fd, static_cast<short>(health_conns < options.max_health_connections ? POLLIN : 0), 0});
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
      if (fds[1].revents & POLLIN) Accept(now, false);
      if (fds[2].revents & POLLIN) Accept(now, true);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        short revents = fds[i + 3].revents;
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

namespace {

// A listening socket on `listen` ("host:port"), its port in *port.
absl::StatusOr<int> ListenOn(const std::string& listen, int* port_out) {
  std::string host;
  int port = 0;
  if (auto s = SplitHostPort(listen, &host, &port); !s.ok()) return s;
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
  *port_out = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

}  // namespace

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

void HttpServer::HandleStream(const std::string& prefix, HttpStreamHandler handler, HttpAdmitter admit) {
  impl_->stream_routes[prefix] = {std::move(handler), std::move(admit)};
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
  auto main_fd = ListenOn(listen, &port_);
  if (!main_fd.ok()) return main_fd.status();
  if (!options.health_listen.empty()) {
    std::string health_host;
    int health_port = 0;
    if (auto st = SplitHostPort(options.health_listen, &health_host, &health_port); !st.ok()) {
      close(*main_fd);
      return st;
    }
    if (!tls && !IsLoopbackHost(health_host)) {
      close(*main_fd);
      return absl::FailedPreconditionError(absl::StrCat("refusing to serve health probes in plain text on ",
                                                        options.health_listen, ": give the server a TLS certificate"));
    }
    auto fd = ListenOn(options.health_listen, &health_port_);
    if (!fd.ok()) {
      close(*main_fd);
      return fd.status();
    }
    impl_->health_fd = *fd;
  }
  const int fd = *main_fd;
  int wake[2];
  if (pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    close(fd);
    if (impl_->health_fd >= 0) close(impl_->health_fd);
    impl_->health_fd = -1;
    return absl::InternalError("cannot make a pipe");
  }
  // A client that hangs up mid-write must not kill the process (TLS writes go through write(2)).
  signal(SIGPIPE, SIG_IGN);
  impl_->listen_fd = fd;
  impl_->wake_read = wake[0];
  impl_->wake_write = wake[1];
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl_->workers.emplace_back([this] { impl_->WorkerLoop(/*health=*/false); });
  }
  impl_->workers.emplace_back([this] { impl_->WorkerLoop(/*health=*/true); });
  impl_->io_thread = std::thread([this] { impl_->IoLoop(); });
  return absl::OkStatus();
}

size_t HttpServer::streams_open() const {
  absl::MutexLock lock(&impl_->streams_mu);
  return impl_->active_streams;
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
        +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->streams_mu) { return impl->stream_threads == 0; },
        impl_.get()));
  }
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->workers_stop = true;
    impl_->jobs.clear();
    impl_->health_jobs.clear();
  }
  for (auto& worker : impl_->workers) worker.join();
  impl_->workers.clear();
  close(impl_->listen_fd);
  if (impl_->health_fd >= 0) close(impl_->health_fd);
  impl_->health_fd = -1;
  close(impl_->wake_read);
  close(impl_->wake_write);
  if (impl_->ssl_ctx) SSL_CTX_free(impl_->ssl_ctx);
  impl_->ssl_ctx = nullptr;
}

}  // namespace minions
