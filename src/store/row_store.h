#pragma once
// RowStore: the narrow interface a MetadataStore backend implements, with RowTransaction
// (store/row_transaction.h), as Ray's StoreClient is under GcsTableStorage and LevelDB's Env under
// its DB. Every MetadataStore operation — load the rows (for update), apply the pure rule of
// model/state_machines.h or store/common/store_rules.h, save — is written once above it, in
// RowMetadataStore (store/common/row_metadata_store.h); a backend only reads and writes rows, in
// its own SQL (the SQLite and PostgreSQL ones are store/sqlite/ and store/postgres/).
//
// What a backend provides:
// - RowStore::Run: a body run as one transaction, and run again from its start when the backend
//   broke it off (a lost connection, a deadlock). A body therefore keeps nothing from a run
//   before, and a backend that runs a body twice makes sure only one run committed.
// - RowTransaction: the row operations of one transaction (row_transaction.h).
// - Settling (RowStore::settling): how a backend learns that a job's last task has ended.
// - Its schema, as migrations (store/common/migration.h) SchemaMigrator applies.
// Threads: a RowStore is thread-safe.

#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/common/migration.h"
#include "store/row_transaction.h"

namespace minions {

enum class TransactionKind {
  kRead,   // reads only
  kWrite,  // reads and writes
  // A batch of heartbeats: a write, run on the backend's heartbeat connection where it keeps one
  // (PostgreSQL: its batches, committed one at a time, never wait for a connection behind leases).
  kHeartbeats,
};

// How a backend learns that a job's last task has ended (the MetadataStore contract's settling).
enum class Settling {
  // In the transaction that ended it: with one writer at a time, it sees every count (SQLite).
  kInTransaction,
  // Right after that transaction commits: transactions ending a job's last tasks at once cannot
  // see each other's counts before they commit, but the one that commits last sees them all after
  // (PostgreSQL). EndAttempts is then the last write of its transaction.
  kAfterCommit,
};

// A backend: runs transactions over its rows (see the header comment).
class RowStore {
 public:
  virtual ~RowStore() = default;
  // Runs `body` as one transaction: committed when it returns OK, rolled back otherwise (its error
  // is the answer). OK or the body's error, unless the transaction itself failed (then that).
  virtual absl::Status Run(TransactionKind kind, absl::FunctionRef<absl::Status(RowTransaction&)> body) = 0;
  virtual Settling settling() const = 0;
  // The schema's migrations, in version order (store/common/migration.h's rules).
  virtual std::span<const store_common::Migration> Migrations() const = 0;
  // Transactions the database aborted to resolve a conflict and the backend ran again
  // (MetadataStore::ConflictsRetried).
  virtual int64_t ConflictsRetried() const { return 0; }
};

// RowStore::Run for a body that answers a value: `body(t)` returns absl::Status or
// absl::StatusOr<T>, and so does this: the body's answer from the run that ended the transaction,
// or the transaction's own failure.
template <typename Body>
auto RunTransaction(RowStore& store, TransactionKind kind, Body&& body)
    -> decltype(body(std::declval<RowTransaction&>())) {
  using Result = decltype(body(std::declval<RowTransaction&>()));
  std::optional<Result> result;
  auto status_of = [](const Result& r) -> absl::Status {
    if constexpr (std::is_same_v<Result, absl::Status>) {
      return r;
    } else {
      return r.status();
    }
  };
  const absl::Status ran = store.Run(kind, [&](RowTransaction& t) -> absl::Status {
    result.emplace(body(t));
    return status_of(*result);
  });
  if (result.has_value() && ran == status_of(*result)) return *std::move(result);
  return Result(ran.ok() ? absl::InternalError("a transaction ended without an answer") : ran);
}

}  // namespace minions
