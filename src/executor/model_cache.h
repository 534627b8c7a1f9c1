#pragma once
// ModelCache: the registry models this executor holds on disk, fetched by the presigned URL its
// lease carries. Nothing unverified is ever handed to a runner:
//
//   - A download goes to partial/<hex> in ranged GETs, and resumes from the bytes already there
//     (a download killed midway, or stopped because the owner came back, costs nothing done).
//   - Once complete its SHA-256 is checked; only then is it renamed into sha256/<hex> (atomic:
//     a half-written or wrong file never appears under a digest's name). A file whose bytes do not
//     hash to its digest is deleted and fetched again.
//   - After a restart the files under sha256/ are kept, and each is hashed once more before its
//     first use (a disk that changed under us, or a file someone edited, is caught there).
//
// Space: cached bytes stay under `max_bytes`, and a download never takes the disk's free space
// below the owner's floor (`free_disk_floor_bytes`, an availability setting); the least recently
// used models are evicted to make room (use = the file's mtime, set from the clock, so the order
// survives restarts); the model being fetched and those `pinned` are never evicted. A model that
// cannot fit is ResourceExhausted.
//
// Downloads go only while `may_continue` says so (the owner is away), and no faster than
// `bytes_per_second` (waits on the clock). Unavailable when stopped that way (the partial file
// stays for next time).
//
// Seams: bytes come through a BlobClient (GetRange), free disk space through `free_disk`, time
// through the Clock; tests use fakes for all three.
// Threads: thread-safe; one fetch at a time (a second Fetch waits for the first). A download holds
// no lock the other methods take: Cached() (every heartbeat) answers at once meanwhile.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "executor/blob_client.h"

namespace minions {

struct ModelCacheOptions {
  std::string dir;                                     // the cache's folder (made when missing)
  int64_t max_bytes = int64_t{64} << 30;               // cap on the cached models' bytes
  int64_t free_disk_floor_bytes = int64_t{10} << 30;   // never leave the disk with less free
  int64_t bytes_per_second = 0;                        // download throttle; 0: none
  int64_t range_bytes = int64_t{16} << 20;             // one ranged GET
};

class ModelCache {
 public:
  // Free bytes on the disk holding `dir` (statvfs in production).
  using FreeDisk = std::function<absl::StatusOr<int64_t>(const std::string& dir)>;
  static FreeDisk StatvfsFreeDisk();

  // Makes the folders and reads what the cache holds. `blobs` and `clock` are borrowed.
  static absl::StatusOr<std::unique_ptr<ModelCache>> Open(ModelCacheOptions options, BlobClient* blobs, Clock* clock,
                                                          FreeDisk free_disk = StatvfsFreeDisk());

  // The path of the verified file of `digest` ("sha256:<hex>", `size` bytes), fetched from `url`
  // when the cache lacks it. Marks it used now. Errors: InvalidArgument for a malformed digest;
  // DataLoss when the bytes fetched do not hash to the digest (they are deleted; the next Fetch
  // starts over); ResourceExhausted when it cannot fit; Unavailable when `may_continue` stopped
  // the download or the URL failed (the partial file stays).
  absl::StatusOr<std::string> Fetch(const std::string& digest, int64_t size, const std::string& url,
                                    const std::function<bool()>& may_continue = nullptr)
      ABSL_LOCKS_EXCLUDED(fetch_mu_, mu_);

  // Digests held (complete files), most recently used first: what heartbeats report.
  std::vector<std::string> Cached() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t CachedBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Models never evicted while pinned (the one a runner has loaded).
  void Pin(const std::string& digest) ABSL_LOCKS_EXCLUDED(mu_);
  void Unpin(const std::string& digest) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& dir() const { return options_.dir; }

 private:
  struct Entry {
    int64_t size = 0;
    absl::Time used;
    bool verified = false;  // hashed since this process started
  };

  ModelCache(ModelCacheOptions options, BlobClient* blobs, Clock* clock, FreeDisk free_disk);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string FinalPath(const std::string& hex) const;
  std::string PartialPath(const std::string& hex) const;
  // Evicts least recently used models until `incoming` more bytes fit under the cap and the floor.
  absl::Status MakeRoom(const std::string& hex, int64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fetches partial/HEX to its end, checks it and installs it (no mu_ held while bytes move).
  absl::Status Download(const std::string& hex, int64_t size, const std::string& url,
                        const std::function<bool()>& may_continue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  void MarkUsed(const std::string& hex) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ModelCacheOptions options_;
  BlobClient* const blobs_;
  Clock* const clock_;
  const FreeDisk free_disk_;
  absl::Mutex fetch_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one fetch at a time
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by hex digest
  std::multiset<std::string> pinned_ ABSL_GUARDED_BY(mu_);      // hex digests
};

}  // namespace minions
