#include "store/postgres/postgres_metadata_store.h"

#include <utility>

#include "common/status_macros.h"
#include "store/postgres/postgres_row_store.h"

namespace minions {

absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> PostgresMetadataStore::Open(
    const std::string& conninfo, const StoreOptions& options, int pool_size, postgres_store::CommitObserver* commits) {
  ASSIGN_OR_RETURN(std::unique_ptr<PostgresRowStore> rows, PostgresRowStore::Open(conninfo, options, pool_size, commits));
  std::unique_ptr<PostgresMetadataStore> store(new PostgresMetadataStore(std::move(rows), options));
  RETURN_IF_ERROR(store->Migrate());
  return store;
}

}  // namespace minions
