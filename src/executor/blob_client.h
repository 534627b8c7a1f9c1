#pragma once
// BlobClient: how an executor reads its task's input and writes its outputs, by the URLs in its
// lease. It holds no object-store credentials: file:// URLs (a pool on one machine) are plain
// files; presigned https URLs (S3) are plain HTTP requests.
// Threads: thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace minions {

class BlobClient {
 public:
  virtual ~BlobClient() = default;
  // Bytes [begin, end) of the object.
  virtual absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) = 0;
  // Replaces the object with `data`.
  virtual absl::Status Put(const std::string& url, std::string_view data) = 0;
};

// file:// today; https (presigned) arrives with the S3 backend.
class UrlBlobClient : public BlobClient {
 public:
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override;
  absl::Status Put(const std::string& url, std::string_view data) override;
};

}  // namespace minions
