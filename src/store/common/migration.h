#pragma once
// The schema's migrations, one list for every backend (migrations.cc): each migration is the SQL
// both dialects run, with placeholders for the types that differ, and the statements of a backend
// whose dialect differs. Rules: versions are 1, 2, 3, ... with no gaps; a migration that has
// shipped is never edited (a database that already applied it would not see the change) — append
// a new one instead. SchemaMigrator (schema_migrator.h) applies them.

#include <span>

namespace minions::store_common {

struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements; constant text, never built from input
};

// The SQL dialects of the backends.
enum class SqlDialect { kSqlite, kPostgres };

// All migrations, in version order, in `dialect`'s SQL. Thread-safe; the text lives as long as
// the process.
std::span<const Migration> Migrations(SqlDialect dialect);

// The newest version in a non-empty list.
inline int LatestVersion(std::span<const Migration> migrations) { return migrations.back().version; }

}  // namespace minions::store_common
