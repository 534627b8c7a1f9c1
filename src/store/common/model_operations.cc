#include "store/common/model_operations.h"

#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/model_ref.h"
#include "store/common/store_rules.h"

namespace minions {
namespace {

namespace rules = store_rules;

absl::Status NoModel(const std::string& team, const std::string& name, const std::string& digest) {
  return absl::NotFoundError(absl::StrCat("team ", team, " has no model ", name, digest.empty() ? "" : "@", digest));
}

}  // namespace

absl::StatusOr<ModelRecord> ModelOperations::AddModel(const ModelRecord& model) {
  RETURN_IF_ERROR(rules::CheckNewModel(model));
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<ModelRecord> {
    // The same name and digest again changes nothing: the row there is stands.
    absl::Status inserted = t.Insert(RowWrites{.models = {model}});
    if (!absl::IsAlreadyExists(inserted)) {
      RETURN_IF_ERROR(inserted);
      return model;
    }
    ASSIGN_OR_RETURN(std::vector<ModelRecord> found, t.ModelsNamed(model.team, model.name, model.digest, Locking::kNone));
    if (found.empty()) return NoModel(model.team, model.name, model.digest);
    return found.front();
  });
}

absl::StatusOr<ModelRecord> ModelOperations::GetModel(const std::string& team, const std::string& name,
                                                      const std::string& digest) {
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<ModelRecord> {
    std::optional<ModelRecord> found;
    if (name.empty()) {
      ASSIGN_OR_RETURN(found, t.ModelWithDigest(team, digest));
    } else {
      // Pinned to `digest`, or the newest.
      ASSIGN_OR_RETURN(std::vector<ModelRecord> named, t.ModelsNamed(team, name, digest, Locking::kNone));
      if (!named.empty()) found = std::move(named.front());
    }
    if (!found) return NoModel(team, name, digest);
    return *std::move(found);
  });
}

absl::StatusOr<std::vector<ModelRecord>> ModelOperations::ListModels(const std::string& team) {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) { return t.ListModels(team); });
}

absl::StatusOr<RemovedModels> ModelOperations::RemoveModel(const std::string& team, const std::string& name,
                                                           const std::string& digest) {
  RETURN_IF_ERROR(ValidateModelName(name));
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<RemovedModels> {
    RemovedModels out;
    ASSIGN_OR_RETURN(out.removed, t.ModelsNamed(team, name, digest, Locking::kLock));
    if (out.removed.empty()) return NoModel(team, name, digest);
    for (const ModelRecord& model : out.removed) {
      ASSIGN_OR_RETURN(std::vector<Job> jobs, t.ActiveJobsNeedingModel(team, model.digest));
      RETURN_IF_ERROR(rules::CheckModelUnused(model.name, model.digest, jobs));
    }
    std::set<std::string> digests;
    for (const ModelRecord& model : out.removed) {
      RETURN_IF_ERROR(t.DeleteModel(model));
      digests.insert(model.digest);
    }
    for (const std::string& d : digests) {
      ASSIGN_OR_RETURN(int64_t still_named, t.CountModelsWithDigest(team, d));
      if (still_named == 0) out.orphaned_digests.push_back(d);
    }
    return out;
  });
}

}  // namespace minions
