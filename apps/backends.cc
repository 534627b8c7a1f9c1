#include "backends.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/private_files.h"
#include "blob/local/local_blob_store.h"
#include "blob/s3/s3_blob_store.h"
#include "store/postgres/postgres_metadata_store.h"
#include "store/postgres/postgres_watchdog_lock.h"
#include "store/postgres/postgres_work_signal.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "store/sqlite/sqlite_watchdog_lock.h"
#include "store/sqlite/sqlite_work_signal.h"

namespace minions::apps {
namespace {

bool IsPostgres(const std::string& database) {
  return absl::StartsWith(database, "postgres://") || absl::StartsWith(database, "postgresql://");
}

// The host and sslmode libpq would use for `conninfo` (its own parser); false if it cannot parse.
bool ParseConninfo(const std::string& conninfo, std::string* host, std::string* sslmode) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (options == nullptr) {
    if (error) PQfreemem(error);
    return false;
  }
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    std::string keyword = o->keyword;
    std::string value = o->val ? o->val : "";
    if (keyword == "host" || (keyword == "hostaddr" && host->empty())) {
      if (!value.empty()) *host = value;
    } else if (keyword == "sslmode") {
      *sslmode = value;
    }
  }
  PQconninfoFree(options);
  if (sslmode->empty()) {
    if (const char* env = std::getenv("PGSSLMODE"); env && *env) *sslmode = env;
  }
  if (host->empty()) {
    if (const char* env = std::getenv("PGHOST"); env && *env) *host = env;
  }
  return true;
}

// A Unix socket, or an address of this machine: TLS adds nothing there.
bool IsLocalHost(const std::string& hosts) {
  if (hosts.empty()) return true;  // the default Unix socket
  for (absl::string_view host : absl::StrSplit(hosts, ',')) {
    if (absl::StartsWith(host, "/") || absl::StartsWith(host, "@")) continue;  // socket folders
    if (host == "localhost" || absl::StartsWith(host, "127.") || host == "::1" || host == "[::1]") continue;
    return false;
  }
  return true;
}

std::string SqlitePath(const MinionsConfig& config) {
  if (absl::StartsWith(config.database, "sqlite:")) return config.database.substr(7);
  return config.data_dir + "/minions.db";
}

}  // namespace

std::string PostgresConninfo(const std::string& database) {
  std::string host, sslmode;
  if (!ParseConninfo(database, &host, &sslmode) || !sslmode.empty() || IsLocalHost(host)) return database;
  if (IsPostgres(database)) {
    const bool has_query = database.find('?') != std::string::npos;
    return absl::StrCat(database, has_query ? "&" : "?", "sslmode=require");
  }
  return absl::StrCat(database, " sslmode=require");
}

std::string PostgresTransportProblem(const std::string& database) {
  std::string host, sslmode;
  if (!ParseConninfo(database, &host, &sslmode) || IsLocalHost(host)) return "";
  if (sslmode == "disable" || sslmode == "allow" || sslmode == "prefer") {
    return absl::StrCat("store.database reaches ", host, " with sslmode=", sslmode,
                        ": its traffic (every job, token hash and result key) can be read or altered on the "
                        "network; use sslmode=verify-full with sslrootcert=<the server's CA> (or at least "
                        "sslmode=require)");
  }
  return "";
}

absl::StatusOr<Backends> OpenBackends(const MinionsConfig& config, Clock* clock) {
  Backends backends;
  // The data folder holds the database and the objects: only this account may read it.
  if (absl::Status s = MakePrivateDirectories(config.data_dir); !s.ok()) return s;
  StoreOptions store_options;
  store_options.clock = clock;
  store_options.fair_share_half_life = absl::Seconds(config.fair_share_half_life_s);
  store_options.warm_wait = absl::Milliseconds(config.warm_wait_ms);
  store_options.model_affinity = config.model_affinity;
  store_options.spot_checks = config.spot_checks;
  if (IsPostgres(config.database)) {
    auto store = PostgresMetadataStore::Open(PostgresConninfo(config.database), store_options);
    if (!store.ok()) return absl::Status(store.status().code(), absl::StrCat("database: ", store.status().message()));
    backends.store = std::move(*store);
    backends.description = "postgresql";
  } else {
    std::string path = SqlitePath(config);
    // SQLite creates its -wal and -shm files with the database file's mode: create it 0600 first.
    if (path != ":memory:") {
      if (absl::Status s = MakePrivateDirectories(std::filesystem::path(path).parent_path().string()); !s.ok()) {
        return s;
      }
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kPrivateFileMode);
      if (fd >= 0) ::close(fd);
    }
    auto store = SqliteMetadataStore::Open(path, store_options);
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
    s3.clock = clock;
    s3 = S3ConfigFromEnvironment(s3);
    auto blobs = S3BlobStore::Open(s3);
    if (!blobs.ok()) return absl::Status(blobs.status().code(), absl::StrCat("objects: ", blobs.status().message()));
    backends.blobs = std::move(*blobs);
    absl::StrAppend(&backends.description, " + ", config.objects);
    std::string prefix = s3.prefix;
    while (absl::EndsWith(prefix, "/")) prefix.pop_back();
    backends.object_store =
        absl::StrCat("s3://", s3.bucket, "/", prefix, " at ", s3.endpoint.empty() ? "aws" : s3.endpoint);
  } else {
    std::string root = config.objects.empty() ? config.data_dir + "/objects" : config.objects;
    if (absl::StartsWith(root, "file://")) root = root.substr(7);
    auto blobs = LocalBlobStore::Open(root);
    if (!blobs.ok()) return absl::Status(blobs.status().code(), absl::StrCat("objects: ", blobs.status().message()));
    backends.blobs = std::move(*blobs);
    absl::StrAppend(&backends.description, " + ", root);
    std::error_code ignored;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(std::filesystem::absolute(root), ignored);
    backends.object_store = "file:" + (canonical.empty() ? root : canonical.string());
  }
  return backends;
}

// Each backend's type converts to its interface (absl::StatusOr's converting constructor).
absl::StatusOr<std::unique_ptr<WatchdogLock>> TryAcquireWatchdog(const MinionsConfig& config) {
  if (IsPostgres(config.database)) return PostgresWatchdogLock::TryAcquire(PostgresConninfo(config.database));
  return SqliteWatchdogLock::TryAcquire(SqlitePath(config));
}

absl::StatusOr<std::unique_ptr<WorkSignal>> OpenWorkSignal(const MinionsConfig& config) {
  if (IsPostgres(config.database)) return PostgresWorkSignal::Create(PostgresConninfo(config.database));
  return SqliteWorkSignal::Open(SqlitePath(config));
}

}  // namespace minions::apps
