#include "blob/local/local_blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "blob/read_whole.h"
#include "common/private_files.h"
#include "common/status_macros.h"

namespace minions {
namespace fs = std::filesystem;

namespace {

std::atomic<uint64_t> g_tmp_counter{0};

std::string TempPathFor(const std::string& path) {
  return absl::StrCat(path, ".tmp-", getpid(), "-", g_tmp_counter.fetch_add(1));
}

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

// Writes all of `data` to `fd`.
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// The object `key` stored at `path`, opened to read: its descriptor; InvalidArgument for a
// malformed key, NotFound when it is missing.
absl::StatusOr<int> OpenToRead(const std::string& key, const std::string& path) {
  RETURN_IF_ERROR(ValidateBlobKey(key));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no object '", key, "'"));
    return IoError("cannot open", path);
  }
  return fd;
}

// `call` (a read of the descriptor), again while a signal interrupts it: what it returned.
template <typename Call>
ssize_t Retrying(Call call) {
  ssize_t n;
  do {
    n = call();
  } while (n < 0 && errno == EINTR);
  return n;
}

// The buffer for reading the object open at `fd`: its size (a little more, so that one read
// also meets the end), at least a page and at most 1 MiB.
size_t ReadBufferSize(int fd) {
  constexpr size_t kPage = 4096, kMost = 1 << 20;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size < 0) return kMost;
  return std::clamp<size_t>(static_cast<size_t>(st.st_size) + 1, kPage, kMost);
}

absl::Status WriteFileFrom(const std::string& path,
                           const std::function<absl::StatusOr<std::string>()>& source) {
  // Objects are a team's data: folders 0700, files 0600 (common/private_files.h).
  if (absl::Status s = MakePrivateDirectories(fs::path(path).parent_path().string()); !s.ok()) return s;
  std::string tmp = TempPathFor(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, kPrivateFileMode);
  if (fd < 0) return IoError("cannot create", tmp);
  while (true) {
    auto chunk = source();
    if (!chunk.ok()) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return chunk.status();
    }
    if (chunk->empty()) break;
    if (!WriteAll(fd, *chunk)) {
      absl::Status s = IoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (::close(fd) != 0) {
    absl::Status s = IoError("cannot close", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = IoError("cannot rename into", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::string FileUrl(const std::string& absolute_path) { return "file://" + absolute_path; }

absl::StatusOr<std::string> FileUrlPath(const std::string& url) {
  if (!absl::StartsWith(url, "file:///")) {
    return absl::InvalidArgumentError(absl::StrCat("not a file:// URL: '", url, "'"));
  }
  return url.substr(7);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view data) {
  bool sent = false;
  return WriteFileFrom(path, [&]() -> absl::StatusOr<std::string> {
    if (sent) return std::string();
    sent = true;
    return std::string(data);
  });
}

absl::StatusOr<std::unique_ptr<LocalBlobStore>> LocalBlobStore::Open(const std::string& root) {
  if (absl::Status s = MakePrivateDirectories(root); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot create the object store's folder: ", s.message()));
  }
  std::error_code ec;
  std::string absolute = fs::absolute(root, ec).lexically_normal().string();
  while (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
  return std::unique_ptr<LocalBlobStore>(new LocalBlobStore(absolute));
}

absl::Status LocalBlobStore::Put(const std::string& key, std::string_view data) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  return WriteFileAtomically(PathOf(key), data);
}

absl::Status LocalBlobStore::PutStream(const std::string& key,
                                       const std::function<absl::StatusOr<std::string>()>& source) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  return WriteFileFrom(PathOf(key), source);
}

absl::StatusOr<std::string> LocalBlobStore::Get(const std::string& key) { return ReadWhole(*this, key); }

absl::StatusOr<std::string> LocalBlobStore::GetRange(const std::string& key, int64_t offset, int64_t length) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  if (offset < 0 || length < 0) return absl::InvalidArgumentError("negative range");
  const std::string path = PathOf(key);
  ASSIGN_OR_RETURN(const int fd, OpenToRead(key, path));
  // Only the bytes that exist are allocated: a caller may ask past the end.
  struct stat st{};
  if (::fstat(fd, &st) == 0) length = std::clamp<int64_t>(st.st_size - offset, 0, length);
  std::string out(static_cast<size_t>(length), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = Retrying([&] { return ::pread(fd, out.data() + got, out.size() - got, offset + static_cast<off_t>(got)); });
    if (n < 0) {
      absl::Status s = IoError("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

absl::Status LocalBlobStore::Read(const std::string& key, const std::function<bool(std::string_view)>& sink) {
  const std::string path = PathOf(key);
  ASSIGN_OR_RETURN(const int fd, OpenToRead(key, path));
  // The buffer fits the object (up to 1 MiB a piece) and is not zero-filled: the server reads
  // every chunk a completion reports through here, most of them a few hundred bytes, and a
  // zero-filled 1 MiB buffer per read was a measurable share of the control plane's CPU per task
  // (docs/benchmarks.md, "Control plane vs peers").
  const size_t capacity = ReadBufferSize(fd);
  std::unique_ptr<char[]> buffer(new char[capacity]);
  while (true) {
    ssize_t n = Retrying([&] { return ::read(fd, buffer.get(), capacity); });
    if (n < 0) {
      absl::Status s = IoError("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    if (!sink(std::string_view(buffer.get(), static_cast<size_t>(n)))) break;
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LocalBlobStore::Size(const std::string& key) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  std::error_code ec;
  auto size = fs::file_size(PathOf(key), ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return absl::NotFoundError(absl::StrCat("no object '", key, "'"));
    return absl::InternalError(absl::StrCat("cannot stat '", key, "': ", ec.message()));
  }
  return static_cast<int64_t>(size);
}

absl::StatusOr<std::vector<std::string>> LocalBlobStore::List(const std::string& prefix) {
  std::vector<std::string> keys;
  std::error_code ec;
  // Walk only the deepest directory the prefix names.
  std::string dir = root_;
  auto slash = prefix.rfind('/');
  if (slash != std::string::npos) dir = root_ + "/" + prefix.substr(0, slash);
  if (!fs::exists(dir, ec)) return keys;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    std::string key = it->path().string().substr(root_.size() + 1);
    if (key.find(".tmp-") != std::string::npos) continue;  // a Put in progress
    if (absl::StartsWith(key, prefix)) keys.push_back(std::move(key));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list '", prefix, "': ", ec.message()));
  std::sort(keys.begin(), keys.end());
  return keys;
}

absl::Status LocalBlobStore::Delete(const std::string& key) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  std::error_code ec;
  fs::remove(PathOf(key), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot delete '", key, "': ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalBlobStore::Url(const std::string& key, UrlAccess, absl::Duration) {
  if (auto s = ValidateBlobKey(key); !s.ok()) return s;
  return FileUrl(PathOf(key));
}

}  // namespace minions
