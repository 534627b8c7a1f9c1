#pragma once
// A schema migration, as both stores list theirs (store/sqlite/sqlite_migrations.h,
// store/postgres/postgres_migrations.h). Rules for both lists: versions are 1, 2, 3, ... with no
// gaps; a migration that has shipped is never edited (a database that already applied it would
// not see the change) — append a new one instead.

#include <span>

namespace minions::store_common {

struct Migration {
  int version;
  const char* description;
  const char* sql;  // one or more statements; constant text, never built from input
};

// The newest version in a non-empty list.
inline int LatestVersion(std::span<const Migration> migrations) { return migrations.back().version; }

}  // namespace minions::store_common
