#include "store/sqlite/sqlite_metadata_store.h"

#include <utility>

#include "common/status_macros.h"
#include "store/sqlite/sqlite_row_store.h"

namespace minions {

absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> SqliteMetadataStore::Open(const std::string& path,
                                                                             const StoreOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteRowStore> rows, SqliteRowStore::Open(path, options));
  std::unique_ptr<SqliteMetadataStore> store(new SqliteMetadataStore(std::move(rows), options));
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

}  // namespace minions
