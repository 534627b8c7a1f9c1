// The HTTP server itself (src/http): keep-alive and pipelining, HEAD, POST forms, TLS, refusing
// plain text off loopback, stopping with connections still open, and streamed routes (bodies in
// either framing, chunked answers, the cap on streams, stopping with a stream in flight).

#include "http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "absl/synchronization/notification.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "identity/pki.h"
#include "testing/http_get.h"
#include "testing/socket_read.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  return fd;
}

// Reads until `count` responses' worth of "HTTP/1.1 " have arrived and their bodies (or 5 s).
std::string ReadAnswers(int fd, int count, size_t body_bytes_each) {
  return ReadFromSocket(fd, absl::Seconds(5), [&](const std::string& all) {
    size_t seen = 0;
    for (size_t at = all.find("HTTP/1.1 "); at != std::string::npos; at = all.find("HTTP/1.1 ", at + 1)) ++seen;
    return static_cast<int>(seen) >= count && all.size() >= count * body_bytes_each;
  });
}

class HttpServerConnections : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Handle("/echo", [](const HttpRequest& r) {
      return HttpResponse{200, "text/plain", absl::StrCat("path=", r.path, " q=", r.Param("q"), "\n"), {}};
    });
    server_.HandlePost("/form", [](const HttpRequest& r) {
      auto form = r.Form();
      return HttpResponse{200, "text/plain", absl::StrCat("name=", form["name"], " cookie=", r.Cookie("c"), "\n"), {}};
    });
    ASSERT_TRUE(server_.Start("127.0.0.1:0").ok());
    base_ = absl::StrCat("http://127.0.0.1:", server_.port());
  }
  HttpServer server_;
  std::string base_;
};

TEST_F(HttpServerConnections, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  int fd = Connect(server_.port());
  ASSERT_GE(fd, 0);
  const std::string two = "GET /echo?q=one HTTP/1.1\r\nHost: x\r\n\r\nGET /echo?q=two HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(fd, two.data(), two.size(), 0), static_cast<ssize_t>(two.size()));
  std::string answers = ReadAnswers(fd, 2, 10);
  auto one = answers.find("q=one"), second = answers.find("q=two");
  ASSERT_NE(one, std::string::npos) << answers;
  ASSERT_NE(second, std::string::npos) << answers;
  EXPECT_LT(one, second);
  // The connection stays open for a third.
  const std::string three = "GET /echo?q=three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(fd, three.data(), three.size(), 0), static_cast<ssize_t>(three.size()));
  EXPECT_THAT(ReadAnswers(fd, 1, 10), HasSubstr("q=three"));
  close(fd);
}

TEST_F(HttpServerConnections, HeadGivesTheLengthButNoBodyAndPostFormsAreDecoded) {
  int fd = Connect(server_.port());
  const std::string head = "HEAD /echo?q=abc HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  std::string answer = ReadAnswers(fd, 1, 0);
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("Content-Length: 17"));  // "path=/echo q=abc\n"
  EXPECT_EQ(answer.find("path="), std::string::npos);
  close(fd);
  HttpReply posted = HttpPost(base_ + "/form", "name=a%20b%2Bc&other=1", {"Cookie: x=1; c=yum"});
  EXPECT_EQ(posted.status, 200);
  EXPECT_EQ(posted.body, "name=a b+c cookie=yum\n");
  EXPECT_EQ(HttpPost(base_ + "/echo", "").status, 405);
  EXPECT_EQ(HttpGet(base_ + "/form").status, 405);
  HttpReply page = HttpGet(base_ + "/echo");
  EXPECT_EQ(page.headers["x-content-type-options"], "nosniff");
  EXPECT_EQ(page.headers["x-frame-options"], "DENY");
}

TEST_F(HttpServerConnections, StopReturnsWithConnectionsStillOpen) {
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(Connect(server_.port()));
  (void)!send(idle[0], "GET /ec", 7, 0);
  server_.Stop();
  for (int fd : idle) close(fd);
  server_.Stop();  // idempotent
}

// A streamed route that echoes the request body back, chunked, after "method path:".
class HttpServerStreams : public ::testing::Test {
 protected:
  void Start(size_t max_streams) {
    HttpServerOptions options;
    options.max_streams = max_streams;
    server_ = std::make_unique<HttpServer>(options);
    server_->Handle("/plain", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "plain\n", {}}; });
    server_->HandleStream("/s/", [this](const HttpRequest& r, HttpStream& stream) {
      if (!reading_.HasBeenNotified()) reading_.Notify();  // requests here come one at a time
      std::string body;
      char buffer[5];
      while (true) {
        auto n = stream.ReadBody(buffer, sizeof(buffer));
        if (!n.ok()) return (void)stream.Respond(HttpResponse{400, "text/plain", std::string(n.status().message()), {}});
        if (*n == 0) break;
        body.append(buffer, *n);
      }
      (void)stream.WriteHead(200, "text/plain", -1);
      (void)stream.Write(absl::StrCat(r.method, " ", r.path, ":"));
      (void)stream.Write(body);
    });
    ASSERT_TRUE(server_->Start("127.0.0.1:0").ok());
  }
  std::string Exchange(const std::string& request) {
    int fd = Connect(server_->port());
    (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::string all = ReadAnswers(fd, 1, 1 << 20);
    close(fd);
    return all;
  }
  std::unique_ptr<HttpServer> server_;
  absl::Notification reading_;
};

TEST_F(HttpServerStreams, BodiesInEitherFramingAreReadAndAnswersAreChunked) {
  Start(4);
  std::string sized = Exchange("POST /s/a?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
  EXPECT_THAT(sized, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(sized, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(sized, HasSubstr("Connection: close"));
  EXPECT_THAT(sized, HasSubstr("b\r\nhello world\r\n0\r\n\r\n"));
  std::string chunked = Exchange(
      "DELETE /s/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n"
      "Trailer: t\r\n\r\n");
  EXPECT_THAT(chunked, HasSubstr("DELETE /s/b:"));
  EXPECT_THAT(chunked, HasSubstr("5\r\nabcde\r\n"));
  EXPECT_THAT(Exchange("POST /s/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n"),
              StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(Exchange("POST /s/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"), StartsWith("HTTP/1.1 501"));
  EXPECT_THAT(Exchange("POST /s/c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"),
              StartsWith("HTTP/1.1 400"));
  // Exact routes still win, and DELETE elsewhere is refused.
  EXPECT_THAT(Exchange("GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), HasSubstr("plain"));
  EXPECT_THAT(Exchange("DELETE /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), StartsWith("HTTP/1.1 405"));
}

TEST_F(HttpServerStreams, StreamsBeyondTheCapAre503AndStopEndsAStalledOne) {
  Start(1);
  // One stream whose body never comes holds the only slot...
  int stalled = Connect(server_->port());
  std::string head = "POST /s/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab";
  (void)!send(stalled, head.data(), head.size(), MSG_NOSIGNAL);
  reading_.WaitForNotification();
  // ... so another is refused, while plain routes still answer.
  EXPECT_THAT(Exchange("POST /s/other HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(Exchange("GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  // Stop does not wait out the stalled read (its socket is shut).
  server_->Stop();
  close(stalled);
}

TEST(HttpServerTls, ServesTlsAndOnlyTlsAndPlainTextOnlyOnLoopback) {
  const std::string dir = (std::filesystem::temp_directory_path() / absl::StrCat("minions-http-tls-", getpid())).string();
  pki::InitOptions pki_options;
  pki_options.dir = dir;
  absl::StatusOr<pki::Files> files = pki::Init(pki_options, absl::Now());
  ASSERT_TRUE(files.ok()) << files.status();
  HttpServerOptions options;
  options.tls_cert_file = files->server_cert;
  options.tls_key_file = files->server_key;
  HttpServer server(options);
  server.Handle("/hello", [](const HttpRequest& r) { return HttpResponse{200, "text/plain", r.tls ? "tls\n" : "plain\n", {}}; });
  // A streamed route over TLS: the body read and the answer written on the stream's own thread.
  server.HandleStream("/s/", [](const HttpRequest& r, HttpStream& stream) {
    std::string body;
    char buffer[4096];
    while (true) {
      auto n = stream.ReadBody(buffer, sizeof(buffer));
      if (!n.ok() || *n == 0) break;
      body.append(buffer, *n);
    }
    (void)stream.WriteHead(200, "text/plain", -1);
    (void)stream.Write(r.tls ? "tls:" : "plain:");
    for (size_t at = 0; at < body.size(); at += 10000) (void)stream.Write(std::string_view(body).substr(at, 10000));
  });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  HttpOptions https;
  https.ca_file = files->ca_cert;
  HttpReply reply = HttpRequestOnce(absl::StrCat("https://localhost:", server.port(), "/hello"), https);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "tls\n");
  HttpOptions upload = https;
  upload.post = true;
  for (int i = 0; i < 50000; ++i) upload.post_body += static_cast<char>('a' + i % 26);
  HttpReply echoed = HttpRequestOnce(absl::StrCat("https://localhost:", server.port(), "/s/echo"), upload);
  EXPECT_EQ(echoed.status, 200);
  EXPECT_EQ(echoed.body, "tls:" + upload.post_body);
  EXPECT_EQ(HttpGet(absl::StrCat("http://127.0.0.1:", server.port(), "/hello"), 3000).status, 0);
  server.Stop();
  // A key that is not the certificate's.
  pki::InitOptions other_options;
  other_options.dir = dir + "/other";
  auto other = pki::Init(other_options, absl::Now());
  ASSERT_TRUE(other.ok());
  HttpServerOptions mismatched;
  mismatched.tls_cert_file = files->server_cert;
  mismatched.tls_key_file = other->server_key;
  HttpServer broken(mismatched);
  EXPECT_EQ(broken.Start("127.0.0.1:0").code(), absl::StatusCode::kInvalidArgument);
  // Plain text: loopback only.
  HttpServer open;
  absl::Status refused = open.Start("0.0.0.0:0");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("plain text"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minions::testing
