#pragma once
// BlobStore: the object store holding job inputs, task outputs and merged results.
//
// Contract (every implementation passes tests/blob/blob_store_contract.h):
// - Keys are relative paths of [A-Za-z0-9._-] segments separated by '/'; no "..", no leading '/'.
// - Put replaces an object atomically: a reader sees the old or the new bytes, never a mix.
// - GetRange past the end returns the bytes that exist (possibly none).
// - NotFound for a missing key; InvalidArgument for a malformed key.
// - Url gives a location an executor can read or write without store credentials: file:// for a
//   local directory, a presigned https URL for S3.
// Threads: implementations are thread-safe.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions {

enum class UrlAccess { kRead, kWrite };

class BlobStore {
 public:
  virtual ~BlobStore() = default;
  virtual absl::Status Put(const std::string& key, std::string_view data) = 0;
  // Streams `source` into the object (for outputs too large to hold twice). `source` is called
  // until it returns an empty chunk.
  virtual absl::Status PutStream(const std::string& key,
                                 const std::function<absl::StatusOr<std::string>()>& source) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  virtual absl::StatusOr<std::string> GetRange(const std::string& key, int64_t offset, int64_t length) = 0;
  // Calls `sink` with consecutive chunks of the object; stops early when it returns false.
  virtual absl::Status Read(const std::string& key, const std::function<bool(std::string_view)>& sink) = 0;
  virtual absl::StatusOr<int64_t> Size(const std::string& key) = 0;
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) = 0;
  // Deleting a missing key is not an error.
  virtual absl::Status Delete(const std::string& key) = 0;
  virtual absl::StatusOr<std::string> Url(const std::string& key, UrlAccess access, absl::Duration ttl) = 0;
};

// Checks the key rules above.
absl::Status ValidateBlobKey(std::string_view key);

}  // namespace minions
