#pragma once
// BlobClient: how an executor reads its task's input and writes its outputs, by the URLs in its
// lease. It holds no object-store credentials: file:// URLs (a pool on one machine) are plain
// files; presigned https URLs (S3) are plain HTTP requests.
// Threads: thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/http_client.h"

namespace minions {

class BlobClient {
 public:
  virtual ~BlobClient() = default;
  // Bytes [begin, end) of the object.
  virtual absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) = 0;
  // Replaces the object with `data`.
  virtual absl::Status Put(const std::string& url, std::string_view data) = 0;
};

// file:// URLs are files; http:// and https:// URLs (presigned S3 URLs) are plain requests through
// common/http_client.h: GetRange is a GET with "Range: bytes=begin-(end-1)", Put a PUT of the body.
// Connection failures, 5xx and 429 are retried with exponential backoff on the clock, then
// Unavailable; 404 is NotFound, 403 (an expired or wrong URL) PermissionDenied, a short object
// DataLoss.
class UrlBlobClient : public BlobClient {
 public:
  struct Options {
    int max_attempts = 4;
    absl::Duration initial_backoff = absl::Milliseconds(200);
    absl::Duration connect_timeout = absl::Seconds(10);
    Clock* clock = nullptr;  // waits between retries on it; null: real time. Borrowed.
  };
  UrlBlobClient() : UrlBlobClient(Options{}) {}
  explicit UrlBlobClient(Options options);

  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override;
  absl::Status Put(const std::string& url, std::string_view data) override;

 private:
  RealClock real_clock_;  // when options.clock is null
  const HttpClient http_;
};

}  // namespace minions
