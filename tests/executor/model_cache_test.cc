// The executor's model cache (executor/model_cache.h) on fakes: the bytes come from a fake
// BlobClient that can die midway or flip a byte, the disk's free space from a fake disk, time from
// the fake clock. Nothing sleeps.

#include "executor/model_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/sha256.h"
#include "testing/fake_clock.h"
#include "testing/temp_dir.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace fs = std::filesystem;

std::string DigestOf(const std::string& bytes) {
  Sha256 hash;
  hash.Update(bytes);
  return "sha256:" + hash.HexDigest();
}

std::string Model(char fill, size_t size = 1000) {
  std::string bytes(size, fill);
  for (size_t i = 0; i < size; i += 7) bytes[i] = static_cast<char>('a' + i % 26);
  return bytes;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// Serves objects by URL; records the ranges asked for. `fail_after` ranges later every request
// fails (a download killed midway); `flip` corrupts one byte of what it serves.
class FakeBlobs : public BlobClient {
 public:
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override {
    ranges.emplace_back(begin, end);
    if (fail_after >= 0 && static_cast<int>(ranges.size()) > fail_after) {
      return absl::UnavailableError("connection reset");
    }
    auto it = objects.find(url);
    if (it == objects.end()) return absl::NotFoundError("no object");
    std::string bytes = it->second.substr(begin, end - begin);
    if (flip >= begin && flip < end) bytes[flip - begin] ^= 0x20;
    return bytes;
  }
  absl::Status Put(const std::string&, std::string_view) override { return absl::UnimplementedError("read only"); }

  std::map<std::string, std::string> objects;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int fail_after = -1;
  int64_t flip = -1;
};

class ModelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("minions-cache");
    options_.dir = root_ + "/models";
    options_.max_bytes = 2500;
    options_.free_disk_floor_bytes = 0;
    options_.range_bytes = 300;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  // A disk of `disk_bytes_` whose free space is what the cache's files leave.
  ModelCache::FreeDisk FakeDisk() {
    return [this](const std::string& dir) -> absl::StatusOr<int64_t> {
      int64_t used = 0;
      for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        if (entry.is_regular_file()) used += static_cast<int64_t>(entry.file_size());
      }
      return disk_bytes_ - used;
    };
  }
  std::unique_ptr<ModelCache> Open() {
    auto cache = ModelCache::Open(options_, &blobs_, &clock_, FakeDisk());
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  }
  // Serves `bytes` at a URL of its own; returns its digest.
  std::string Serve(const std::string& bytes) {
    const std::string digest = DigestOf(bytes);
    blobs_.objects["https://s3/" + digest] = bytes;
    return digest;
  }
  absl::StatusOr<std::string> Fetch(ModelCache& cache, const std::string& bytes) {
    clock_.Advance(absl::Seconds(1));
    const std::string digest = DigestOf(bytes);
    return cache.Fetch(digest, static_cast<int64_t>(bytes.size()), "https://s3/" + digest);
  }

  std::string root_;
  ModelCacheOptions options_;
  FakeBlobs blobs_;
  testing::FakeClock clock_;
  int64_t disk_bytes_ = int64_t{1} << 30;
};

TEST_F(ModelCacheTest, ADownloadIsVerifiedInstalledAndThenServedFromDisk) {
  auto cache = Open();
  const std::string bytes = Model('x');
  const std::string digest = Serve(bytes);
  absl::StatusOr<std::string> path = Fetch(*cache, bytes);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, options_.dir + "/sha256/" + digest.substr(7));
  EXPECT_EQ(ReadAll(*path), bytes);
  EXPECT_EQ(blobs_.ranges.size(), 4u);  // 1000 bytes in ranges of 300
  EXPECT_THAT(cache->Cached(), ElementsAre(digest));
  EXPECT_EQ(cache->CachedBytes(), 1000);
  // Held: no byte is fetched again.
  blobs_.ranges.clear();
  ASSERT_TRUE(Fetch(*cache, bytes).ok());
  EXPECT_THAT(blobs_.ranges, IsEmpty());
  // Nothing half-done is left behind.
  EXPECT_TRUE(fs::is_empty(options_.dir + "/partial"));
}

TEST_F(ModelCacheTest, ADownloadKilledMidwayResumesByRange) {
  auto cache = Open();
  const std::string bytes = Model('k');
  Serve(bytes);
  blobs_.fail_after = 2;  // two ranges arrive, then the connection dies
  absl::StatusOr<std::string> path = Fetch(*cache, bytes);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(cache->Cached(), IsEmpty());  // never under its digest's name half-written
  EXPECT_EQ(fs::file_size(options_.dir + "/partial/" + DigestOf(bytes).substr(7)), 600u);

  // The executor restarts, too: the next fetch asks only for the rest.
  cache = Open();
  blobs_.fail_after = -1;
  blobs_.ranges.clear();
  path = Fetch(*cache, bytes);
  ASSERT_TRUE(path.ok()) << path.status();
  ASSERT_FALSE(blobs_.ranges.empty());
  EXPECT_EQ(blobs_.ranges.front().first, 600);
  EXPECT_EQ(ReadAll(*path), bytes);
}

TEST_F(ModelCacheTest, ACorruptedByteIsCaughtByTheDigestAndFetchedAgain) {
  auto cache = Open();
  const std::string bytes = Model('c');
  Serve(bytes);
  blobs_.flip = 517;
  absl::StatusOr<std::string> path = Fetch(*cache, bytes);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(path.status().message()), HasSubstr("hashes to"));
  EXPECT_THAT(cache->Cached(), IsEmpty());
  EXPECT_TRUE(fs::is_empty(options_.dir + "/partial"));  // the bad bytes are gone

  blobs_.flip = -1;
  blobs_.ranges.clear();
  path = Fetch(*cache, bytes);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(blobs_.ranges.front().first, 0);  // all of it again
  EXPECT_EQ(ReadAll(*path), bytes);
}

TEST_F(ModelCacheTest, ARestartKeepsTheCacheAndADamagedFileIsNeverLoaded) {
  const std::string a = Model('a'), b = Model('b');
  {
    auto cache = Open();
    Serve(a);
    Serve(b);
    ASSERT_TRUE(Fetch(*cache, a).ok());
    ASSERT_TRUE(Fetch(*cache, b).ok());
  }
  // Someone flips a byte of b on disk while the executor is down.
  {
    std::fstream file(options_.dir + "/sha256/" + DigestOf(b).substr(7), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(10);
    file.put('!');
  }
  auto cache = Open();
  EXPECT_THAT(cache->Cached(), ElementsAre(DigestOf(b), DigestOf(a)));  // most recently used first
  blobs_.ranges.clear();
  // a: checked once more, then served with no download; even without a URL.
  absl::StatusOr<std::string> path = cache->Fetch(DigestOf(a), 1000, "");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_THAT(blobs_.ranges, IsEmpty());
  // b: caught, deleted and fetched again.
  path = Fetch(*cache, b);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_FALSE(blobs_.ranges.empty());
  EXPECT_EQ(ReadAll(*path), b);
}

TEST_F(ModelCacheTest, TheLeastRecentlyUsedModelsAreEvictedToStayUnderTheCap) {
  options_.max_bytes = 2500;  // two models of 1000 fit, three do not
  auto cache = Open();
  const std::string a = Model('a'), b = Model('b'), c = Model('c'), d = Model('d');
  for (const std::string* m : {&a, &b, &c, &d}) Serve(*m);
  ASSERT_TRUE(Fetch(*cache, a).ok());
  ASSERT_TRUE(Fetch(*cache, b).ok());
  ASSERT_TRUE(Fetch(*cache, a).ok());  // a used again: b is now the least recently used
  ASSERT_TRUE(Fetch(*cache, c).ok());
  EXPECT_THAT(cache->Cached(), ElementsAre(DigestOf(c), DigestOf(a)));
  EXPECT_FALSE(fs::exists(options_.dir + "/sha256/" + DigestOf(b).substr(7)));
  // A pinned model (the one loaded) stays even when it is the oldest.
  cache->Pin(DigestOf(a));
  ASSERT_TRUE(Fetch(*cache, d).ok());
  EXPECT_THAT(cache->Cached(), ElementsAre(DigestOf(d), DigestOf(a)));
  EXPECT_LE(cache->CachedBytes(), options_.max_bytes);
  // A model larger than the cap cannot fit at all.
  const std::string huge = Model('h', 3000);
  Serve(huge);
  EXPECT_EQ(Fetch(*cache, huge).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ModelCacheTest, TheOwnersFreeDiskFloorIsNeverCrossed) {
  options_.max_bytes = int64_t{1} << 30;  // the cap is no limit here; the disk is
  options_.free_disk_floor_bytes = 1500;
  disk_bytes_ = 3600;  // room for two models above the floor
  auto cache = Open();
  const std::string a = Model('a'), b = Model('b'), c = Model('c');
  for (const std::string* m : {&a, &b, &c}) Serve(*m);
  ASSERT_TRUE(Fetch(*cache, a).ok());
  ASSERT_TRUE(Fetch(*cache, b).ok());
  // A third would leave 600 bytes free: the oldest goes first.
  ASSERT_TRUE(Fetch(*cache, c).ok());
  EXPECT_THAT(cache->Cached(), ElementsAre(DigestOf(c), DigestOf(b)));
  // With everything pinned there is no room, and the owner's floor wins.
  cache->Pin(DigestOf(b));
  cache->Pin(DigestOf(c));
  absl::StatusOr<std::string> path = Fetch(*cache, a);
  EXPECT_EQ(path.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(path.status().message()), HasSubstr("kept free for the owner"));
}

TEST_F(ModelCacheTest, ADownloadStopsWhileTheOwnerIsBackAndResumesLater) {
  auto cache = Open();
  const std::string bytes = Model('o');
  const std::string digest = Serve(bytes);
  int ranges_allowed = 2;
  absl::StatusOr<std::string> path =
      cache->Fetch(digest, 1000, "https://s3/" + digest, [&] { return ranges_allowed-- > 0; });
  EXPECT_EQ(path.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(blobs_.ranges.size(), 2u);
  blobs_.ranges.clear();
  path = cache->Fetch(digest, 1000, "https://s3/" + digest, [] { return true; });
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(blobs_.ranges.front().first, 600);
}

TEST_F(ModelCacheTest, ThrottledDownloadsWaitOnTheClock) {
  options_.bytes_per_second = 300;  // one range a second
  auto cache = Open();
  const std::string bytes = Model('t');
  const std::string digest = Serve(bytes);
  const absl::Time start = clock_.Now();
  std::thread fetch([&] { ASSERT_TRUE(cache->Fetch(digest, 1000, "https://s3/" + digest).ok()); });
  // The fetch waits on the fake clock after each of its four ranges (300 bytes a second of 1000);
  // time moves only when it waits.
  for (int range = 0; range < 4; ++range) {
    ASSERT_TRUE(clock_.AwaitWaiters(1));
    EXPECT_THAT(cache->Cached(), IsEmpty());  // not before its last range
    clock_.Advance(absl::Seconds(1));
  }
  fetch.join();
  EXPECT_THAT(cache->Cached(), ElementsAre(digest));
  EXPECT_EQ(clock_.Now() - start, absl::Seconds(4));
}

TEST_F(ModelCacheTest, StrangeFilesInTheCacheAreNeverServed) {
  fs::create_directories(options_.dir + "/sha256");
  const std::string bytes = Model('s');
  const std::string digest = Serve(bytes);
  // A link planted under a digest's name, and a file that is not a digest.
  fs::create_symlink("/etc/passwd", options_.dir + "/sha256/" + digest.substr(7));
  std::ofstream(options_.dir + "/sha256/notes.txt") << "hi";
  auto cache = Open();
  EXPECT_THAT(cache->Cached(), IsEmpty());
  absl::StatusOr<std::string> path = Fetch(*cache, bytes);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_FALSE(fs::is_symlink(*path));
  EXPECT_EQ(ReadAll(*path), bytes);
  EXPECT_EQ(cache->Fetch("sha256:xyz", 10, "u").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace minions
