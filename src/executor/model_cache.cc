#include "executor/model_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "model/model_ref.h"

namespace minions {
namespace {

namespace fs = std::filesystem;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool IsHex64(const std::string& name) {
  if (name.size() != 64) return false;
  for (char c : name) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Sets the file's modification time: the cache's record of its last use.
void SetUsed(const std::string& path, absl::Time when) {
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = absl::ToUnixSeconds(when);
  times[0].tv_nsec = times[1].tv_nsec = static_cast<long>(absl::ToUnixNanos(when) % 1'000'000'000);
  (void)utimensat(AT_FDCWD, path.c_str(), times, 0);
}

absl::Time Mtime(const struct stat& st) { return absl::TimeFromTimespec(st.st_mtim); }

}  // namespace

ModelCache::FreeDisk ModelCache::StatvfsFreeDisk() {
  return [](const std::string& dir) -> absl::StatusOr<int64_t> {
    struct statvfs vfs;
    if (statvfs(dir.c_str(), &vfs) != 0) return Errno(absl::StrCat("cannot read the free space of ", dir));
    return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  };
}

ModelCache::ModelCache(ModelCacheOptions options, BlobClient* blobs, Clock* clock, FreeDisk free_disk)
    : options_(std::move(options)), blobs_(blobs), clock_(clock), free_disk_(std::move(free_disk)) {}

absl::StatusOr<std::unique_ptr<ModelCache>> ModelCache::Open(ModelCacheOptions options, BlobClient* blobs,
                                                             Clock* clock, FreeDisk free_disk) {
  if (options.dir.empty() || options.dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("the model cache needs an absolute folder, not '", options.dir, "'"));
  }
  std::error_code error;
  fs::create_directories(fs::path(options.dir) / "sha256", error);
  if (!error) fs::create_directories(fs::path(options.dir) / "partial", error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot make the model cache ", options.dir, ": ", error.message()));
  std::unique_ptr<ModelCache> cache(new ModelCache(std::move(options), blobs, clock, std::move(free_disk)));
  absl::MutexLock lock(&cache->mu_);
  RETURN_IF_ERROR(cache->Load());
  return cache;
}

absl::Status ModelCache::Load() {
  std::error_code error;
  for (const fs::directory_entry& file : fs::directory_iterator(fs::path(options_.dir) / "sha256", error)) {
    const std::string name = file.path().filename().string();
    struct stat st;
    if (!IsHex64(name) || lstat(file.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      // Not ours (or a link someone planted): never loaded, so removed.
      fs::remove_all(file.path(), error);
      continue;
    }
    entries_[name] = Entry{static_cast<int64_t>(st.st_size), Mtime(st), /*verified=*/false};
  }
  if (error) return absl::UnavailableError(absl::StrCat("cannot read the model cache ", options_.dir, ": ", error.message()));
  return absl::OkStatus();
}

std::string ModelCache::FinalPath(const std::string& hex) const { return absl::StrCat(options_.dir, "/sha256/", hex); }
std::string ModelCache::PartialPath(const std::string& hex) const { return absl::StrCat(options_.dir, "/partial/", hex); }

void ModelCache::MarkUsed(const std::string& hex) {
  const absl::Time now = clock_->Now();
  entries_[hex].used = now;
  SetUsed(FinalPath(hex), now);
}

std::vector<std::string> ModelCache::Cached() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<absl::Time, std::string>> order;
  for (const auto& [hex, entry] : entries_) order.emplace_back(entry.used, hex);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::string> digests;
  for (const auto& [used, hex] : order) digests.push_back(absl::StrCat("sha256:", hex));
  return digests;
}

int64_t ModelCache::CachedBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [hex, entry] : entries_) total += entry.size;
  return total;
}

void ModelCache::Pin(const std::string& digest) {
  absl::MutexLock lock(&mu_);
  pinned_.insert(std::string(DigestHex(digest)));
}

void ModelCache::Unpin(const std::string& digest) {
  absl::MutexLock lock(&mu_);
  auto it = pinned_.find(std::string(DigestHex(digest)));
  if (it != pinned_.end()) pinned_.erase(it);
}

absl::Status ModelCache::MakeRoom(const std::string& hex, int64_t incoming) {
  while (true) {
    int64_t cached = 0;
    for (const auto& [h, entry] : entries_) cached += entry.size;
    ASSIGN_OR_RETURN(int64_t free_bytes, free_disk_(options_.dir));
    const bool under_cap = cached + incoming <= options_.max_bytes;
    const bool above_floor = free_bytes - incoming >= options_.free_disk_floor_bytes;
    if (under_cap && above_floor) return absl::OkStatus();
    // The least recently used model that may go.
    const std::string* victim = nullptr;
    absl::Time oldest = absl::InfiniteFuture();
    for (const auto& [h, entry] : entries_) {
      if (h == hex || pinned_.count(h) > 0) continue;
      if (victim == nullptr || entry.used < oldest || (entry.used == oldest && h < *victim)) {
        victim = &h;
        oldest = entry.used;
      }
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model (", incoming, " more bytes) does not fit in this executor's model cache: ", cached,
          " bytes cached of ", options_.max_bytes, " allowed, ", free_bytes, " bytes free on disk and ",
          options_.free_disk_floor_bytes, " kept free for the owner"));
    }
    const std::string gone = *victim;
    MINIONS_LOG(Info) << "model cache: evicting sha256:" << gone << " (" << entries_[gone].size << " bytes)";
    std::error_code error;
    fs::remove(FinalPath(gone), error);
    entries_.erase(gone);
  }
}

absl::Status ModelCache::Download(const std::string& hex, int64_t size, const std::string& url,
                                  const std::function<bool()>& may_continue) {
  const std::string partial = PartialPath(hex);
  struct stat st;
  int64_t have = lstat(partial.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? static_cast<int64_t>(st.st_size) : 0;
  if (have > size) {
    std::remove(partial.c_str());
    have = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(MakeRoom(hex, size - have));
  }
  if (have > 0) MINIONS_LOG(Info) << "model cache: resuming sha256:" << hex << " at byte " << have << " of " << size;
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno(absl::StrCat("cannot write ", partial));
  absl::Status status;
  const absl::Time started = clock_->Now();
  const int64_t first = have;
  while (have < size) {
    if (may_continue && !may_continue()) {
      status = absl::UnavailableError("the model download was paused (the machine is not free); it resumes later");
      break;
    }
    const int64_t end = std::min(size, have + options_.range_bytes);
    absl::StatusOr<std::string> bytes = blobs_->GetRange(url, have, end);
    if (!bytes.ok()) {
      status = absl::UnavailableError(absl::StrCat("cannot download the model: ", bytes.status().message()));
      break;
    }
    if (bytes->empty() || static_cast<int64_t>(bytes->size()) > end - have) {
      status = absl::DataLossError(absl::StrCat("the model's URL answered ", bytes->size(), " bytes for bytes ", have,
                                                "-", end, " of ", size));
      break;
    }
    if (write(fd, bytes->data(), bytes->size()) != static_cast<ssize_t>(bytes->size())) {
      status = Errno(absl::StrCat("cannot write ", partial));
      break;
    }
    have += static_cast<int64_t>(bytes->size());
    if (options_.bytes_per_second > 0) {
      // Throttled: no faster on average than the owner allows.
      const absl::Time due =
          started + absl::Seconds(static_cast<double>(have - first) / static_cast<double>(options_.bytes_per_second));
      if (due > clock_->Now()) clock_->SleepUntil(due);
    }
  }
  if (status.ok() && fsync(fd) != 0) status = Errno(absl::StrCat("cannot sync ", partial));
  close(fd);
  if (!status.ok()) {
    if (absl::IsDataLoss(status)) std::remove(partial.c_str());
    return status;
  }
  absl::StatusOr<std::string> digest = Sha256File(partial);
  if (!digest.ok()) return digest.status();
  if (*digest != absl::StrCat("sha256:", hex)) {
    std::remove(partial.c_str());
    return absl::DataLossError(absl::StrCat("the model downloaded hashes to ", *digest, ", not sha256:", hex,
                                            "; it was deleted and will be fetched again"));
  }
  if (std::rename(partial.c_str(), FinalPath(hex).c_str()) != 0) return Errno("cannot install the model");
  absl::MutexLock lock(&mu_);
  entries_[hex] = Entry{size, clock_->Now(), /*verified=*/true};
  MINIONS_LOG(Info) << "model cache: sha256:" << hex << " installed (" << size << " bytes)";
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModelCache::Fetch(const std::string& digest, int64_t size, const std::string& url,
                                              const std::function<bool()>& may_continue) {
  RETURN_IF_ERROR(ValidateModelDigest(digest));
  if (size <= 0) return absl::InvalidArgumentError("a model to fetch has a size");
  const std::string hex(DigestHex(digest));
  absl::MutexLock one_at_a_time(&fetch_mu_);
  bool held = false, verified = false;
  int64_t held_size = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = entries_.find(hex); it != entries_.end()) {
      held = true;
      verified = it->second.verified;
      held_size = it->second.size;
    }
  }
  if (held && !verified) {
    // Held from before a restart: hashed once before its first use.
    absl::StatusOr<std::string> actual = Sha256File(FinalPath(hex));
    absl::MutexLock lock(&mu_);
    if (actual.ok() && *actual == digest && held_size == size) {
      entries_[hex].verified = true;
    } else {
      MINIONS_LOG(Warning) << "model cache: sha256:" << hex << " is damaged; fetching it again";
      std::remove(FinalPath(hex).c_str());
      entries_.erase(hex);
      held = false;
    }
  }
  if (!held) {
    if (url.empty()) return absl::UnavailableError(absl::StrCat("model ", digest, " is not cached and no URL was given"));
    RETURN_IF_ERROR(Download(hex, size, url, may_continue));
  }
  absl::MutexLock lock(&mu_);
  MarkUsed(hex);
  return FinalPath(hex);
}

}  // namespace minions
