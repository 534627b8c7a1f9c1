#pragma once
// The BlobStore contract: every object store (local directory, S3) passes these tests.
// A backend instantiates the suite with a factory:
//   INSTANTIATE_TEST_SUITE_P(Local, BlobStoreContract, ::testing::Values(factory));

#include <functional>
#include <memory>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "blob/blob_store.h"

namespace minions::testing {

using BlobStoreFactory = std::function<std::unique_ptr<BlobStore>()>;

class BlobStoreContract : public ::testing::TestWithParam<BlobStoreFactory> {
 protected:
  void SetUp() override { store_ = GetParam()(); }
  std::unique_ptr<BlobStore> store_;
};

TEST_P(BlobStoreContract, PutThenGetReturnsTheBytes) {
  std::string data("line one\nline two\n\0binary\xff", 27);
  ASSERT_TRUE(store_->Put("jobs/j1/input.jsonl", data).ok());
  EXPECT_EQ(*store_->Get("jobs/j1/input.jsonl"), data);
  EXPECT_EQ(*store_->Size("jobs/j1/input.jsonl"), 27);
}

TEST_P(BlobStoreContract, PutReplacesTheWholeObject) {
  ASSERT_TRUE(store_->Put("a/b", "a long first version").ok());
  ASSERT_TRUE(store_->Put("a/b", "short").ok());
  EXPECT_EQ(*store_->Get("a/b"), "short");
}

TEST_P(BlobStoreContract, RangesAreByteExactAndClampedAtTheEnd) {
  ASSERT_TRUE(store_->Put("r", "0123456789").ok());
  EXPECT_EQ(*store_->GetRange("r", 2, 3), "234");
  EXPECT_EQ(*store_->GetRange("r", 8, 100), "89");
  EXPECT_EQ(*store_->GetRange("r", 10, 5), "");
  EXPECT_EQ(*store_->GetRange("r", 0, 0), "");
}

TEST_P(BlobStoreContract, MissingObjectsAreNotFound) {
  EXPECT_TRUE(absl::IsNotFound(store_->Get("nope").status()));
  EXPECT_TRUE(absl::IsNotFound(store_->GetRange("nope", 0, 1).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Size("nope").status()));
  EXPECT_TRUE(store_->Delete("nope").ok());
}

TEST_P(BlobStoreContract, MalformedKeysAreRefused) {
  for (const char* key : {"", "/abs", "a/../b", "a//b", "a b", "trailing/", "./x"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store_->Put(key, "x"))) << "'" << key << "'";
  }
}

TEST_P(BlobStoreContract, ListReturnsKeysUnderAPrefixSorted) {
  for (const char* key : {"jobs/j1/t/2", "jobs/j1/t/10", "jobs/j1/t/1", "jobs/j2/x", "other"}) {
    ASSERT_TRUE(store_->Put(key, "x").ok());
  }
  EXPECT_THAT(*store_->List("jobs/j1/"), ::testing::ElementsAre("jobs/j1/t/1", "jobs/j1/t/10", "jobs/j1/t/2"));
  EXPECT_THAT(*store_->List("jobs/j2"), ::testing::ElementsAre("jobs/j2/x"));
  EXPECT_TRUE(store_->List("nothing/")->empty());
}

TEST_P(BlobStoreContract, DeleteRemoves) {
  ASSERT_TRUE(store_->Put("d", "x").ok());
  ASSERT_TRUE(store_->Delete("d").ok());
  EXPECT_TRUE(absl::IsNotFound(store_->Get("d").status()));
}

TEST_P(BlobStoreContract, StreamsInAndOut) {
  int chunks = 0;
  ASSERT_TRUE(store_->PutStream("s", [&]() -> absl::StatusOr<std::string> {
    if (chunks == 100) return std::string();
    return std::string(10000, static_cast<char>('a' + (chunks++ % 26)));
  }).ok());
  int64_t total = 0;
  ASSERT_TRUE(store_->Read("s", [&](std::string_view chunk) {
    total += static_cast<int64_t>(chunk.size());
    return true;
  }).ok());
  EXPECT_EQ(total, 1000000);
  // A failing source leaves no object behind.
  EXPECT_FALSE(store_->PutStream("s2", []() -> absl::StatusOr<std::string> {
    return absl::DataLossError("source broke");
  }).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->Size("s2").status()));
}

TEST_P(BlobStoreContract, ConcurrentReadersNeverSeeHalfAnObject) {
  std::string a(200000, 'a'), b(100000, 'b');
  ASSERT_TRUE(store_->Put("c", a).ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 50; ++i) (void)store_->Put("c", i % 2 ? a : b);
    stop = true;
  });
  int reads = 0;
  while (!stop) {
    auto got = store_->Get("c");
    ASSERT_TRUE(got.ok());
    ASSERT_TRUE(*got == a || *got == b) << "torn read of " << got->size() << " bytes";
    ++reads;
  }
  writer.join();
  EXPECT_GT(reads, 0);
}

TEST_P(BlobStoreContract, UrlsNameTheObject) {
  ASSERT_TRUE(store_->Put("u/v", "x").ok());
  auto read = store_->Url("u/v", UrlAccess::kRead, absl::Minutes(5));
  ASSERT_TRUE(read.ok());
  EXPECT_THAT(*read, ::testing::HasSubstr("u/v"));
  EXPECT_FALSE(store_->Url("../x", UrlAccess::kRead, absl::Minutes(5)).ok());
}

}  // namespace minions::testing
