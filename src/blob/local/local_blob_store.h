#pragma once
// LocalBlobStore: the embedded default object store, a directory. Objects are files under the
// root; Put writes a temporary file and renames it into place, so readers never see half an
// object. URLs are file:// paths: executors on the same machine read and write them directly.

#include <memory>
#include <string>

#include "blob/blob_store.h"

namespace minions {

class LocalBlobStore : public BlobStore {
 public:
  // Creates the root directory if needed.
  static absl::StatusOr<std::unique_ptr<LocalBlobStore>> Open(const std::string& root);

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

  const std::string& root() const { return root_; }

 private:
  explicit LocalBlobStore(std::string root) : root_(std::move(root)) {}
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }
  std::string root_;
};

// file:// URL helpers shared with the executor's blob client.
std::string FileUrl(const std::string& absolute_path);
// The path of a file:// URL; InvalidArgument for anything else.
absl::StatusOr<std::string> FileUrlPath(const std::string& url);
// Writes a file atomically (temporary file + rename), creating parent directories.
absl::Status WriteFileAtomically(const std::string& path, std::string_view data);

}  // namespace minions
