#include "common/private_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace minions {

absl::Status MakePrivateDirectories(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::filesystem::path whole = std::filesystem::path(path).lexically_normal();
  std::filesystem::path sofar;
  for (const auto& part : whole) {
    sofar /= part;
    if (part.empty() || part == "/") continue;
    if (::mkdir(sofar.c_str(), kPrivateDirMode) == 0) {
      // mkdir applies the umask; a private folder is private whatever it is.
      ::chmod(sofar.c_str(), kPrivateDirMode);
      continue;
    }
    if (errno == EEXIST) {
      struct stat st;
      if (::stat(sofar.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return absl::InternalError(absl::StrCat("cannot create folder '", path, "': '", sofar.string(),
                                              "' exists and is not a folder"));
    }
    return absl::InternalError(absl::StrCat("cannot create folder '", sofar.string(), "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WritePrivateFile(const std::string& path, std::string_view data) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path target(path);
  if (target.has_parent_path()) {
    if (absl::Status s = MakePrivateDirectories(target.parent_path().string()); !s.ok()) return s;
  }
  std::string tmp = absl::StrCat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, kPrivateFileMode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  ::fchmod(fd, kPrivateFileMode);
  bool ok = true;
  while (ok && !data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  std::string error = ok ? "" : std::strerror(errno);
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = std::strerror(errno);
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    error = std::strerror(errno);
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write '", path, "': ", error));
  }
  return absl::OkStatus();
}

void UsePrivateUmask() { ::umask(077); }

}  // namespace minions
