#pragma once
// ReadWhole: an object's bytes in one string, read through the store's own Read: how each backend
// answers BlobStore::Get.

#include <string>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"

namespace minions {

absl::StatusOr<std::string> ReadWhole(BlobStore& store, const std::string& key);

}  // namespace minions
