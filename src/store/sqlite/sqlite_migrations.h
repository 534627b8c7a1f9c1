#pragma once
// The SQLite store's schema, as an ordered list of migrations. SqliteMetadataStore::Open applies
// the ones a database lacks, each in its own transaction, and records them in
// schema_migrations(version, applied_at).
//
// Rules: store/common/migration.h.

#include <span>

#include "store/common/migration.h"

namespace minions::sqlite_store {

using Migration = store_common::Migration;

// All migrations, in version order.
std::span<const Migration> Migrations();

// The newest schema version this binary understands.
int LatestSchemaVersion();

}  // namespace minions::sqlite_store
