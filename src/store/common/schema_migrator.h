#pragma once
// SchemaMigrator: the one migration runner of every backend. It applies the migrations
// (RowStore::Migrations, store/common/migration.h) a database lacks, one per transaction, each
// under the backend's schema lock (RowTransaction::LockSchema: servers opening one database at
// once migrate it once), reading the version again inside each transaction, and refuses a database
// whose schema is newer than this binary (FailedPrecondition naming the database and both
// versions).
// Borrows the store. Thread-safe (one process's migrations run one at a time through the lock).

#include "absl/status/statusor.h"
#include "store/row_store.h"

namespace minions {

class SchemaMigrator {
 public:
  explicit SchemaMigrator(RowStore& store) : store_(store) {}

  // Applies the missing migrations.
  absl::Status Migrate();
  // The schema version of the database (the highest migration applied).
  absl::StatusOr<int> SchemaVersion();

 private:
  RowStore& store_;
};

}  // namespace minions
