#include "blob/local/local_blob_store.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "blob_store_contract.h"

namespace minions::testing {
namespace {

std::string FreshRoot() {
  static std::atomic<int> n{0};
  auto root = std::filesystem::temp_directory_path() /
              ("minions-blob-" + std::to_string(getpid()) + "-" + std::to_string(n++));
  std::filesystem::remove_all(root);
  return root.string();
}

INSTANTIATE_TEST_SUITE_P(Local, BlobStoreContract, ::testing::Values([]() -> std::unique_ptr<BlobStore> {
                           return std::move(*LocalBlobStore::Open(FreshRoot()));
                         }));

TEST(LocalBlobStore, UrlsAreFileUrlsOfTheObject) {
  auto store = *LocalBlobStore::Open(FreshRoot());
  ASSERT_TRUE(store->Put("k/v.jsonl", "data").ok());
  auto url = store->Url("k/v.jsonl", UrlAccess::kRead, absl::Minutes(1));
  ASSERT_TRUE(url.ok());
  auto path = FileUrlPath(*url);
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, store->root() + "/k/v.jsonl");
  EXPECT_TRUE(std::filesystem::exists(*path));
  EXPECT_FALSE(FileUrlPath("https://example/x").ok());
}

}  // namespace
}  // namespace minions::testing
