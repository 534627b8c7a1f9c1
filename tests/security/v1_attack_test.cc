// Attacks on the OpenAI-compatible /v1 routes and on the HTTP port's fairness (issue 40, point 4):
// one submitter's slow uploads, requests with a wrong key, one address holding many streams, a
// client dripping bytes, and a flood that would starve the health probes. Each asserts the
// refusal and that another team (or the probe) is still served.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "blob/local/local_blob_store.h"
#include "identity/identity_admin.h"
#include "openai/openai_api.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/forwarding_blob_store.h"
#include "testing/identities.h"
#include "testing/must.h"
#include "testing/openai_stack.h"
#include "testing/socket_read.h"
#include "raw_tcp.h"

namespace minions::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

void SendAll(int fd, const std::string& bytes) {
  for (size_t sent = 0; sent < bytes.size();) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may answer (and close) before all has gone
    sent += static_cast<size_t>(n);
  }
}

// What comes back on `fd` until the server closes it or `timeout` passes with nothing new.
std::string ReadAnswer(int fd, absl::Duration timeout = absl::Seconds(20)) { return ReadFromSocket(fd, timeout); }

// The whole answer to a GET of `path` on a connection of its own ("", and a failure, when the
// port refuses the connection).
std::string GetOnce(int port, const std::string& path) {
  int fd = Connect(port);
  if (fd < 0) {
    ADD_FAILURE() << "port " << port << " refused the connection";
    return "";
  }
  SendAll(fd, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string answer = ReadAnswer(fd, absl::Seconds(10));
  close(fd);
  return answer;
}

int Status(const std::string& answer) { return answer.size() < 12 ? 0 : std::atoi(answer.substr(9, 3).c_str()); }

std::string Request(const std::string& method, const std::string& path, const std::string& token,
                    const std::string& body = "", const std::string& content_type = "application/json") {
  std::string out = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
  if (!token.empty()) absl::StrAppend(&out, "Authorization: Bearer ", token, "\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&out, "Content-Type: ", content_type, "\r\nContent-Length: ", body.size(), "\r\n");
  }
  return absl::StrCat(out, "\r\n", body);
}

constexpr char kFormType[] = "multipart/form-data; boundary=XyZ";
std::string Form(const std::string& file) {
  return absl::StrCat("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n",
                      "Content-Type: application/jsonl\r\n\r\n", file,
                      "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ--\r\n");
}
// The head of an upload of 100,000 bytes, and its first few: the rest never comes (or slowly).
std::string SlowUploadHead(const std::string& token) {
  return absl::StrCat("POST /v1/files HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ", token,
                      "\r\nContent-Type: ", kFormType, "\r\nContent-Length: 100000\r\n\r\n--XyZ\r\n");
}

// An object store whose reads of whole objects wait (10 s at most) until `expected` are under way
// at once: whether creates validate side by side or one after another.
class GatedBlobs final : public ForwardingBlobStore {
 public:
  GatedBlobs(BlobStore* inner, int expected) : ForwardingBlobStore(inner), expected_(expected) {}
  absl::Status Read(const std::string& k, const std::function<bool(std::string_view)>& sink) override {
    {
      absl::MutexLock lock(&mu_);
      ++reading_;
      most_ = std::max(most_, reading_);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](GatedBlobs* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) { return g->most_ >= g->expected_; },
                               this),
                           absl::Seconds(10));
    }
    absl::Status s = ForwardingBlobStore::Read(k, sink);
    absl::MutexLock lock(&mu_);
    --reading_;
    return s;
  }
  int most() {
    absl::MutexLock lock(&mu_);
    return most_;
  }

 private:
  const int expected_;
  absl::Mutex mu_;
  int reading_ ABSL_GUARDED_BY(mu_) = 0;
  int most_ ABSL_GUARDED_BY(mu_) = 0;
};

class V1Attack : public OpenAiStack {
 protected:
  void SetUp() override {
    SetUpStack("minions-v1-attack", {{"tiny.gguf", "not really a model"}});
    search_ = Issue("search", "alice");
    ads_ = Issue("ads", "bob");
  }
  // `api_blobs`: the object store the API sees (default: blobs_).
  void Start(HttpServerOptions options, BlobStore* api_blobs = nullptr) {
    api_ = std::make_unique<openai::OpenAiApi>(
        openai::OpenAiApi::Deps{store_.get(), api_blobs ? api_blobs : blobs_.get(), &clock_, auth_.get(), jobs_.get(),
                                catalog_.get(), {}},
        openai::OpenAiApiOptions{});
    http_ = std::make_unique<HttpServer>(options);
    api_->Install(http_.get());
    ASSERT_TRUE(http_->Start("127.0.0.1:0").ok());
    port_ = http_->port();
  }
  void TearDown() override {
    for (int fd : open_) close(fd);
    if (http_) http_->Stop();
    std::filesystem::remove_all(dir_);
  }

  std::string Issue(const std::string& team, const std::string& name) {
    return IssueText(*identities_, Role::kSubmitter, team, name);
  }
  std::string Exchange(const std::string& request, const char* source = "127.0.0.1") {
    int fd = Connect(port_, source);
    if (fd < 0) return "";
    SendAll(fd, request);
    std::string answer = ReadAnswer(fd);
    close(fd);
    return answer;
  }
  std::string Upload(const std::string& token, const char* source = "127.0.0.1") {
    return Exchange(Request("POST", "/v1/files", token, Form("{\"custom_id\":\"a\"}\n"), kFormType), source);
  }
  // Starts an upload that stalls, and waits until it holds a stream slot (`slots` held in all).
  int StallUpload(const std::string& token, size_t slots, const char* source = "127.0.0.1") {
    int fd = Connect(port_, source);
    SendAll(fd, SlowUploadHead(token));
    open_.push_back(fd);
    for (int i = 0; i < 2000 && http_->streams_open() < slots; ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ(http_->streams_open(), slots);
    return fd;
  }

  std::unique_ptr<openai::OpenAiApi> api_;
  std::unique_ptr<HttpServer> http_;
  int port_ = 0;
  std::string search_, ads_;
  std::vector<int> open_;
};

TEST_F(V1Attack, SmallRoutesAreServedWhileUploadsHoldEverySlot) {
  HttpServerOptions options;
  options.max_streams = 2;
  Start(options);
  StallUpload(search_, 1);
  StallUpload(search_, 2);
  // Every slot is held, yet another team lists, reads and cancels: those hold no slot.
  EXPECT_EQ(Status(Exchange(Request("GET", "/v1/batches", ads_))), 200);
  EXPECT_EQ(Status(Exchange(Request("GET", "/v1/files", ads_))), 200);
  EXPECT_EQ(Status(Exchange(Request("GET", "/v1/models", ads_))), 200);
  EXPECT_EQ(Status(Exchange(Request("GET", "/v1/batches/batch_nope", ads_))), 404);
  EXPECT_EQ(Status(Exchange(Request("POST", "/v1/batches/job-000000000000/cancel", ads_))), 404);
  // A small request's body is still bounded.
  EXPECT_EQ(Status(Exchange(Request("POST", "/v1/batches/job-000000000000/cancel", ads_, std::string(2 << 20, ' ')))),
            413);
  // An upload does need a slot: refused while they are all held.
  EXPECT_EQ(Status(Upload(ads_)), 503);
}

TEST_F(V1Attack, ARequestWithoutAValidKeyHoldsNoSlot) {
  HttpServerOptions options;
  options.max_streams = 1;
  Start(options);
  // Twenty uploads with a wrong key or none, whose bodies never come: each is refused from its
  // headers, by the I/O thread, without a slot or a thread.
  for (int i = 0; i < 20; ++i) {
    int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    open_.push_back(fd);
    SendAll(fd, SlowUploadHead(i % 2 ? "mns_forged" : ""));
    std::string answer = ReadAnswer(fd, absl::Seconds(10));
    EXPECT_EQ(Status(answer), 401) << answer;
    EXPECT_THAT(answer, HasSubstr("API key"));
    EXPECT_EQ(http_->streams_open(), 0u);
  }
  // The one slot is free for an honest upload while the twenty still hang on.
  EXPECT_EQ(Status(Upload(ads_)), 200);
}

TEST_F(V1Attack, OneKeyCannotTakeEverySlot) {
  HttpServerOptions options;
  options.max_streams = 4;
  options.max_streams_per_principal = 2;
  Start(options);
  StallUpload(search_, 1);
  StallUpload(search_, 2);
  std::string third = Upload(search_);
  EXPECT_EQ(Status(third), 429) << third;
  EXPECT_THAT(third, HasSubstr("your key"));
  EXPECT_EQ(Status(Upload(ads_)), 200);  // another team's key still has room
}

TEST_F(V1Attack, OneAddressCannotTakeEverySlot) {
  HttpServerOptions options;
  options.max_streams = 4;
  options.max_streams_per_peer = 2;
  Start(options);
  StallUpload(search_, 1, "127.0.0.2");
  StallUpload(ads_, 2, "127.0.0.2");
  std::string third = Upload(ads_, "127.0.0.2");
  EXPECT_EQ(Status(third), 429) << third;
  EXPECT_THAT(third, HasSubstr("your address"));
  EXPECT_EQ(Status(Upload(ads_, "127.0.0.1")), 200);  // from elsewhere: served
}

TEST_F(V1Attack, AClientDrippingBytesIsDroppedAndItsSlotFreed) {
  HttpServerOptions options;
  options.max_streams = 1;
  options.request_timeout = absl::Seconds(1);
  options.min_transfer_rate = 1024;
  Start(options);
  int fd = StallUpload(search_, 1);
  // A byte every 100 ms: each read is well within the timeout, but the stream moves ~10 bytes/s.
  bool closed = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::string answer;
  while (!closed && absl::Now() < give_up) {
    if (send(fd, "x", 1, MSG_NOSIGNAL) != 1) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buffer[4096];
      ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n > 0) answer.append(buffer, static_cast<size_t>(n));
      closed = n <= 0 || Status(answer) != 0;
    }
  }
  const bool dropped = absl::Now() < give_up;
  EXPECT_TRUE(dropped) << "the dripping client was never dropped";
  if (!answer.empty()) EXPECT_EQ(Status(answer), 400) << answer;
  for (int i = 0; i < 2000 && http_->streams_open() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(http_->streams_open(), 0u);
  EXPECT_EQ(Status(Upload(ads_)), 200);
}

TEST_F(V1Attack, CreatesValidateSideBySideAndDuplicatesAreStillFound) {
  // Two teams' creates, each with its own Idempotency-Key: neither waits for the other's
  // validation (one process-wide lock used to make every keyed create wait for the one before).
  GatedBlobs gated(blobs_.get(), 2);
  Start(HttpServerOptions{}, &gated);
  auto line = [](const std::string& id) {
    return absl::StrCat(R"({"custom_id":")", id,
                        R"(","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"hi"}]}})", "\n");
  };
  auto upload = [&](const std::string& token, const std::string& file) {
    std::string answer = Exchange(Request("POST", "/v1/files", token, Form(file), kFormType));
    EXPECT_EQ(Status(answer), 200) << answer;
    auto end = answer.find("\r\n\r\n");
    return Must(ParseJson(answer.substr(end + 4)))["id"].get<std::string>();
  };
  const std::string ours = upload(search_, line("a") + line("b") + line("a"));
  const std::string theirs = upload(ads_, line("x") + line("y"));
  auto create = [&](const std::string& token, const std::string& file, const std::string& key) {
    std::string body = DumpJson(Json{{"input_file_id", file}, {"endpoint", "/v1/chat/completions"},
                                     {"completion_window", "24h"}});
    std::string request = Request("POST", "/v1/batches", token, body);
    request.insert(request.find("\r\n\r\n"), "\r\nIdempotency-Key: " + key);
    return Exchange(request);
  };
  std::string first, second;
  std::thread a([&] { first = create(search_, ours, "k1"); });
  std::thread b([&] { second = create(ads_, theirs, "k2"); });
  a.join();
  b.join();
  EXPECT_EQ(gated.most(), 2);
  EXPECT_EQ(Status(first), 200) << first;
  EXPECT_EQ(Status(second), 200) << second;
  // The fingerprints still find a repeated custom_id (line 3 of ours).
  EXPECT_THAT(first, HasSubstr("duplicate_custom_id"));
  EXPECT_THAT(second, Not(HasSubstr("duplicate_custom_id")));
}

TEST_F(V1Attack, AResultFileIdThatNamesNoJobIs404NotAServerError) {
  Start(HttpServerOptions{});
  // "file-output" ends as an output file's id does, with nothing before the suffix (it used to
  // make the server take the length of a negative string: a 500).
  for (const char* id : {"file-output", "file-errors", "file--output", "file--errors"}) {
    for (const std::string& path : {absl::StrCat("/v1/files/", id), absl::StrCat("/v1/files/", id, "/content")}) {
      std::string answer = Exchange(Request("GET", path, search_));
      EXPECT_EQ(Status(answer), 404) << path << ": " << answer;
      EXPECT_THAT(answer, HasSubstr("No such File object"));
    }
  }
}

// GET /block on `server` holds its worker until `release` is notified: how a test keeps the
// server's workers busy.
struct BlockRoute {
  explicit BlockRoute(HttpServer& server) {
    server.Handle("/block", [this](const HttpRequest&) {
      ++blocked;
      release.WaitForNotification();
      return HttpResponse{200, "text/plain", "done\n", {}};
    });
  }
  // Until `n` calls of /block hold their workers (up to 20 s): how many do.
  int AwaitBlocked(int n) {
    for (int i = 0; i < 2000 && blocked < n; ++i) absl::SleepFor(absl::Milliseconds(10));
    return blocked;
  }
  absl::Notification release;
  std::atomic<int> blocked{0};
};

TEST(HealthProbes, AnswerWhileEveryWorkerIsBusyAndEveryConnectionIsTaken) {
  HttpServerOptions options;
  options.threads = 2;
  options.max_connections = 6;
  options.max_connections_per_peer = 6;
  options.health_listen = "127.0.0.1:0";
  HttpServer server(options);
  BlockRoute block(server);
  server.Handle("/readyz", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "ready\n", {}}; });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  ASSERT_NE(server.health_port(), 0);
  // Both workers held by slow handlers, the other connections silent: the main port is full.
  std::vector<int> held;
  for (int i = 0; i < 6; ++i) {
    int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    if (i < 2) SendAll(fd, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n");
    held.push_back(fd);
  }
  ASSERT_EQ(block.AwaitBlocked(2), 2);
  // The health worker answers /readyz on the main port (over a connection the server had room for
  // before it filled) and the health listener answers it however full the main port is.
  for (int i = 0; i < 5; ++i) {
    std::string answer = GetOnce(server.health_port(), "/readyz");
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 200")) << "try " << i;
    EXPECT_THAT(answer, HasSubstr("ready"));
  }
  // The health listener serves nothing else.
  EXPECT_THAT(GetOnce(server.health_port(), "/block"), StartsWith("HTTP/1.1 404"));
  block.release.Notify();
  for (int fd : held) close(fd);
  server.Stop();
}

TEST(HealthProbes, TheHealthWorkerAnswersWhileEveryOtherWorkerIsBusy) {
  HttpServerOptions options;
  options.threads = 2;
  HttpServer server(options);
  BlockRoute block(server);
  server.Handle("/healthz", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "ok\n", {}}; });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    int fd = Connect(server.port());
    SendAll(fd, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n");
    held.push_back(fd);
  }
  ASSERT_EQ(block.AwaitBlocked(2), 2);
  EXPECT_THAT(GetOnce(server.port(), "/healthz"), StartsWith("HTTP/1.1 200"));
  block.release.Notify();
  for (int held_fd : held) close(held_fd);
  server.Stop();
}

}  // namespace
}  // namespace minions::testing
