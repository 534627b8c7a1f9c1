#pragma once
// The SQLite store's schema, as an ordered list of migrations. SqliteMetadataStore::Open applies
// the ones a database lacks, each in its own transaction, and records them in
// schema_migrations(version, applied_at).
//
// Rules: versions are 1, 2, 3, ... with no gaps; a migration that has shipped is never edited (a
// database that already applied it would not see the change) — append a new one instead.

#include <span>

namespace minions::sqlite_store {

struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements; constant text, never built from input
};

// All migrations, in version order.
std::span<const Migration> Migrations();

// The newest schema version this binary understands.
int LatestSchemaVersion();

}  // namespace minions::sqlite_store
