#include "store/common/schema_migrator.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace minions {

absl::Status SchemaMigrator::Migrate() {
  const std::span<const store_common::Migration> migrations = store_.Migrations();
  const int latest = store_common::LatestVersion(migrations);
  // One migration per transaction; the version is read again inside each one, under the lock:
  // another process may have migrated meanwhile.
  while (true) {
    ASSIGN_OR_RETURN(bool done, RunTransaction(store_, TransactionKind::kWrite, [&](RowTransaction& t) -> absl::StatusOr<bool> {
      RETURN_IF_ERROR(t.LockSchema());
      ASSIGN_OR_RETURN(SchemaState schema, t.SchemaVersion());
      if (schema.version > latest) {
        return absl::FailedPreconditionError(absl::StrCat(
            "metadata store ", schema.where, " has schema version ", schema.version,
            " but this binary knows only up to ", latest, ": it was written by a newer minions; upgrade this binary"));
      }
      if (schema.version == latest) return true;
      const store_common::Migration& migration = migrations[schema.version];
      if (migration.version != schema.version + 1) {
        return absl::InternalError(absl::StrCat("migration list is out of order at version ", schema.version + 1));
      }
      RETURN_IF_ERROR(t.ApplyMigration(migration));
      return false;
    }));
    if (done) return absl::OkStatus();
  }
}

absl::StatusOr<int> SchemaMigrator::SchemaVersion() {
  return RunTransaction(store_, TransactionKind::kRead, [&](RowTransaction& t) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(SchemaState schema, t.SchemaVersion());
    return schema.version;
  });
}

}  // namespace minions
