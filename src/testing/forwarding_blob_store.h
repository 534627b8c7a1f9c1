#pragma once
// ForwardingBlobStore: the base of the tests' object stores that change a call or two (fail it,
// hold it, count it). Header only; tests only.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "blob/blob_store.h"

namespace minions::testing {

// A blob store that forwards every call to `inner`; a test derives from it and overrides the calls
// it changes. Threads: as `inner`.
class ForwardingBlobStore : public BlobStore {
 public:
  explicit ForwardingBlobStore(BlobStore* inner) : inner_(inner) {}
  absl::Status Put(const std::string& key, std::string_view data) override { return inner_->Put(key, data); }
  absl::Status PutStream(const std::string& key, const std::function<absl::StatusOr<std::string>()>& source) override {
    return inner_->PutStream(key, source);
  }
  absl::StatusOr<std::string> Get(const std::string& key) override { return inner_->Get(key); }
  absl::StatusOr<std::string> GetRange(const std::string& key, int64_t offset, int64_t length) override {
    return inner_->GetRange(key, offset, length);
  }
  absl::Status Read(const std::string& key, const std::function<bool(std::string_view)>& sink) override {
    return inner_->Read(key, sink);
  }
  absl::StatusOr<int64_t> Size(const std::string& key) override { return inner_->Size(key); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& prefix) override { return inner_->List(prefix); }
  absl::Status Delete(const std::string& key) override { return inner_->Delete(key); }
  absl::StatusOr<std::string> Url(const std::string& key, UrlAccess access, absl::Duration ttl) override {
    return inner_->Url(key, access, ttl);
  }

 private:
  BlobStore* inner_;
};

}  // namespace minions::testing
