#include "blob/blob_store.h"

#include "absl/strings/str_cat.h"
#include "blob/read_whole.h"

namespace minions {

absl::Status ValidateBlobKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("empty object key");
  if (key.size() > 1024) return absl::InvalidArgumentError("object key longer than 1024 bytes");
  if (key.front() == '/' || key.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("object key '", std::string(key), "' starts or ends with '/'"));
  }
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view segment = key.substr(start, end - start);
    if (segment.empty() || segment == "." || segment == "..") {
      return absl::InvalidArgumentError(absl::StrCat("object key '", std::string(key), "' has an empty, '.' or '..' segment"));
    }
    for (char c : segment) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                c == '_' || c == '-';
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat("object key '", std::string(key), "' has a character outside [A-Za-z0-9._-/]"));
      }
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWhole(BlobStore& store, const std::string& key) {
  std::string out;
  absl::Status read = store.Read(key, [&](std::string_view chunk) {
    out.append(chunk);
    return true;
  });
  if (!read.ok()) return read;
  return out;
}

}  // namespace minions
