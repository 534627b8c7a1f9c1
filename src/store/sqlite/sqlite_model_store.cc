// The ModelStore half of SqliteMetadataStore: the model registry (see model_store.h).

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/model_ref.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "store/sqlite/sqlite_statement.h"

namespace minions {
namespace {

using sqlite_store::Statement;
namespace rows = store_rows;
namespace rules = store_rules;

constexpr char kInsertModel[] =
    "INSERT INTO models (" MINIONS_STORE_MODEL_COLUMNS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
constexpr char kSelectModel[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                " FROM models WHERE team = :team AND name = :name AND digest = :digest";
constexpr char kNewestModel[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                " FROM models WHERE team = :team AND name = :name "
                                "ORDER BY created_at DESC, digest DESC LIMIT 1";
constexpr char kModelByDigest[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                  " FROM models WHERE team = :team AND digest = :digest "
                                  "ORDER BY created_at, name LIMIT 1";
constexpr char kListModels[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                               " FROM models WHERE (:team = '' OR team = :team) "
                               "ORDER BY team, name, created_at DESC, digest DESC";
constexpr char kModelsNamed[] = "SELECT " MINIONS_STORE_MODEL_COLUMNS
                                " FROM models WHERE team = :team AND name = :name AND (:digest = '' OR digest = :digest) "
                                "ORDER BY created_at DESC, digest DESC";
constexpr char kDeleteModel[] = "DELETE FROM models WHERE team = :team AND name = :name AND digest = :digest";
constexpr char kDigestNamed[] = "SELECT COUNT(*) FROM models WHERE team = :team AND digest = :digest";
// The team's jobs that have not ended and need these bytes (partial index jobs_active_by_model).
constexpr char kJobsNeedingDigest[] =
    "SELECT " MINIONS_STORE_JOB_COLUMNS " FROM jobs WHERE team = :team AND model_digest = :digest "
    "AND state NOT IN ('completed', 'failed', 'cancelled', 'expired') ORDER BY created_at, id";

absl::StatusOr<std::vector<ModelRecord>> ReadModels(Statement& query) {
  std::vector<ModelRecord> models;
  while (true) {
    ASSIGN_OR_RETURN(bool row, query.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(ModelRecord model, rows::ReadModel(query));
    models.push_back(std::move(model));
  }
  return models;
}

}  // namespace

absl::StatusOr<ModelRecord> SqliteMetadataStore::AddModel(const ModelRecord& model) {
  RETURN_IF_ERROR(rules::CheckNewModel(model));
  return InTransaction(true, [&]() -> absl::StatusOr<ModelRecord> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kSelectModel));
    query.BindText(":team", model.team).BindText(":name", model.name).BindText(":digest", model.digest);
    ASSIGN_OR_RETURN(std::vector<ModelRecord> existing, ReadModels(query));
    if (!existing.empty()) return existing.front();
    ASSIGN_OR_RETURN(Statement insert, Prepare(kInsertModel));
    RETURN_IF_ERROR(insert.BindValues(rows::ModelValues(model)).Run());
    return model;
  });
}

absl::StatusOr<ModelRecord> SqliteMetadataStore::GetModel(const std::string& team, const std::string& name,
                                                          const std::string& digest) {
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return InTransaction(false, [&]() -> absl::StatusOr<ModelRecord> {
    mu_.AssertHeld();
    const char* sql = name.empty() ? kModelByDigest : digest.empty() ? kNewestModel : kSelectModel;
    ASSIGN_OR_RETURN(Statement query, Prepare(sql));
    query.BindText(":team", team);
    if (!name.empty()) query.BindText(":name", name);
    if (!digest.empty()) query.BindText(":digest", digest);
    ASSIGN_OR_RETURN(std::vector<ModelRecord> found, ReadModels(query));
    if (found.empty()) {
      return absl::NotFoundError(absl::StrCat("team ", team, " has no model ", name, digest.empty() ? "" : "@", digest));
    }
    return found.front();
  });
}

absl::StatusOr<std::vector<ModelRecord>> SqliteMetadataStore::ListModels(const std::string& team) {
  return InTransaction(false, [&]() -> absl::StatusOr<std::vector<ModelRecord>> {
    mu_.AssertHeld();
    ASSIGN_OR_RETURN(Statement query, Prepare(kListModels));
    query.BindText(":team", team);
    return ReadModels(query);
  });
}

absl::StatusOr<RemovedModels> SqliteMetadataStore::RemoveModel(const std::string& team, const std::string& name,
                                                               const std::string& digest) {
  RETURN_IF_ERROR(ValidateModelName(name));
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return InTransaction(true, [&]() -> absl::StatusOr<RemovedModels> {
    mu_.AssertHeld();
    RemovedModels result;
    {
      ASSIGN_OR_RETURN(Statement query, Prepare(kModelsNamed));
      query.BindText(":team", team).BindText(":name", name).BindText(":digest", digest);
      ASSIGN_OR_RETURN(result.removed, ReadModels(query));
    }
    if (result.removed.empty()) {
      return absl::NotFoundError(absl::StrCat("team ", team, " has no model ", name, digest.empty() ? "" : "@", digest));
    }
    for (const ModelRecord& model : result.removed) {
      ASSIGN_OR_RETURN(Statement query, Prepare(kJobsNeedingDigest));
      query.BindText(":team", team).BindText(":digest", model.digest);
      ASSIGN_OR_RETURN(std::vector<Job> jobs, QueryJobs(query));
      RETURN_IF_ERROR(rules::CheckModelUnused(model.name, model.digest, jobs));
    }
    std::set<std::string> digests;
    for (const ModelRecord& model : result.removed) {
      ASSIGN_OR_RETURN(Statement remove, Prepare(kDeleteModel));
      remove.BindText(":team", team).BindText(":name", model.name).BindText(":digest", model.digest);
      RETURN_IF_ERROR(remove.Run());
      digests.insert(model.digest);
    }
    for (const std::string& d : digests) {
      ASSIGN_OR_RETURN(Statement count, Prepare(kDigestNamed));
      count.BindText(":team", team).BindText(":digest", d);
      ASSIGN_OR_RETURN(bool row, count.Step());
      if (row && count.Int(0) == 0) result.orphaned_digests.push_back(d);
    }
    return result;
  });
}

}  // namespace minions
