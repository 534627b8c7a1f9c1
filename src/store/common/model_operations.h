#pragma once
// ModelOperations: the ModelStore half of every MetadataStore (store/model_store.h), written once
// over a RowStore (store/row_store.h): the model registry's rows. Removal locks the rows it
// removes and checks, in the same transaction, that no job of the team that has not ended needs
// them. (A submit resolves its model before it creates the job, so a removal racing a submit may
// let the job in after the row has gone; the job then fails when executors cannot fetch it: the
// bytes are removed only when no name carries them.)
// Borrows the store. Thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "store/model_store.h"
#include "store/row_store.h"

namespace minions {

class ModelOperations {
 public:
  explicit ModelOperations(RowStore& store) : store_(store) {}

  absl::StatusOr<ModelRecord> AddModel(const ModelRecord& model);
  absl::StatusOr<ModelRecord> GetModel(const std::string& team, const std::string& name, const std::string& digest);
  absl::StatusOr<std::vector<ModelRecord>> ListModels(const std::string& team);
  absl::StatusOr<RemovedModels> RemoveModel(const std::string& team, const std::string& name,
                                            const std::string& digest);

 private:
  RowStore& store_;
};

}  // namespace minions
