// The ModelStore half of PostgresMetadataStore: the model registry (see model_store.h).
// A submit resolves its model before it creates the job, so a removal racing a submit may let
// the job in after the row has gone; the job then fails when executors cannot fetch it (the
// bytes are removed only when no name carries them). Removal itself locks the rows it removes.

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/model_ref.h"
#include "store/common/store_rows.h"
#include "store/common/store_rules.h"
#include "store/postgres/pg_connection.h"
#include "store/postgres/postgres_metadata_store.h"
#include "store/postgres/postgres_statements.h"

namespace minions {
namespace {

using postgres_store::Params;
using postgres_store::PgResult;
using postgres_store::Row;
namespace sql = postgres_store::sql;
namespace rows = store_rows;
namespace rules = store_rules;

absl::StatusOr<std::vector<ModelRecord>> ReadModels(const PgResult& result) {
  std::vector<ModelRecord> models;
  for (int i = 0; i < result.Rows(); ++i) {
    ASSIGN_OR_RETURN(ModelRecord model, rows::ReadModel(Row{result, i}));
    models.push_back(std::move(model));
  }
  return models;
}

absl::Status NoModel(const std::string& team, const std::string& name, const std::string& digest) {
  return absl::NotFoundError(absl::StrCat("team ", team, " has no model ", name, digest.empty() ? "" : "@", digest));
}

}  // namespace

absl::StatusOr<ModelRecord> PostgresMetadataStore::AddModel(const ModelRecord& model) {
  RETURN_IF_ERROR(rules::CheckNewModel(model));
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<ModelRecord> {
    RETURN_IF_ERROR(c.Exec(sql::kInsertModel, Params().Values(rows::ModelValues(model))).status());
    ASSIGN_OR_RETURN(PgResult result,
                     c.Exec(sql::kSelectModel, Params().Text(model.team).Text(model.name).Text(model.digest)));
    ASSIGN_OR_RETURN(std::vector<ModelRecord> found, ReadModels(result));
    if (found.empty()) return NoModel(model.team, model.name, model.digest);
    return found.front();
  });
}

absl::StatusOr<ModelRecord> PostgresMetadataStore::GetModel(const std::string& team, const std::string& name,
                                                            const std::string& digest) {
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<ModelRecord> {
    absl::StatusOr<PgResult> result =
        name.empty()     ? c.Exec(sql::kModelByDigest, Params().Text(team).Text(digest))
        : digest.empty() ? c.Exec(sql::kNewestModel, Params().Text(team).Text(name))
                         : c.Exec(sql::kSelectModel, Params().Text(team).Text(name).Text(digest));
    RETURN_IF_ERROR(result.status());
    ASSIGN_OR_RETURN(std::vector<ModelRecord> found, ReadModels(*result));
    if (found.empty()) return NoModel(team, name, digest);
    return found.front();
  });
}

absl::StatusOr<std::vector<ModelRecord>> PostgresMetadataStore::ListModels(const std::string& team) {
  return InTransaction(false, [&](Connection& c) -> absl::StatusOr<std::vector<ModelRecord>> {
    ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kListModels, Params().Text(team)));
    return ReadModels(result);
  });
}

absl::StatusOr<RemovedModels> PostgresMetadataStore::RemoveModel(const std::string& team, const std::string& name,
                                                                 const std::string& digest) {
  RETURN_IF_ERROR(ValidateModelName(name));
  RETURN_IF_ERROR(rules::CheckModelQuery(name, digest));
  return InTransaction(true, [&](Connection& c) -> absl::StatusOr<RemovedModels> {
    RemovedModels out;
    ASSIGN_OR_RETURN(PgResult named, c.Exec(sql::kModelsNamedForUpdate, Params().Text(team).Text(name).Text(digest)));
    ASSIGN_OR_RETURN(out.removed, ReadModels(named));
    if (out.removed.empty()) return NoModel(team, name, digest);
    for (const ModelRecord& model : out.removed) {
      ASSIGN_OR_RETURN(PgResult result, c.Exec(sql::kJobsNeedingDigest, Params().Text(team).Text(model.digest)));
      std::vector<Job> jobs;
      for (int i = 0; i < result.Rows(); ++i) {
        ASSIGN_OR_RETURN(Job job, rows::ReadJob(Row{result, i}));
        jobs.push_back(std::move(job));
      }
      RETURN_IF_ERROR(rules::CheckModelUnused(model.name, model.digest, jobs));
    }
    std::set<std::string> digests;
    for (const ModelRecord& model : out.removed) {
      RETURN_IF_ERROR(c.Exec(sql::kDeleteModel, Params().Text(team).Text(model.name).Text(model.digest)).status());
      digests.insert(model.digest);
    }
    for (const std::string& d : digests) {
      ASSIGN_OR_RETURN(PgResult count, c.Exec(sql::kDigestNamed, Params().Text(team).Text(d)));
      if (count.Rows() == 1 && Row{count, 0}.Int(0) == 0) out.orphaned_digests.push_back(d);
    }
    return out;
  });
}

}  // namespace minions
