#pragma once
// SqliteMetadataStore: the MetadataStore on one SQLite file (or ":memory:"), the embedded default
// for a single machine: every operation as RowMetadataStore writes it
// (store/common/row_metadata_store.h), over SqliteRowStore's rows (sqlite_row_store.h: WAL, one
// writer at a time, the busy timeout on the store's clock).
// - Open applies the schema migrations the file lacks (store/common/migration.h) and
//   refuses a file whose schema is newer than this binary (FailedPrecondition).
// - Errors: besides the MetadataStore contract, a database still locked by another process after
//   the busy timeout is Unavailable; a corrupt or unreadable file is Internal.
// Thread-safe: calls from any thread run one at a time.

#include <memory>
#include <string>

#include "store/common/row_metadata_store.h"

namespace minions {

class SqliteMetadataStore : public RowMetadataStore {
 public:
  // `path` is a file name (created when missing) or ":memory:" for a private in-memory database.
  static absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> Open(const std::string& path,
                                                                  const StoreOptions& options);

 private:
  using RowMetadataStore::RowMetadataStore;
};

}  // namespace minions
