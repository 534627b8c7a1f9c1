#pragma once
// The start of most tests of the server's parts: a SQLite store in memory, a local object store in
// a fresh folder (dir_/blobs), and the fake clock. A test's own SetUp calls this one first.

#include <memory>

#include "blob/local/local_blob_store.h"
#include "server_test_util.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"

namespace minions::testing {

class StoreAndBlobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    ASSERT_OK_AND_ASSIGN(blobs_, LocalBlobStore::Open(dir_.File("blobs")));
  }

  TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<LocalBlobStore> blobs_;
};

}  // namespace minions::testing
