// S3BlobStore against a real S3 server (s3rver, started by the ctest fixture s3rver_start through
// tests/services/s3rver.sh), plus the executor's UrlBlobClient on presigned URLs and an independent
// client (minio, tests/js/minio_check.mjs) reading and writing the same bucket.
// Without the server these tests fail, saying why: they never skip.

#include "blob/s3/s3_blob_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "blob_store_contract.h"
#include "executor/blob_client.h"
#include "testing/fake_clock.h"

namespace minions::testing {
namespace {

constexpr char kBucket[] = "minions-test";

// "http://127.0.0.1:PORT" of the fixture's server, or "" with `why` set.
std::string FixtureEndpoint(std::string* why) {
  std::string path = std::string(MINIONS_TEST_S3_DIR) + "/endpoint";
  std::ifstream in(path);
  std::string endpoint;
  if (!(in >> endpoint) || endpoint.empty()) {
    *why = absl::StrCat("the S3 test server (s3rver) is not running: ", path,
                        " is missing. Run these tests through ctest (fixture s3rver_start), or start it with "
                        "tests/services/s3rver.sh start ",
                        MINIONS_TEST_S3_DIR, " 0; its log is ", MINIONS_TEST_S3_DIR, "/s3rver.log");
    return "";
  }
  return endpoint;
}

std::string Port(const std::string& endpoint) { return endpoint.substr(endpoint.rfind(':') + 1); }

std::string FreshPrefix() {
  static std::atomic<int> n{0};
  return absl::StrCat("t", getpid(), "-", absl::ToUnixMillis(absl::Now()), "-", n++);
}

S3Config BaseConfig(bool path_style) {
  S3Config config;
  std::string why;
  std::string endpoint = FixtureEndpoint(&why);
  if (endpoint.empty()) {
    ADD_FAILURE() << why;
    config.endpoint = "http://127.0.0.1:1";
    config.max_attempts = 1;
  } else {
    config.endpoint = path_style ? endpoint : absl::StrCat("http://s3.localhost:", Port(endpoint));
  }
  config.path_style = path_style;
  config.bucket = kBucket;
  config.access_key = "S3RVER";
  config.secret_key = "S3RVER";
  config.prefix = FreshPrefix();
  return config;
}

std::unique_ptr<S3BlobStore> OpenStore(S3Config config) {
  auto store = S3BlobStore::Open(std::move(config));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(S3PathStyle, BlobStoreContract, ::testing::Values([]() -> std::unique_ptr<BlobStore> {
                           return OpenStore(BaseConfig(true));
                         }));
INSTANTIATE_TEST_SUITE_P(S3VirtualHosted, BlobStoreContract,
                         ::testing::Values([]() -> std::unique_ptr<BlobStore> { return OpenStore(BaseConfig(false)); }));

TEST(S3BlobStore, FixtureServerIsRunning) {
  std::string why;
  EXPECT_FALSE(FixtureEndpoint(&why).empty()) << why;
}

TEST(S3BlobStore, ListFollowsContinuationTokens) {
  S3Config config = BaseConfig(true);
  config.list_page_size = 2;
  auto store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(store->Put(absl::StrCat("p/k", i), "x").ok());
  ASSERT_TRUE(store->Put("q/other", "x").ok());
  auto keys = store->List("p/");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(*keys, ::testing::ElementsAre("p/k0", "p/k1", "p/k2", "p/k3", "p/k4", "p/k5", "p/k6"));
  EXPECT_EQ(store->List("")->size(), 8u);  // the whole store prefix, and nothing else in the bucket
}

TEST(S3BlobStore, PresignedUrlsWorkWithoutCredentials) {
  auto store = OpenStore(BaseConfig(true));
  ASSERT_NE(store, nullptr);
  UrlBlobClient client;  // knows no keys

  ASSERT_TRUE(store->Put("in/input.jsonl", "0123456789abcdef").ok());
  auto read_url = store->Url("in/input.jsonl", UrlAccess::kRead, absl::Minutes(10));
  ASSERT_TRUE(read_url.ok()) << read_url.status();
  EXPECT_THAT(*read_url, ::testing::HasSubstr("X-Amz-Signature="));
  EXPECT_THAT(*read_url, ::testing::HasSubstr("X-Amz-Expires=600"));
  auto range = client.GetRange(*read_url, 3, 9);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, "345678");
  EXPECT_EQ(*client.GetRange(*read_url, 10, 16), "abcdef");
  EXPECT_EQ(*client.GetRange(*read_url, 5, 5), "");
  EXPECT_TRUE(absl::IsDataLoss(client.GetRange(*read_url, 10, 20).status()));

  auto write_url = store->Url("out/result.jsonl", UrlAccess::kWrite, absl::Minutes(10));
  ASSERT_TRUE(write_url.ok()) << write_url.status();
  ASSERT_TRUE(client.Put(*write_url, "{\"ok\":true}\n").ok());
  EXPECT_EQ(*store->Get("out/result.jsonl"), "{\"ok\":true}\n");

  auto missing = store->Url("no/such", UrlAccess::kRead, absl::Minutes(1));
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(client.GetRange(*missing, 0, 1).status()));
}

TEST(S3BlobStore, LargeStreamsUseMultipartUpload) {
  auto store = OpenStore(BaseConfig(true));
  ASSERT_NE(store, nullptr);
  // 17 chunks of 1 MiB + 12345 bytes: two full 8 MiB parts and a short last one.
  std::string expected;
  int chunks = 0;
  auto status = store->PutStream("big/output.jsonl", [&]() -> absl::StatusOr<std::string> {
    if (chunks > 17) return std::string();
    std::string chunk(chunks == 17 ? 12345 : (1 << 20), '\0');
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>((i * 31 + chunks * 7) & 0xff);
    ++chunks;
    expected += chunk;
    return chunk;
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(*store->Size("big/output.jsonl"), static_cast<int64_t>(expected.size()));
  auto got = store->Get("big/output.jsonl");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == expected) << "multipart object differs (" << got->size() << " bytes)";
  // Across the first part boundary.
  EXPECT_EQ(*store->GetRange("big/output.jsonl", (8 << 20) - 5, 10), expected.substr((8 << 20) - 5, 10));

  // A source failing after the first part leaves nothing behind (the upload is aborted).
  int sent = 0;
  auto failed = store->PutStream("big/broken", [&]() -> absl::StatusOr<std::string> {
    if (sent == 10) return absl::DataLossError("source broke");
    ++sent;
    return std::string(1 << 20, 'z');
  });
  EXPECT_TRUE(absl::IsDataLoss(failed)) << failed;
  EXPECT_TRUE(absl::IsNotFound(store->Size("big/broken").status()));
}

// Runs tests/js/minio_check.mjs; returns its stdout.
std::string RunMinioCheck(const std::string& arguments, int* exit_code) {
  std::string command = absl::StrCat(MINIONS_TEST_NODE, " ", MINIONS_TEST_JS_DIR, "/minio_check.mjs ", arguments, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return "popen failed";
  }
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(S3BlobStore, AnIndependentClientReadsAndWritesTheSameObjects) {
  S3Config config = BaseConfig(true);
  auto store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put("interop/from-minions.txt", "written by Minions").ok());
  int code = 0;
  std::string out = RunMinioCheck(
      absl::StrCat("--endpoint ", config.endpoint, " --bucket ", kBucket, " --read ", config.prefix,
                   "/interop/from-minions.txt --write ", config.prefix, "/interop/from-minio.txt --data written-by-minio"),
      &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("\"read\":\"written by Minions\""));
  EXPECT_THAT(out, ::testing::HasSubstr("\"wroteBytes\":16"));
  auto got = store->Get("interop/from-minio.txt");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "written-by-minio");
}

TEST(S3BlobStore, UnknownCredentialsArePermissionDenied) {
  S3Config config = BaseConfig(true);
  config.access_key = "NOT-A-KEY";
  auto store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  auto status = store->Put("k", "x");
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("InvalidAccessKeyId"));
}

// Retries wait on the configured clock: 20 + 40 + 80 ms of its time between four tries.
TEST(S3BlobStore, AnUnreachableEndpointIsUnavailableAfterItsRetries) {
  FakeClock clock;
  clock.AutoAdvance(true);
  S3Config config = BaseConfig(true);
  config.endpoint = "http://127.0.0.1:1";  // nothing listens there
  config.initial_backoff = absl::Milliseconds(20);
  config.clock = &clock;
  auto store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  absl::Time start = clock.Now();
  auto got = store->Get("k");
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("after 4 attempts"));
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(20 + 40 + 80));

  start = clock.Now();
  UrlBlobClient client(UrlBlobClient::Options{3, absl::Milliseconds(10), absl::Seconds(2), &clock});
  auto range = client.GetRange("http://127.0.0.1:1/b/k?X-Amz-Signature=secret", 0, 5);
  EXPECT_TRUE(absl::IsUnavailable(range.status())) << range.status();
  EXPECT_THAT(std::string(range.status().message()), ::testing::Not(::testing::HasSubstr("secret")));
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(10 + 20));
}

// A one-thread HTTP server answering each request with the next canned response.
class CannedServer {
 public:
  explicit CannedServer(std::vector<std::string> responses) : responses_(std::move(responses)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (const auto& response : responses_) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::string request;
        char buffer[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = read(c, buffer, sizeof(buffer));
          if (n <= 0) break;
          request.append(buffer, static_cast<size_t>(n));
        }
        requests_.fetch_add(1);
        (void)!write(c, response.data(), response.size());
        close(c);
      }
    });
  }
  ~CannedServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int requests() const { return requests_.load(); }

 private:
  std::vector<std::string> responses_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string CannedResponse(int status, const std::string& reason, const std::string& body,
                         const std::string& extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", extra_headers, "\r\n", body);
}

// A store against `server` whose retries back off from 10 ms on `clock`, which moves itself
// forward as they wait.
std::unique_ptr<S3BlobStore> RetryingStore(const CannedServer& server, FakeClock& clock) {
  clock.AutoAdvance(true);
  S3Config config = BaseConfig(true);
  config.endpoint = server.endpoint();
  config.initial_backoff = absl::Milliseconds(10);
  config.clock = &clock;
  return OpenStore(config);
}

TEST(S3BlobStore, ThrottlingAndServerErrorsAreRetried) {
  const std::string slow_down = CannedResponse(
      503, "Slow Down", "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");
  CannedServer server({slow_down, CannedResponse(429, "Too Many Requests", ""), CannedResponse(500, "Oops", ""),
                       CannedResponse(200, "OK", "payload")});
  FakeClock clock;
  auto store = RetryingStore(server, clock);
  ASSERT_NE(store, nullptr);
  auto got = store->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload");
  EXPECT_EQ(server.requests(), 4);
}

TEST(S3BlobStore, PersistentThrottlingIsUnavailableWithS3sMessage) {
  const std::string slow_down = CannedResponse(
      503, "Slow Down", "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");
  CannedServer server({slow_down, slow_down, slow_down, slow_down});
  FakeClock clock;
  auto store = RetryingStore(server, clock);
  ASSERT_NE(store, nullptr);
  auto status = store->Put("k", "x");
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("SlowDown"));
  EXPECT_EQ(server.requests(), 4);
}

TEST(S3BlobStore, UrlBlobClientRetriesServerErrors) {
  CannedServer server({CannedResponse(503, "Busy", ""), CannedResponse(206, "Partial Content", "23456")});
  FakeClock clock;
  clock.AutoAdvance(true);
  UrlBlobClient client(UrlBlobClient::Options{3, absl::Milliseconds(10), absl::Seconds(2), &clock});
  auto got = client.GetRange(server.endpoint() + "/b/k?X-Amz-Signature=x", 2, 7);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "23456");
}

TEST(S3BlobStore, ExpiredOrForbiddenUrlsArePermissionDenied) {
  CannedServer server({CannedResponse(403, "Forbidden",
                                    "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>")});
  UrlBlobClient client;
  auto got = client.GetRange(server.endpoint() + "/b/k?X-Amz-Signature=x", 0, 4);
  EXPECT_TRUE(absl::IsPermissionDenied(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("Request has expired"));
}

TEST(S3BlobStore, SigningUsesTheInjectedClock) {
  FakeClock clock(absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0), absl::UTCTimeZone()));
  S3Config config = BaseConfig(true);
  config.clock = &clock;
  auto store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  auto url = store->Url("k", UrlAccess::kRead, absl::Hours(1));
  ASSERT_TRUE(url.ok());
  EXPECT_THAT(*url, ::testing::HasSubstr("X-Amz-Date=20130524T000000Z"));
  EXPECT_THAT(*url, ::testing::HasSubstr("X-Amz-Credential=S3RVER%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"));
}

TEST(S3Config, FillsBlanksFromTheAwsEnvironment) {
  setenv("AWS_ACCESS_KEY_ID", "env-key", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
  setenv("AWS_SESSION_TOKEN", "env-token", 1);
  setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
  unsetenv("AWS_REGION");
  setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000", 1);
  unsetenv("AWS_ENDPOINT_URL_S3");
  S3Config from_env = S3ConfigFromEnvironment();
  EXPECT_EQ(from_env.access_key, "env-key");
  EXPECT_EQ(from_env.secret_key, "env-secret");
  EXPECT_EQ(from_env.session_token, "env-token");
  EXPECT_EQ(from_env.region, "eu-west-3");
  EXPECT_EQ(from_env.endpoint, "http://minio.internal:9000");

  S3Config explicit_config;
  explicit_config.access_key = "mine";
  explicit_config.secret_key = "mine-too";
  explicit_config.region = "ap-south-1";
  explicit_config.endpoint = "https://objects.example";
  setenv("AWS_REGION", "us-west-2", 1);
  S3Config merged = S3ConfigFromEnvironment(explicit_config);
  EXPECT_EQ(merged.access_key, "mine");
  EXPECT_EQ(merged.secret_key, "mine-too");
  EXPECT_EQ(merged.session_token, "env-token");
  EXPECT_EQ(merged.region, "ap-south-1");
  EXPECT_EQ(merged.endpoint, "https://objects.example");
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
                           "AWS_REGION", "AWS_ENDPOINT_URL"}) {
    unsetenv(name);
  }
}

TEST(S3Config, OpenRefusesIncompleteConfigurations) {
  S3Config config;
  config.access_key = "a";
  config.secret_key = "b";
  EXPECT_TRUE(absl::IsInvalidArgument(S3BlobStore::Open(config).status()));  // no bucket
  config.bucket = "b";
  config.endpoint = "ftp://x";
  EXPECT_TRUE(absl::IsInvalidArgument(S3BlobStore::Open(config).status()));
  config.endpoint = "http://host:9000/base/path";
  EXPECT_TRUE(absl::IsInvalidArgument(S3BlobStore::Open(config).status()));
  config.endpoint = "http://host:9000/";
  EXPECT_TRUE(S3BlobStore::Open(config).ok());
  config.endpoint = "";
  auto aws = S3BlobStore::Open(config);
  ASSERT_TRUE(aws.ok());
  auto url = (*aws)->Url("k/v", UrlAccess::kWrite, absl::Minutes(1));
  ASSERT_TRUE(url.ok());
  EXPECT_THAT(*url, ::testing::StartsWith("https://s3.us-east-1.amazonaws.com/b/k/v?"));
  config.access_key.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(S3BlobStore::Open(config).status()));
}

}  // namespace
}  // namespace minions::testing
