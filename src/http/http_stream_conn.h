#pragma once
// The connections of streamed HTTP requests (http_server.h), internal to the HTTP server:
// StreamConn, a detached connection served by a handler's thread with blocking, timed I/O and a
// floor on its client's transfer rate; BufferedStream, a small request's HttpStream, gathered whole
// on a worker. And the response head both write.
// Threads: each object is used by one thread at a time (its handler's).

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "http/http_server.h"

namespace minions::http_internal {

// The status line and headers of a response (`content_length` < 0: chunked).
std::string ResponseHead(int status, const std::string& content_type, int64_t content_length, bool keep_alive,
                         const std::map<std::string, std::string>& headers);

// A detached connection serving one request of a streamed route, on the handler's thread, with
// blocking I/O bounded by per-operation timeouts. Owns the socket (and its TLS) until destroyed.
class StreamConn final : public HttpStream {
 public:
  StreamConn(int fd, SSL* ssl, std::string buffered, const HttpRequest& request, absl::Duration read_timeout,
             absl::Duration write_timeout, int64_t min_rate)
      : fd_(fd),
        ssl_(ssl),
        in_(std::move(buffered)),
        head_only_(request.method == "HEAD"),
        min_rate_(min_rate),
        rate_grace_(read_timeout) {
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
    const absl::Time start = absl::Now();
    auto n = RawReadOnce(buffer, size);
    if (n.ok()) return Moved(*n, start);
    return n;
  }

  // Counts `n` bytes moved in a wait that began at `start`; an error (the stream is over) when the
  // client has kept it waiting past the grace time at less than the floor rate on average.
  absl::StatusOr<size_t> Moved(size_t n, absl::Time start) {
    waited_ += absl::Now() - start;
    moved_ += static_cast<int64_t>(n);
    if (min_rate_ > 0 && waited_ > rate_grace_ &&
        static_cast<double>(moved_) < static_cast<double>(min_rate_) * absl::ToDoubleSeconds(waited_)) {
      broken_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("the client moves fewer than ", min_rate_, " bytes a second; the connection is closed"));
    }
    return n;
  }

  absl::StatusOr<size_t> RawReadOnce(char* buffer, size_t size) {
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
      const absl::Time start = absl::Now();
      auto n = WriteOnce(data);
      if (!n.ok()) return n.status();
      if (auto moved = Moved(*n, start); !moved.ok()) return moved.status();
      data.remove_prefix(*n);
    }
    return absl::OkStatus();
  }

  // Bytes of `data` sent (> 0, or 0 to try again), or an error.
  absl::StatusOr<size_t> WriteOnce(std::string_view data) {
    while (true) {
      if (ssl_) {
        int n = SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 20)));
        if (n <= 0) {
          ERR_clear_error();
          broken_ = true;
          return absl::UnavailableError("the client stopped reading the response");
        }
        return static_cast<size_t>(n);
      }
      // At most 1 MiB a call, so that the rate is judged while a large write is under way.
      ssize_t n = send(fd_, data.data(), std::min<size_t>(data.size(), 1 << 20), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        broken_ = true;
        return absl::UnavailableError("the client stopped reading the response");
      }
      return static_cast<size_t>(n);
    }
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
  const int64_t min_rate_;         // bytes/s; 0: no floor
  const absl::Duration rate_grace_;
  absl::Duration waited_;          // spent blocked on the client, reading and writing
  int64_t moved_ = 0;              // bytes read and written
};

// The HttpStream of a small request on a streamed route (HttpAdmission::kSmall): the body was
// read whole by the I/O thread; the response is gathered whole and sent by it. One worker uses it.
class BufferedStream final : public HttpStream {
 public:
  BufferedStream(const std::string& body, bool head_only) : body_(body), head_only_(head_only) {}

  absl::StatusOr<size_t> ReadBody(char* buffer, size_t size) override {
    size_t n = std::min(size, body_.size() - read_);
    memcpy(buffer, body_.data() + read_, n);
    read_ += n;
    return n;
  }
  absl::Status WriteHead(int status, const std::string& content_type, int64_t,
                         const std::map<std::string, std::string>& headers) override {
    if (head_written_) return absl::FailedPreconditionError("the response head was written already");
    head_written_ = true;
    response_.status = status;
    response_.content_type = content_type;
    response_.headers = headers;
    return absl::OkStatus();
  }
  absl::Status Write(std::string_view data) override {
    if (!head_written_) return absl::FailedPreconditionError("write the response head first");
    response_.body.append(data);
    return absl::OkStatus();
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  bool head_written() const override { return head_written_; }

  const HttpResponse& response() const { return response_; }
  bool head_only() const { return head_only_; }

 private:
  const std::string& body_;
  size_t read_ = 0;
  const bool head_only_;
  bool head_written_ = false;
  HttpResponse response_;
};

}  // namespace minions::http_internal
