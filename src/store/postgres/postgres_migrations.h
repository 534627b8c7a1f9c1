#pragma once
// The PostgreSQL store's schema, as an ordered list of migrations. PostgresMetadataStore::Open
// applies the ones a database lacks, each in its own transaction under a transaction-scoped
// advisory lock (so servers opening one database at once do not race), and records them in
// schema_migrations(version, applied_at).
//
// Rules (as for SQLite): versions are 1, 2, 3, ... with no gaps; a migration that has shipped is
// never edited — append a new one instead.

#include <cstdint>
#include <span>

namespace minions::postgres_store {

struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements; constant text, never built from input
};

// All migrations, in version order.
std::span<const Migration> Migrations();

// The newest schema version this binary understands.
int LatestSchemaVersion();

// pg_advisory_xact_lock key held while migrating (database-wide).
inline constexpr int64_t kMigrationLockKey = 0x6d696e696f6e0001;  // "minion" 1

}  // namespace minions::postgres_store
