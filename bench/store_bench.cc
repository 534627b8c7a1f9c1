// minions-bench-store: tasks leased and completed per second through the MetadataStore, side by
// side in one run (docs/benchmarks.md records the figures and the commands):
//
//   (a) SqliteMetadataStore on a temporary file;
//   (b) PostgresMetadataStore on a fresh schema of --postgres;
//   (c) a bare SKIP LOCKED claim/complete loop on the same database (another fresh schema): the
//       minimum a fenced claim/complete must do, with prepared statements and nothing else.
//
// Each variant: one job of --tasks one-record tasks, --workers threads (each one executor, with a
// connection of its own in (c) and a store pool of --workers connections in (b)) looping lease
// --batch tasks -> complete them until none is left. Only that loop is timed.
//
// The program starts no server; for a private one:
//   tests/services/postgres.sh start /tmp/minions-bench-pg 45999
//   build/apps/minions-bench-store --postgres postgresql://postgres@127.0.0.1:45999/minions_test
//   tests/services/postgres.sh stop /tmp/minions-bench-pg

#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "store/postgres/postgres_metadata_store.h"
#include "store/sqlite/sqlite_metadata_store.h"

namespace {

using minions::MetadataStore;

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "minions-bench-store: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", std::string(value.status().ToString())));
  return *std::move(value);
}

void Must(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", std::string(status.ToString())));
}

// --- libpq helpers -------------------------------------------------------------------------

class Pg {
 public:
  explicit Pg(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) Die(absl::StrCat("cannot connect to ", url, ": ", PQerrorMessage(conn_)));
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);  // DROP ... CASCADE chatter
  }
  ~Pg() { PQfinish(conn_); }
  Pg(const Pg&) = delete;
  Pg& operator=(const Pg&) = delete;

  void Exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    Check(r, sql);
    PQclear(r);
  }
  void Prepare(const char* name, const char* sql, int n_params) {
    PGresult* r = PQprepare(conn_, name, sql, n_params, nullptr);
    Check(r, sql);
    PQclear(r);
  }
  // Runs a prepared statement with text parameters; the caller PQclear()s the result.
  PGresult* Run(const char* name, const std::vector<const char*>& params) {
    PGresult* r = PQexecPrepared(conn_, name, static_cast<int>(params.size()), params.data(), nullptr, nullptr, 0);
    Check(r, name);
    return r;
  }
  int64_t Count(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    Check(r, sql);
    int64_t n = std::strtoll(PQgetvalue(r, 0, 0), nullptr, 10);
    PQclear(r);
    return n;
  }

 private:
  void Check(PGresult* r, const std::string& what) {
    ExecStatusType s = PQresultStatus(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
      Die(absl::StrCat(what, ": ", PQresultErrorMessage(r)));
    }
  }
  PGconn* conn_;
};

// A fresh schema on `base`; returns the URL whose search_path is it. Only digits and hex go into
// the name, so building the DDL from it is safe.
std::string FreshSchema(const std::string& base, const char* tag, std::vector<std::string>& made) {
  static const uint32_t salt = std::random_device{}();
  std::string schema = absl::StrCat("bench_", tag, "_", getpid(), "_", absl::Hex(salt));
  Pg admin(base);
  admin.Exec(absl::StrCat("DROP SCHEMA IF EXISTS ", schema, " CASCADE"));
  admin.Exec(absl::StrCat("CREATE SCHEMA ", schema));
  made.push_back(schema);
  const char* sep = base.find('?') == std::string::npos ? "?" : "&";
  return absl::StrCat(base, sep, "options=-csearch_path%3D", schema);
}

// --- the loops -----------------------------------------------------------------------------

struct Result {
  double seconds = 0;
  int64_t completed = 0;
  double per_second() const { return seconds > 0 ? completed / seconds : 0; }
};

// Runs `worker(w)` on `workers` threads, each returning how many tasks it completed; times them.
Result Timed(int workers, const std::function<int64_t(int)>& worker) {
  std::atomic<int64_t> completed{0};
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] { completed += worker(w); });
  }
  for (auto& t : threads) t.join();
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.completed = completed.load();
  return r;
}

// (a) and (b): one job of `tasks` one-record tasks, `workers` executors leasing `batch` at a time.
Result StoreLoop(MetadataStore& store, int tasks, int workers, int batch) {
  const absl::Duration ttl = absl::Minutes(10);
  minions::JobSpec spec;
  spec.model = "bench.gguf";
  spec.input_key = "bench/input.jsonl";
  spec.shard_size = 1;
  minions::Job job = Must(store.CreateJob(spec, absl::Now()), "CreateJob");
  std::vector<minions::Task> list(tasks);
  for (int i = 0; i < tasks; ++i) {
    list[i].job_id = job.id;
    list[i].index = i;
    list[i].first_record = i;
    list[i].n_records = 1;
    list[i].byte_begin = i * 100;
    list[i].byte_end = (i + 1) * 100;
  }
  Must(store.AddTasks(job.id, list, tasks, absl::Now()), "AddTasks");
  std::vector<std::string> executors;
  for (int w = 0; w < workers; ++w) {
    minions::ExecutorInfo info;
    info.name = absl::StrCat("bench-", w);
    info.os = "linux";
    info.memory_bytes = int64_t{64} << 30;
    info.runners = {"llama"};
    info.max_tasks = batch;
    executors.push_back(Must(store.RegisterExecutor("", info, absl::Now()), "RegisterExecutor").id);
  }
  Result r = Timed(workers, [&](int w) -> int64_t {
    int64_t done = 0;
    while (true) {
      auto leases = Must(store.LeaseTasks(executors[w], batch, ttl, absl::Now()), "LeaseTasks");
      if (leases.empty()) return done;
      std::vector<minions::LeaseProgress> reports;
      for (const auto& lease : leases) {
        reports.push_back({lease.task.job_id, lease.task.index, lease.task.attempt, 1, 0});
      }
      auto statuses = Must(store.CompleteTasks(executors[w], reports, absl::Now()), "CompleteTasks");
      for (const auto& s : statuses) {
        Must(s, "CompleteTasks (a report)");
        ++done;
      }
    }
  });
  minions::Job after = Must(store.GetJob(job.id), "GetJob");
  if (after.tasks_succeeded != tasks || r.completed != tasks) {
    Die(absl::StrCat("job ", job.id, ": ", after.tasks_succeeded, " tasks succeeded, ", r.completed,
                     " completed by the workers, expected ", tasks));
  }
  return r;
}

// (c): the bare SKIP LOCKED queue.
Result BareLoop(const std::string& url, int tasks, int workers, int batch) {
  {
    Pg setup(url);
    setup.Exec("CREATE TABLE q (id bigint PRIMARY KEY, state text NOT NULL, attempt int NOT NULL, holder text)");
    setup.Exec(absl::StrCat("INSERT INTO q SELECT g, 'pending', 0, NULL FROM generate_series(0, ", tasks - 1,
                            ") g"));
    setup.Exec("ANALYZE q");
  }
  // Connections and prepared statements are made before the clock starts.
  std::vector<std::unique_ptr<Pg>> conns;
  for (int w = 0; w < workers; ++w) {
    auto c = std::make_unique<Pg>(url);
    c->Prepare("claim_select",
               "SELECT id FROM q WHERE state = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", 1);
    c->Prepare("claim_update",
               "UPDATE q SET state = 'running', attempt = attempt + 1, holder = $1 WHERE id = ANY($2::bigint[])", 2);
    c->Prepare("complete",
               "UPDATE q SET state = 'done' WHERE id = ANY($2::bigint[]) AND holder = $1", 2);
    conns.push_back(std::move(c));
  }
  const std::string limit = std::to_string(batch);
  Result r = Timed(workers, [&](int w) -> int64_t {
    Pg& c = *conns[w];
    const std::string holder = absl::StrCat("bench-", w);
    int64_t done = 0;
    while (true) {
      c.Exec("BEGIN");
      PGresult* rows = c.Run("claim_select", {limit.c_str()});
      const int n = PQntuples(rows);
      std::vector<std::string> ids;
      for (int i = 0; i < n; ++i) ids.emplace_back(PQgetvalue(rows, i, 0));
      PQclear(rows);
      if (n == 0) {
        c.Exec("COMMIT");
        return done;
      }
      const std::string array = absl::StrCat("{", absl::StrJoin(ids, ","), "}");
      PQclear(c.Run("claim_update", {holder.c_str(), array.c_str()}));
      c.Exec("COMMIT");
      c.Exec("BEGIN");
      PGresult* updated = c.Run("complete", {holder.c_str(), array.c_str()});
      const int64_t m = std::strtoll(PQcmdTuples(updated), nullptr, 10);
      PQclear(updated);
      c.Exec("COMMIT");
      if (m != n) Die(absl::StrCat("bare loop: completed ", m, " of ", n, " claimed rows"));
      done += m;
    }
  });
  Pg check(url);
  const int64_t done = check.Count("SELECT count(*) FROM q WHERE state = 'done' AND attempt = 1");
  if (done != tasks || r.completed != tasks) {
    Die(absl::StrCat("bare loop: ", done, " rows done, ", r.completed, " completed, expected ", tasks));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Minions metadata-store benchmark: leases + completions per second"};
  std::string postgres;
  int tasks = 5000;
  int workers = 4;
  int batch = 1;
  bool skip_sqlite = false;
  app.add_option("--postgres", postgres, "libpq URL of a PostgreSQL database (required; the program starts none)")
      ->required();
  app.add_option("--tasks", tasks, "one-record tasks per variant")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--workers", workers, "threads, each one executor")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "tasks per lease call")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--skip-sqlite", skip_sqlite, "leave out variant (a)");
  CLI11_PARSE(app, argc, argv);

  printf("== metadata store: %d one-record tasks, %d workers, %d task(s) per lease, %u cores ==\n", tasks, workers,
         batch, std::thread::hardware_concurrency());
  std::vector<std::string> schemas;
  minions::StoreOptions options;

  // (c) first, then (b), then (a): the PostgreSQL variants on a server warmed the same way.
  const std::string bare_url = FreshSchema(postgres, "bare", schemas);
  Result bare = BareLoop(bare_url, tasks, workers, batch);
  printf("  (c) bare SKIP LOCKED:      %6d tasks in %7.3f s = %8.0f tasks/s\n", tasks, bare.seconds, bare.per_second());
  fflush(stdout);

  const std::string store_url = FreshSchema(postgres, "store", schemas);
  Result pg;
  {
    auto store = Must(minions::PostgresMetadataStore::Open(store_url, options, workers), "PostgresMetadataStore::Open");
    pg = StoreLoop(*store, tasks, workers, batch);
  }
  printf("  (b) PostgresMetadataStore: %6d tasks in %7.3f s = %8.0f tasks/s\n", tasks, pg.seconds, pg.per_second());
  fflush(stdout);

  Result lite;
  if (!skip_sqlite) {
    const std::string dir =
        absl::StrCat(std::filesystem::temp_directory_path().string(), "/minions-bench-store-", getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    {
      auto store = Must(minions::SqliteMetadataStore::Open(dir + "/store.db", options), "SqliteMetadataStore::Open");
      lite = StoreLoop(*store, tasks, workers, batch);
    }
    std::filesystem::remove_all(dir);
    printf("  (a) SqliteMetadataStore:   %6d tasks in %7.3f s = %8.0f tasks/s\n", tasks, lite.seconds,
           lite.per_second());
  }

  {
    Pg admin(postgres);
    for (const auto& s : schemas) admin.Exec(absl::StrCat("DROP SCHEMA IF EXISTS ", s, " CASCADE"));
  }

  printf("  (b) / (c): %.1f %% (target >= 50 %%)\n", 100.0 * pg.per_second() / bare.per_second());
  if (!skip_sqlite) printf("  (a) / (c): %.1f %%\n", 100.0 * lite.per_second() / bare.per_second());
  return 0;
}
