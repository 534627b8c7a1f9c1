#pragma once
// The PostgreSQL store's schema, as an ordered list of migrations. PostgresMetadataStore::Open
// applies the ones a database lacks, each in its own transaction under a transaction-scoped
// advisory lock (so servers opening one database at once do not race), and records them in
// schema_migrations(version, applied_at).
//
// Rules: store/common/migration.h.

#include <cstdint>
#include <span>

#include "store/common/migration.h"

namespace minions::postgres_store {

using Migration = store_common::Migration;

// All migrations, in version order.
std::span<const Migration> Migrations();

// The newest schema version this binary understands.
int LatestSchemaVersion();

// pg_advisory_xact_lock key held while migrating (database-wide).
inline constexpr int64_t kMigrationLockKey = 0x6d696e696f6e0001;  // "minion" 1

}  // namespace minions::postgres_store
