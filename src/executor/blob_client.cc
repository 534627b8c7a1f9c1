#include "executor/blob_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "blob/local/local_blob_store.h"

namespace minions {

absl::StatusOr<std::string> UrlBlobClient::GetRange(const std::string& url, int64_t begin, int64_t end) {
  auto path = FileUrlPath(url);
  if (!path.ok()) return absl::UnimplementedError(absl::StrCat("cannot fetch '", url, "': only file:// URLs are supported"));
  if (begin < 0 || end < begin) return absl::InvalidArgumentError("bad byte range");
  int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("input '", *path, "' does not exist"));
    return absl::UnavailableError(absl::StrCat("cannot open '", *path, "': ", std::strerror(errno)));
  }
  std::string out(static_cast<size_t>(end - begin), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::pread(fd, out.data() + got, out.size() - got, begin + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != out.size()) {
    return absl::DataLossError(absl::StrCat("input '", *path, "' is shorter than the task's byte range"));
  }
  return out;
}

absl::Status UrlBlobClient::Put(const std::string& url, std::string_view data) {
  auto path = FileUrlPath(url);
  if (!path.ok()) return absl::UnimplementedError(absl::StrCat("cannot upload to '", url, "': only file:// URLs are supported"));
  return WriteFileAtomically(*path, data);
}

}  // namespace minions
