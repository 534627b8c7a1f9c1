#include "backends.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "blob/local/local_blob_store.h"
#include "blob/s3/s3_blob_store.h"
#include "store/postgres/postgres_metadata_store.h"
#include "store/postgres/postgres_watchdog_lock.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "watchdog/watchdog.h"

namespace minions::apps {
namespace {

bool IsPostgres(const std::string& database) {
  return absl::StartsWith(database, "postgres://") || absl::StartsWith(database, "postgresql://");
}

std::string SqlitePath(const MinionsConfig& config) {
  if (absl::StartsWith(config.database, "sqlite:")) return config.database.substr(7);
  return config.data_dir + "/minions.db";
}

}  // namespace

absl::StatusOr<Backends> OpenBackends(const MinionsConfig& config) {
  Backends backends;
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (IsPostgres(config.database)) {
    auto store = PostgresMetadataStore::Open(config.database, StoreOptions{});
    if (!store.ok()) return absl::Status(store.status().code(), absl::StrCat("database: ", store.status().message()));
    backends.store = std::move(*store);
    backends.description = "postgresql";
  } else {
    std::string path = SqlitePath(config);
    auto store = SqliteMetadataStore::Open(path, StoreOptions{});
    if (!store.ok()) return absl::Status(store.status().code(), absl::StrCat("database: ", store.status().message()));
    backends.store = std::move(*store);
    backends.description = "sqlite:" + path;
  }
  if (absl::StartsWith(config.objects, "s3://")) {
    std::string rest = config.objects.substr(5);
    S3Config s3;
    s3.bucket = rest.substr(0, rest.find('/'));
    if (rest.find('/') != std::string::npos) s3.prefix = rest.substr(rest.find('/') + 1);
    s3.endpoint = config.s3_endpoint;
    if (!config.s3_region.empty()) s3.region = config.s3_region;
    s3.path_style = config.s3_path_style;
    s3 = S3ConfigFromEnvironment(s3);
    auto blobs = S3BlobStore::Open(s3);
    if (!blobs.ok()) return absl::Status(blobs.status().code(), absl::StrCat("objects: ", blobs.status().message()));
    backends.blobs = std::move(*blobs);
    absl::StrAppend(&backends.description, " + ", config.objects);
  } else {
    std::string root = config.objects.empty() ? config.data_dir + "/objects" : config.objects;
    if (absl::StartsWith(root, "file://")) root = root.substr(7);
    auto blobs = LocalBlobStore::Open(root);
    if (!blobs.ok()) return absl::Status(blobs.status().code(), absl::StrCat("objects: ", blobs.status().message()));
    backends.blobs = std::move(*blobs);
    absl::StrAppend(&backends.description, " + ", root);
  }
  return backends;
}

absl::StatusOr<std::shared_ptr<void>> TryAcquireWatchdog(const MinionsConfig& config) {
  if (IsPostgres(config.database)) {
    auto lock = PostgresWatchdogLock::TryAcquire(config.database);
    if (!lock.ok()) return lock.status();
    return std::shared_ptr<void>(std::move(*lock));
  }
  std::string path = SqlitePath(config) + ".watchdog.lock";
  auto lock = WatchdogLock::TryAcquire(path);
  if (!lock.ok()) return lock.status();
  return std::shared_ptr<void>(std::move(*lock));
}

}  // namespace minions::apps
