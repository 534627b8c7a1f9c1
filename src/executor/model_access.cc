#include "executor/model_access.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_util.h"

namespace minions {
namespace fs = std::filesystem;
namespace {

std::string RealOr(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  std::string normal = fs::path(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

bool Within(const std::string& path, const std::string& folder) {
  return absl::StartsWith(path, folder == "/" ? "/" : folder + "/");
}

// `path` resolved (links followed) when it is a readable regular file inside one of `folders`.
bool Loadable(const std::string& path, const std::vector<std::string>& folders, std::string* real) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return false;
  std::string r = resolved;
  bool inside = false;
  for (const std::string& folder : folders) {
    // The folder itself is resolved now, so a folder that is a link (or was made later) counts.
    inside |= Within(r, RealOr(folder));
  }
  if (!inside) return false;
  struct stat st;
  if (::stat(r.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::access(r.c_str(), R_OK) != 0) return false;
  *real = r;
  return true;
}

}  // namespace

std::string ModelAccess::UnavailableMessage(const std::string& model) {
  return absl::StrCat("model '", Excerpt(model, 200),
                      "' is not available on this executor (it loads models only from its model folders)");
}

absl::StatusOr<ModelAccess> ModelAccess::Create(const ModelAccessOptions& options) {
  ModelAccess access;
  std::vector<std::string> all = options.folders;
  if (!options.cache_dir.empty()) all.push_back(options.cache_dir);
  for (const std::string& folder : all) {
    if (folder.empty() || folder[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("model folder '", folder, "' must be an absolute path"));
    }
    access.folders_.push_back(RealOr(folder));
  }
  for (const std::string& folder : options.folders) {
    std::string normal = fs::path(folder).lexically_normal().string();
    while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
    access.configured_.push_back(normal);
  }
  return access;
}

absl::StatusOr<std::string> ModelAccess::Resolve(const std::string& model) const {
  const absl::Status refused = absl::NotFoundError(UnavailableMessage(model));
  if (model.empty() || model.find('\0') != std::string::npos || model.size() > 4096) return refused;
  std::string real;
  if (model[0] == '/') {
    if (Loadable(model, folders_, &real)) return real;
    return refused;
  }
  // A name relative to the folders: no way up.
  for (const auto& part : fs::path(model)) {
    if (part == "..") return refused;
  }
  for (const std::string& folder : folders_) {
    if (Loadable(folder + "/" + model, {folder}, &real)) return real;
  }
  return refused;
}

std::vector<std::string> ModelAccess::ReadableFolders() const {
  std::vector<std::string> out;
  for (const std::string& folder : folders_) out.push_back(RealOr(folder));
  return out;
}

std::vector<std::string> ModelAccess::ReportedFolders() const {
  std::vector<std::string> out;
  auto add = [&](const std::string& folder) {
    if (std::find(out.begin(), out.end(), folder) == out.end()) out.push_back(folder);
  };
  for (const std::string& folder : configured_) {
    add(folder);
    add(RealOr(folder));  // resolved now: a folder made (or linked) after the start counts
  }
  return out;
}

std::string ModelAccess::Describe() const {
  return folders_.empty() ? "no model folders" : absl::StrJoin(folders_, ", ");
}

}  // namespace minions
