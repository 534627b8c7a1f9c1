#pragma once
// The concrete backends, chosen from the configuration: SQLite or PostgreSQL for metadata, a
// local directory or S3 for objects. Only apps/ knows them.

#include <memory>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "common/clock.h"
#include "config.h"
#include "store/metadata_store.h"
#include "store/watchdog_lock.h"
#include "store/work_signal.h"

namespace minions::apps {

struct Backends {
  std::unique_ptr<MetadataStore> store;
  std::unique_ptr<BlobStore> blobs;
  std::string description;  // "sqlite:/path + /path/objects", for the log
  // Where the objects are, as the servers on one database must agree on it
  // (MetadataStore::ClaimObjectStore): "file:" and the folder's canonical path, or
  // "s3://bucket/prefix at ENDPOINT" (ENDPOINT "aws" when none is configured).
  std::string object_store;
};

// The backends wait (retries, a busy database) on `clock`, which must outlive them.
absl::StatusOr<Backends> OpenBackends(const MinionsConfig& config, Clock* clock);

// The PostgreSQL connection string the processes use: `database` as given (its sslmode, or
// PGSSLMODE, is libpq's to honour), except that a server on another machine with no sslmode at all
// gets sslmode=require, so the store is never reached in plain text by default.
std::string PostgresConninfo(const std::string& database);
// Why `database` (a PostgreSQL connection string) is unsafe: a host on another machine reached
// with sslmode disable, allow or prefer (plain text, or a downgrade anyone on the path can force).
// Empty when it is fine.
std::string PostgresTransportProblem(const std::string& database);

// The right to run the watchdog: a file lock next to a SQLite database, an advisory lock on
// PostgreSQL (store/watchdog_lock.h). Unavailable when another process holds it; released when
// the lock is destroyed (or its process dies).
absl::StatusOr<std::unique_ptr<WatchdogLock>> TryAcquireWatchdog(const MinionsConfig& config);
// How the servers on the configured store tell each other of new work (store/work_signal.h).
absl::StatusOr<std::unique_ptr<WorkSignal>> OpenWorkSignal(const MinionsConfig& config);

}  // namespace minions::apps
