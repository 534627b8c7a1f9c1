#pragma once
// The fleet simulator's PostgreSQL (minions-bench-fleet, fleet_sim.cc): a private cluster and a
// sampler of what its backends wait for.

#include <array>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <libpq-fe.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench_util.h"
#include "testing/process_pool.h"

namespace minions::bench::fleet_sim {

// PostgreSQL: a private cluster (tests/services/postgres.sh) in DIR/pg, one database per point.
class Postgres {
 public:
  explicit Postgres(std::string dir) : dir_(std::move(dir)), port_(minions::testing::PickFreePort()) {}
  ~Postgres() {
    std::string out;
    (void)minions::bench::RunProgram({Script(), "stop", dir_}, dir_ + "-stop.log", out);
  }
  absl::Status Start() {
    std::string out;
    return minions::bench::RunProgram({Script(), "start", dir_, absl::StrCat(port_)}, dir_ + "-start.log", out);
  }
  std::string Url(const std::string& db) const { return absl::StrCat("postgresql://postgres@127.0.0.1:", port_, "/", db); }
  absl::Status Exec(const std::string& db, const std::string& sql, std::string* value = nullptr) {
    PGconn* c = PQconnectdb(Url(db).c_str());
    absl::Status status;
    if (PQstatus(c) != CONNECTION_OK) {
      status = absl::UnavailableError(PQerrorMessage(c));
    } else {
      PGresult* r = PQexec(c, sql.c_str());
      if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        status = absl::InternalError(PQresultErrorMessage(r));
      } else if (value != nullptr && PQntuples(r) > 0) {
        *value = PQgetvalue(r, 0, 0);
      }
      PQclear(r);
    }
    PQfinish(c);
    return status;
  }
  // Transactions committed or rolled back in `db` so far (pg_stat_database; flushed about once a second).
  double Transactions(const std::string& db) {
    std::string value;
    if (!Exec(db, absl::StrCat("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '", db, "'"),
              &value)
             .ok() ||
        value.empty()) {
      return -1;
    }
    return std::stod(value);
  }
  pid_t postmaster() const {
    std::string pidfile = minions::bench::Slurp(dir_ + "/data/postmaster.pid");
    return pidfile.empty() ? 0 : static_cast<pid_t>(std::stol(pidfile));
  }

 private:
  static std::string Script() { return std::string(MINIONS_SOURCE_DIR) + "/tests/services/postgres.sh"; }
  std::string dir_;
  int port_;
};

// What PostgreSQL's backends are doing, sampled every 20 ms from pg_stat_activity while a phase
// runs (--pg-waits): each sample is the active statements of `db` with what each waits for
// ("CPU" when it waits for nothing), so a heartbeat tail can be told apart as a lock wait
// (Lock:transactionid, Lock:tuple), the disk (IO, LWLock:WALWrite) or the CPU. A tool for
// finding out, not a figure the issue asks for.
class PgWaitSampler {
 public:
  // `cpu` reads the CPU seconds so far of: the whole machine, the server, the simulator.
  using CpuReader = std::function<std::array<double, 3>()>;
  PgWaitSampler(const std::string& url, const std::string& db, CpuReader cpu) : db_(db), cpu_(std::move(cpu)) {
    conn_ = PQconnectdb(url.c_str());
    if (PQstatus(conn_) != CONNECTION_OK) {
      fprintf(stderr, "--pg-waits: %s", PQerrorMessage(conn_));
      return;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~PgWaitSampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
  }
  // Prints the tally of the samples in [from, to), most frequent first, as the mean number of
  // backends in each state at a sample.
  void Print(const std::string& prefix, absl::Time from, absl::Time to) const {
    std::map<std::string, int64_t> tally;
    int64_t samples = 0;
    const Sample* first = nullptr;
    const Sample* last = nullptr;
    for (const Sample& sample : samples_) {
      if (sample.at < from || sample.at >= to) continue;
      ++samples;
      if (first == nullptr) first = &sample;
      last = &sample;
      for (const std::string& what : sample.active) ++tally[what];
    }
    if (first != nullptr && last != first) {
      const double s = absl::ToDoubleSeconds(last->at - first->at);
      const auto d = [&](int i) { return (last->cpu[i] - first->cpu[i]) / s; };
      printf("%s cores busy: the machine %.2f of %u; the server %.2f; the simulator %.2f; the rest (PostgreSQL, the "
             "kernel, steal) %.2f\n",
             prefix.c_str(), d(0), std::thread::hardware_concurrency(), d(1), d(2), d(0) - d(1) - d(2));
    }
    std::vector<std::pair<int64_t, std::string>> sorted;
    for (const auto& [what, count] : tally) sorted.emplace_back(count, what);
    std::sort(sorted.rbegin(), sorted.rend());
    printf("%s %lld samples of PostgreSQL's active backends (mean per sample):\n", prefix.c_str(),
           static_cast<long long>(samples));
    for (size_t i = 0; i < sorted.size() && i < 12; ++i) {
      printf("%s   %5.2f  %s\n", prefix.c_str(), samples > 0 ? static_cast<double>(sorted[i].first) / samples : 0.0,
             sorted[i].second.c_str());
    }
  }

 private:
  struct Sample {
    absl::Time at;
    std::array<double, 3> cpu;  // CpuReader's
    std::vector<std::string> active;
  };
  void Loop() {
    const std::string sql = absl::StrCat(
        "SELECT CASE WHEN state = 'active' THEN '' ELSE 'in transaction, ' END || "
        "coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') || '  ' || "
        "left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity "
        "WHERE state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid() AND datname = '", db_, "'");
    while (!stop_.load()) {
      Sample sample{absl::Now(), cpu_(), {}};
      PGresult* r = PQexec(conn_, sql.c_str());
      if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        for (int i = 0; i < PQntuples(r); ++i) sample.active.emplace_back(PQgetvalue(r, i, 0));
      } else if (!warned_) {
        warned_ = true;
        fprintf(stderr, "--pg-waits: %s", PQresultErrorMessage(r));
      }
      PQclear(r);
      samples_.push_back(std::move(sample));
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::string db_;
  CpuReader cpu_;
  PGconn* conn_ = nullptr;
  bool warned_ = false;  // the sampler thread's
  std::atomic<bool> stop_{false};
  std::vector<Sample> samples_;  // the sampler thread's until Stop
  std::thread thread_;
};

}  // namespace minions::bench::fleet_sim
