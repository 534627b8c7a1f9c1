#pragma once
// ModelStore: the model registry's durable half — which names a team gives to which model bytes
// (ModelRecord), and what their GGUF headers say. The bytes themselves live in the object store
// under their digest (server keys::ModelBlob). Every MetadataStore is one (metadata_store.h), so
// removing a model can check the jobs that need it in the same transaction.
//
// Contract (every implementation passes tests/store/model_store_contract.cc), as for the
// MetadataStore: each method is one transaction and takes no clock (rows carry their times).
// Errors: NotFound for an unknown model; InvalidArgument for a malformed name or digest;
// FailedPrecondition for removing a model a job still needs; Unavailable when the backend cannot
// be reached.
// Threads: implementations are thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/types.h"

namespace minions {

// What RemoveModel removed.
struct RemovedModels {
  std::vector<ModelRecord> removed;
  // Digests of `removed` no other name of the team still carries: their bytes may go.
  std::vector<std::string> orphaned_digests;
};

class ModelStore {
 public:
  virtual ~ModelStore() = default;

  // Records `model` (team, name, digest). Pushing the same name and digest again changes nothing
  // and returns the row there is (its first creation time stays).
  virtual absl::StatusOr<ModelRecord> AddModel(const ModelRecord& model) = 0;
  // The team's model `name` pinned to `digest`, or with `digest` "" its newest (latest created_at,
  // then digest). With `name` "" and a digest: any row of the team with those bytes (what a
  // second push of the same bytes finds). NotFound otherwise.
  virtual absl::StatusOr<ModelRecord> GetModel(const std::string& team, const std::string& name,
                                               const std::string& digest) = 0;
  // The team's models ("" for every team), by team, name, then newest first.
  virtual absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team) = 0;
  // Removes the team's `name` (every digest of it, or only `digest`). FailedPrecondition, naming a
  // job, while a job of the team that has not ended uses that name and digest; NotFound when there
  // is nothing to remove.
  virtual absl::StatusOr<RemovedModels> RemoveModel(const std::string& team, const std::string& name,
                                                    const std::string& digest) = 0;
};

}  // namespace minions
