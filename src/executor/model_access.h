#pragma once
// ModelAccess: which model files this executor may load. A job names its model; the executor
// loads it only from the folders its owner configured (`--models`, [executor] models) or from its
// model cache, by real path: symbolic links and ".." cannot lead out of them. Every refusal is the
// same message whatever the reason (outside the folders, missing, not a file, unreadable), so a
// job learns nothing about the owner's other files by naming them.
//
// A model is named by an absolute path inside a folder, or by a path relative to the folders
// (tried in order: "llama-3.2-3b.gguf" is the first folder's file of that name).
//
// Threads: immutable after Create; thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace minions {

struct ModelAccessOptions {
  std::vector<std::string> folders;  // absolute paths; they need not exist yet
  // One more folder, searched after the owner's. The executor's model cache is deliberately NOT
  // given here (apps/executor_commands.cc): registry models are reached by digest through
  // executor/model_cache.h, never by a path a job names.
  std::string cache_dir;
};

class ModelAccess {
 public:
  // InvalidArgument for a folder that is not an absolute path.
  static absl::StatusOr<ModelAccess> Create(const ModelAccessOptions& options);

  // The real path of `model` to hand to the runner; NotFound with UnavailableMessage(model) for
  // every model this executor may not or cannot load.
  absl::StatusOr<std::string> Resolve(const std::string& model) const;

  // The folders models are read from, as real paths (the runner's sandbox opens them read-only).
  std::vector<std::string> ReadableFolders() const;
  // The owner's folders as configured and as real paths (the cache left out), for the server to
  // check a job's model path against at submit (Capabilities.model_folders).
  std::vector<std::string> ReportedFolders() const;
  std::string Describe() const;

  // The one answer to a model this executor will not load.
  static std::string UnavailableMessage(const std::string& model);

 private:
  std::vector<std::string> folders_;  // configured order, cache last; real paths when they exist
  std::vector<std::string> configured_;  // the owner's folders as given, lexically normal
};

}  // namespace minions
