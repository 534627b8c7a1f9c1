#pragma once
// S3BlobStore: the object store on S3 or any S3-compatible server (MinIO, Ceph, R2, s3rver).
// Plain HTTP through libcurl, requests signed with SigV4 (blob/s3/sigv4.h); no AWS SDK.
// - Get/GetRange/Read: GET (with Range); Size: HEAD; List: ListObjectsV2, following continuation
//   tokens; Delete: DELETE (a missing key is fine).
// - Put: one signed PUT. PutStream: one PUT when the stream is under a part (8 MiB), otherwise a
//   multipart upload of 8 MiB parts, aborted when the source or a part fails, so no half object
//   is ever visible.
// - Url: presigned GET/PUT URLs (query-string SigV4); executors use them without credentials.
// - Errors: 404/NoSuchKey -> NotFound; 403 -> PermissionDenied with S3's message; connection
//   failures, 5xx, 429 and SlowDown are retried with exponential backoff (on the configured
//   Clock, through common/http_client.h), then Unavailable.
// Threads: thread-safe; every request uses its own curl handle.

#include <functional>
#include <memory>
#include <string>

#include "blob/blob_store.h"
#include "blob/s3/sigv4.h"
#include "common/clock.h"
#include "common/http_client.h"

namespace minions {

struct S3Config {
  // "https://s3.eu-west-3.amazonaws.com", "http://127.0.0.1:9000". Empty: AWS's regional endpoint.
  std::string endpoint;
  std::string region = "us-east-1";
  std::string bucket;
  std::string access_key, secret_key, session_token;
  // true: http://endpoint/bucket/key; false (virtual-hosted): http://bucket.endpoint/key.
  bool path_style = true;
  // Keys live under it ("" or "minions/prod": "minions/prod/<key>").
  std::string prefix;

  // Tuning; the defaults suit production.
  int max_attempts = 4;                                  // tries per request (first + retries)
  absl::Duration initial_backoff = absl::Milliseconds(100);  // doubled after each retry
  absl::Duration connect_timeout = absl::Seconds(10);
  int list_page_size = 1000;                             // max-keys per ListObjectsV2 page
  int64_t part_size = 8 << 20;                           // multipart part size (S3 minimum 5 MiB)
  // The clock that signs requests and waits between retries; null: real time. Borrowed.
  Clock* clock = nullptr;
};

// Fills what `config` leaves blank from the standard AWS variables: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, and
// AWS_REGION / AWS_DEFAULT_REGION (which replace the default region "us-east-1" too).
S3Config S3ConfigFromEnvironment(S3Config config = S3Config());

class S3BlobStore : public BlobStore {
 public:
  // Checks the configuration (no request is sent).
  static absl::StatusOr<std::unique_ptr<S3BlobStore>> Open(S3Config config);

  absl::Status Put(const std::string& key, std::string_view data) override;
  absl::Status PutStream(const std::string& key,
                         const std::function<absl::StatusOr<std::string>()>& source) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::string> GetRange(const std::string& key, int64_t offset, int64_t length) override;
  absl::Status Read(const std::string& key, const std::function<bool(std::string_view)>& sink) override;
  absl::StatusOr<int64_t> Size(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override;
  absl::Status Delete(const std::string& key) override;
  absl::StatusOr<std::string> Url(const std::string& key, UrlAccess access, absl::Duration ttl) override;

  const S3Config& config() const { return config_; }

 private:
  explicit S3BlobStore(S3Config config);
  absl::Time Now() const { return clock_->Now(); }
  std::string ObjectKey(const std::string& key) const;
  std::string PathFor(const std::string& object_key) const;  // unencoded request path
  // Sends a signed request, retrying transient failures. `sink`, when set, receives a successful
  // response's body instead of HttpClient::Response::body.
  absl::StatusOr<HttpClient::Response> Send(const std::string& method, const std::string& path, const sigv4::Pairs& query,
                                const sigv4::Pairs& extra_headers, std::string_view body,
                                const std::function<bool(std::string_view)>* sink = nullptr);
  absl::Status PutMultipart(const std::string& object_key, std::string first,
                            const std::function<absl::StatusOr<std::string>()>& source);

  S3Config config_;
  RealClock real_clock_;  // when config_.clock is null
  Clock* const clock_;
  const HttpClient http_;
  std::string scheme_;     // "http" / "https"
  std::string host_;       // host[:port] of the endpoint
};

}  // namespace minions
