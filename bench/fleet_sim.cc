// minions-bench-fleet: the fleet simulator (issue 15). N simulated executors in a few worker
// processes this program starts (--procs; one per 2,500 executors by default), each executor
// speaking the real executor protocol over gRPC to one real `minions server` (SQLite, or a
// private PostgreSQL cluster this program starts): enrolment with a join token, Register, an
// Attach presence stream held open, a heartbeat (on a Beats stream; --beat-stream false: a
// Heartbeat call each) every TTL/3 while it holds a lease and, while it
// holds none, as often as the server says at registration (1.5 TTL by default; a lease brings the
// next one forward), and long-poll Leases (wait --lease-wait-ms, 30 s, as the
// executor's defaults). Like the executor, it leases a prefetch window of tasks (enough for half a
// second beyond the running one: 6 of 100 ms; at least 2) and asks for more once half of it is
// free. Each leased task is run, one at a time, by a fake runner: its input
// range is read through the lease's URL, it "runs" for --task-ms, and one output line per record
// is written to the attempt's chunk URL before the task is completed, as a real executor does
// (the server checks the chunk). Each point of the fleet size runs two phases:
//   idle   the fleet waits with no work for --idle-s seconds (after --warmup-s)
//   job    one job of --job-tasks one-record tasks is submitted; measured until it completes
// and reports, per phase: heartbeat latency p50/p99 (client side, call to reply), lease latency
// p50/p99 (Lease calls that got a task: call, or the phase's start if later, to reply; and submit
// to the first lease), tasks per
// second, the server's CPU (share of one core) and RSS, the store's CPU (PostgreSQL's processes;
// SQLite runs inside the server) and PostgreSQL's transactions per second (pg_stat_database).
// --server-arg passes an option to the server (repeatable) and --label names the run, so that
// two settings can run side by side, interleaved by the caller (docs/benchmarks.md).
//
//   minions-bench-fleet --executors 100 1000 3000 --store sqlite postgres [--ttl-ms 9000]
//                       [--channels 0] [--idle-s 18] [--job-tasks 2000] [--task-ms 200]
//
// Each simulated executor has a gRPC channel (one TCP connection) of its own unless --channels
// caps them (then executors share channels round-robin). Mind `ulimit -n`: the server and each
// worker hold one descriptor per connection.
// Threads (in each worker): gRPC's callback threads drive the calls; one timer thread fires
// heartbeats and task ends; --run-threads threads do the fake runner's file I/O. The parent
// starts the server and PostgreSQL, submits the job and merges the workers' samples.

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cmath>
#include <deque>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <libpq-fe.h>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench_util.h"
#include "fleet_postgres.h"
#include "simulated_fleet.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "cli/credentials.h"
#include "executor/blob_client.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "runner/batch_record.h"
#include "testing/http_get.h"
#include "testing/process_pool.h"
#include "testing/prometheus_text.h"

namespace {

namespace fs = std::filesystem;
using minions::Subprocess;
using minions::bench::BinDir;
using minions::bench::CpuSeconds;
namespace v1 = minions::v1;

using minions::bench::CpuDelta;
using minions::bench::MachineCpuSeconds;
using minions::bench::RssMiB;
using minions::bench::TreeCpu;
using minions::bench::fleet_sim::Fleet;
using minions::bench::fleet_sim::PgWaitSampler;
using minions::bench::fleet_sim::Postgres;
using minions::bench::fleet_sim::Samples;
using minions::bench::fleet_sim::SimOptions;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// --- the server and its store ---

struct Flags {
  std::vector<int> executors = {100, 1000};
  std::vector<std::string> stores = {"sqlite", "postgres"};
  int64_t ttl_ms = 9000;
  int64_t lease_wait_ms = 30000;
  bool idle_polls = true;
  bool beat_stream = true;
  int channels = 0;
  double warmup_s = 0;  // 0: one TTL
  double idle_s = 18;
  double window_s = 10;  // the heartbeat tail of a long phase, by window of this many seconds
  int job_tasks = 2000;
  int64_t task_ms = 200;
  double task_spread = 0;
  int run_threads = 4;
  int enrol_threads = 8;
  int procs = 0;  // processes of simulated executors; 0: one per kExecutorsPerProcess
  bool pg_waits = false;  // sample pg_stat_activity in the job phase (PgWaitSampler)
  std::string dir;
  std::string label = "default";
  std::vector<std::string> server_args;
  // A worker (--worker): executors [first, first + count) of the fleet, against `server`.
  bool worker = false;
  std::string server;
  int first = 0;
  int count = 0;
};

constexpr int kExecutorsPerProcess = 2500;

// --- the fleet in several processes ---
//
// RunPoint starts --procs workers (this program with --worker), each simulating a slice of the
// fleet in a Fleet of its own, and speaks to each over its stdin and stdout, a line at a time:
//   parent "token T"   worker enrols its executors with join token T, answers "enrolled" ("failed
//                      WHY" and exits when it cannot)
//   parent "start"     (once every worker has enrolled) worker registers, attaches and starts its
//                      executors, answers "ready"
//   parent "measure"   worker starts its samples (Fleet::Measure), answers "ok"
//   parent "take"      worker answers its samples (SamplesText) and "end"
//   parent "stop", or the end of its stdin: the worker ends its calls and exits.
// The samples' times are wall-clock times, which every process here shares.

std::string SamplesText(const Samples& s) {
  std::string out = absl::StrCat("counts ", s.heartbeats_failed, " ", s.beats_unsent, " ", s.leases_lost, " ",
                                 s.cancels_done, " ",
                                 s.completed, " ", s.complete_failed, "\n");
  for (size_t i = 0; i < s.heartbeat_ms.size(); ++i) {
    absl::StrAppend(&out, "h ", s.heartbeat_ms[i], " ", absl::ToUnixMicros(s.heartbeat_at[i]), "\n");
  }
  for (double ms : s.lease_ms) absl::StrAppend(&out, "l ", ms, "\n");
  for (absl::Time at : s.leased_at) absl::StrAppend(&out, "a ", absl::ToUnixMicros(at), "\n");
  return out + "end\n";
}

// Adds one line of SamplesText to `into`; false for a line it does not know.
bool AddSampleLine(const std::string& line, Samples& into) {
  long long a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
  double ms = 0;
  if (sscanf(line.c_str(), "counts %lld %lld %lld %lld %lld %lld", &a, &b, &c, &d, &e, &f) == 6) {
    into.heartbeats_failed += a;
    into.beats_unsent += b;
    into.leases_lost += c;
    into.cancels_done += d;
    into.completed += e;
    into.complete_failed += f;
  } else if (sscanf(line.c_str(), "h %lf %lld", &ms, &a) == 2) {
    into.heartbeat_ms.push_back(ms);
    into.heartbeat_at.push_back(absl::FromUnixMicros(a));
  } else if (sscanf(line.c_str(), "l %lf", &ms) == 1) {
    into.lease_ms.push_back(ms);
  } else if (sscanf(line.c_str(), "a %lld", &a) == 1) {
    into.leased_at.push_back(absl::FromUnixMicros(a));
  } else {
    return false;
  }
  return true;
}

SimOptions OptionsOf(const Flags& flags) {
  SimOptions options;
  options.ttl = absl::Milliseconds(flags.ttl_ms);
  options.lease_wait = absl::Milliseconds(flags.lease_wait_ms);
  options.idle_polls = flags.idle_polls;
  options.beat_stream = flags.beat_stream;
  options.task_time = absl::Milliseconds(flags.task_ms);
  options.task_spread = flags.task_spread;
  return options;
}

// A worker's life (main with --worker): see above. Exit status 0 after "stop".
int WorkerMain(const Flags& flags) {
  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("token ", 0) != 0) {
    printf("failed no join token on stdin\n");
    return 2;
  }
  const std::string join_token = line.substr(6);
  const int n = flags.count;
  Fleet fleet(OptionsOf(flags), flags.run_threads);
  const int channels = flags.channels > 0 ? std::min(flags.channels, n) : n;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args = minions::rpc::ChannelArgs(minions::rpc::ChannelUse::kExecutor);
    args.SetInt("minions.fleet_sim.channel", i);  // a connection of its own (no shared subchannel)
    fleet.AddStub(v1::Executors::NewStub(
        grpc::CreateCustomChannel(flags.server, grpc::InsecureChannelCredentials(), args)));
  }
  // Enrolment, on a few threads (a fleet does it once; not measured).
  std::vector<std::pair<std::string, std::string>> enrolled(static_cast<size_t>(n));
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> enrolers;
  for (int t = 0; t < flags.enrol_threads; ++t) {
    enrolers.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        v1::EnrolRequest request;
        request.mutable_capabilities()->set_name(absl::StrCat("sim-", flags.first + i));
        v1::EnrolResponse reply;
        grpc::ClientContext context;
        minions::rpc::Prepare(context, join_token, absl::Seconds(60));
        grpc::Status s = fleet.StubFor(i)->Enrol(&context, request, &reply);
        if (!s.ok()) {
          if (++failed <= 3) fprintf(stderr, "enrol: %s\n", s.error_message().c_str());
          continue;
        }
        enrolled[static_cast<size_t>(i)] = {reply.executor_id(), reply.credential()};
      }
    });
  }
  for (auto& t : enrolers) t.join();
  if (failed > 0) {
    printf("failed %d executors could not enrol\n", failed.load());
    fflush(stdout);
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    fleet.Add(flags.first + i, enrolled[static_cast<size_t>(i)].first, enrolled[static_cast<size_t>(i)].second);
  }
  // The fleet starts once every worker has enrolled its executors: Enrol is answered by the
  // server's synchronous threads, which a fleet's Register calls, all at once, would exhaust.
  printf("enrolled\n");
  fflush(stdout);
  if (!std::getline(std::cin, line) || line != "start") return 0;
  fleet.Start();
  for (int i = 0; i < 1200 && (fleet.registered() < n || fleet.attached() < n); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (fleet.registered() < n || fleet.attached() < n) {
    fprintf(stderr, "worker of executors %d-%d: %d registered and %d attached of %d after 60 s; measuring anyway\n",
            flags.first, flags.first + n - 1, fleet.registered(), fleet.attached(), n);
  }
  printf("ready\n");
  fflush(stdout);
  while (std::getline(std::cin, line) && line != "stop") {
    if (line == "measure") {
      fleet.Measure();
      printf("ok\n");
    } else if (line == "take") {
      const std::string text = SamplesText(fleet.Take());
      fwrite(text.data(), 1, text.size(), stdout);
    } else {
      printf("failed unknown command %s\n", line.c_str());
    }
    fflush(stdout);
  }
  fleet.Stop();
  return 0;
}

// The parent's side: the workers of one point. Threads: one (RunPoint's).
class SimProcesses {
 public:
  ~SimProcesses() { Stop(); }

  // Starts `procs` workers that share `n` executors out, and waits until each is ready.
  absl::Status Start(const Flags& flags, const std::string& server, const std::string& join_token, int n, int procs) {
    for (int p = 0; p < procs; ++p) {
      const int first = n * p / procs, count = n * (p + 1) / procs - first;
      const int channels = flags.channels > 0 ? std::max(1, flags.channels * count / n) : 0;
      minions::Subprocess::Options sp;
      sp.argv = {minions::CurrentExecutablePath(), "--worker", "--server", server, "--first", absl::StrCat(first),
                 "--count", absl::StrCat(count), "--ttl-ms", absl::StrCat(flags.ttl_ms), "--lease-wait-ms",
                 absl::StrCat(flags.lease_wait_ms), "--idle-polls", flags.idle_polls ? "true" : "false",
                 "--beat-stream", flags.beat_stream ? "true" : "false", "--task-ms", absl::StrCat(flags.task_ms),
                 "--task-spread", absl::StrCat(flags.task_spread),
                 "--run-threads", absl::StrCat(flags.run_threads), "--channels", absl::StrCat(channels),
                 "--enrol-threads", absl::StrCat(std::max(2, flags.enrol_threads / procs))};
      auto started = minions::Subprocess::Start(sp);
      if (!started.ok()) return started.status();
      workers_.push_back(std::move(*started));
      if (auto s = workers_.back()->Write(absl::StrCat("token ", join_token, "\n")); !s.ok()) return s;
    }
    for (const char* step : {"enrolled", "ready"}) {
      for (auto& w : workers_) {
        auto line = w->ReadLine(absl::Minutes(5));
        if (!line.ok()) return absl::UnavailableError(absl::StrCat("a worker did not start: ", line.status().message()));
        if (*line != step) return absl::InternalError(absl::StrCat("a worker: ", *line));
      }
      if (std::string(step) == "enrolled") {
        for (auto& w : workers_) {
          if (auto s = w->Write("start\n"); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // Every worker starts its samples.
  bool Measure() { return Ask("measure", [](const std::string& line) { return line == "ok"; }); }

  // Every worker's samples since Measure, merged into `into`.
  bool Take(Samples& into) {
    into = Samples{};
    return Ask("take", [&into](const std::string& line) {
      if (line == "end") return true;
      if (!AddSampleLine(line, into)) fprintf(stderr, "a worker's samples: cannot read \"%s\"\n", line.c_str());
      return false;
    });
  }

  // CPU seconds of this process and its workers so far.
  double CpuSeconds() const {
    double total = minions::bench::CpuSeconds(getpid());
    for (const auto& w : workers_) total += minions::bench::CpuSeconds(w->pid());
    return total;
  }

  void Stop() {
    for (auto& w : workers_) (void)w->Write("stop\n");
    for (auto& w : workers_) {
      if (!w->Wait(absl::Seconds(60)).ok()) w->Signal(SIGKILL);
    }
    workers_.clear();
  }

 private:
  // Sends `command` to every worker (all first, so they answer at once), then reads each one's
  // lines until `last` says its answer is over.
  bool Ask(const std::string& command, const std::function<bool(const std::string&)>& last) {
    for (auto& w : workers_) {
      if (!w->Write(command + "\n").ok()) {
        fprintf(stderr, "a worker is gone (%s)\n", command.c_str());
        return false;
      }
    }
    for (auto& w : workers_) {
      for (;;) {
        auto line = w->ReadLine(absl::Minutes(2));
        if (!line.ok()) {
          fprintf(stderr, "a worker did not answer %s: %s\n", command.c_str(), std::string(line.status().message()).c_str());
          return false;
        }
        if (line->rfind("failed ", 0) == 0) {
          fprintf(stderr, "a worker: %s\n", line->c_str());
          return false;
        }
        if (last(*line)) break;
      }
    }
    return true;
  }

  std::vector<std::unique_ptr<minions::Subprocess>> workers_;
};

// The server's own heartbeat times (minions_heartbeat_seconds, scraped from its /metrics): the
// cumulative count of each bucket, by upper bound in seconds (+Inf last).
struct ServerHeartbeats {
  std::vector<std::pair<double, double>> buckets;
  bool ok() const { return !buckets.empty(); }
};

ServerHeartbeats ScrapeServerHeartbeats(const std::string& http, const std::string& token) {
  ServerHeartbeats out;
  minions::testing::HttpReply reply =
      minions::testing::HttpGet(absl::StrCat("http://", http, "/metrics"), 10000, {"Authorization: Bearer " + token});
  if (reply.status != 200) return out;
  for (const auto& [name, value] : minions::testing::ParsePrometheusSamples(reply.body)) {
    const std::string prefix = "minions_heartbeat_seconds_bucket{le=\"";
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string le = name.substr(prefix.size(), name.size() - prefix.size() - 2);
    out.buckets.emplace_back(le == "+Inf" ? HUGE_VAL : std::stod(le), value);
  }
  std::sort(out.buckets.begin(), out.buckets.end());
  return out;
}

// The `q` quantile of the heartbeats answered between two scrapes, as the upper bound (ms) of the
// bucket it falls in (-1: none answered).
double ServerQuantileMs(const ServerHeartbeats& from, const ServerHeartbeats& to, double q) {
  if (!from.ok() || !to.ok() || from.buckets.size() != to.buckets.size()) return -1;
  const double total = to.buckets.back().second - from.buckets.back().second;
  if (total <= 0) return -1;
  for (size_t i = 0; i < to.buckets.size(); ++i) {
    if (to.buckets[i].second - from.buckets[i].second >= q * total) return 1000 * to.buckets[i].first;
  }
  return HUGE_VAL;
}

struct PhaseReport {
  std::string phase;
  double seconds = 0;
  Samples samples;
  double server_cpu = 0;  // cores
  double store_cpu = -1;  // cores; -1: inside the server (SQLite)
  double sim_cpu = 0;     // cores: this simulator's (its clients share the machine with the server)
  double xacts_per_s = -1;
  double server_rss = 0;
  double tasks_per_s = 0;
  double first_lease_ms = -1;
};

// A phase's heartbeat latencies (ms) by window of `window_s` from its first heartbeat's answer.
std::map<int64_t, std::vector<double>> HeartbeatWindows(const Samples& s, double window_s) {
  std::map<int64_t, std::vector<double>> windows;
  if (s.heartbeat_at.empty()) return windows;
  const absl::Time first = *std::min_element(s.heartbeat_at.begin(), s.heartbeat_at.end());
  for (size_t i = 0; i < s.heartbeat_at.size(); ++i) {
    windows[static_cast<int64_t>(absl::ToDoubleSeconds(s.heartbeat_at[i] - first) / window_s)].push_back(s.heartbeat_ms[i]);
  }
  return windows;
}

void Print(const Flags& flags, const std::string& store, int n, const PhaseReport& r) {
  const auto& s = r.samples;
  printf("%-10s %-8s %6d %-5s %6.1f | hb n=%-6zu p50 %7.2f p99 %8.2f fail %lld unsent %lld lost %lld (%lld done) | completions failed %lld | lease n=%-5zu "
         "p50 %7.2f p99 %8.2f first %7.1f | tasks/s %7.1f | server %5.1f%% %6.0f MiB | store %s | xact/s %s | sim %.0f%%\n",
         flags.label.c_str(), store.c_str(), n, r.phase.c_str(), r.seconds, s.heartbeat_ms.size(),
         Percentile(s.heartbeat_ms, 0.5), Percentile(s.heartbeat_ms, 0.99), static_cast<long long>(s.heartbeats_failed),
         static_cast<long long>(s.beats_unsent), static_cast<long long>(s.leases_lost),
         static_cast<long long>(s.cancels_done), static_cast<long long>(s.complete_failed), s.lease_ms.size(), Percentile(s.lease_ms, 0.5),
         Percentile(s.lease_ms, 0.99), r.first_lease_ms, r.tasks_per_s, 100 * r.server_cpu, r.server_rss,
         r.store_cpu < 0 ? "(in server)" : absl::StrCat(static_cast<int>(100 * r.store_cpu + 0.5), "%").c_str(),
         r.xacts_per_s < 0 ? "-" : absl::StrCat(static_cast<int64_t>(r.xacts_per_s + 0.5)).c_str(), 100 * r.sim_cpu);
  // A long phase: where its heartbeat tail is (a storm of leases or completions, or throughout).
  if (r.seconds >= 20 && !s.heartbeat_at.empty()) {
    const auto windows = HeartbeatWindows(s, flags.window_s);
    printf("%-10s %-8s %6d %-5s heartbeats by %g s from the first: n / p50 / p99 ms:", flags.label.c_str(),
           store.c_str(), n, r.phase.c_str(), flags.window_s);
    for (const auto& [w, ms] : windows) printf("  %zu / %.0f / %.0f", ms.size(), Percentile(ms, 0.5), Percentile(ms, 0.99));
    printf("\n");
  }
  fflush(stdout);
}

// The window of Print's (by `window_s` from the first heartbeat) whose heartbeat p99 is highest.
std::optional<std::pair<absl::Time, absl::Time>> WorstWindow(const Samples& s, double window_s) {
  if (s.heartbeat_at.empty()) return std::nullopt;
  const absl::Time first = *std::min_element(s.heartbeat_at.begin(), s.heartbeat_at.end());
  auto windows = HeartbeatWindows(s, window_s);
  int64_t worst = windows.begin()->first;
  for (const auto& [w, ms] : windows) {
    if (Percentile(ms, 0.99) > Percentile(windows[worst], 0.99)) worst = w;
  }
  const absl::Time from = first + absl::Seconds(window_s * static_cast<double>(worst));
  return std::make_pair(from, from + absl::Seconds(window_s));
}

std::string LoadAverage() {
  std::string load = minions::bench::Slurp("/proc/loadavg");
  return load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1));
}

// A point's server: a fresh `minions server` on the point's store, with /metrics on a port of its
// own (the server's side of the heartbeat times, ScrapeServerHeartbeats).
struct PointServer {
  std::string dir;
  std::string db;  // the point's PostgreSQL database (when the store is postgres)
  std::string http;
  minions::cli::Connection connection;
  std::unique_ptr<Subprocess> process;
  pid_t postmaster = 0;  // PostgreSQL's, when the store is postgres
};

// Starts the point's server and waits until it answers; false (and a message) when it cannot.
bool StartServer(const Flags& flags, const std::string& store, int n, Postgres* pg, int point, PointServer& server) {
  server.dir = absl::StrCat(flags.dir, "/", flags.label, "-", store, "-", n);
  fs::remove_all(server.dir);
  fs::create_directories(server.dir);
  server.db = absl::StrCat("fleet_", getpid(), "_", point);
  server.http = absl::StrCat("127.0.0.1:", minions::testing::PickFreePort());
  server.connection.server = absl::StrCat("127.0.0.1:", minions::testing::PickFreePort());
  std::vector<std::string> argv = {BinDir() + "/minions", "server", "--listen", server.connection.server,
                                   "--http-listen", server.http, "--data-dir", server.dir + "/server",
                                   "--lease-ttl-ms", absl::StrCat(flags.ttl_ms)};
  if (store == "postgres") {
    if (auto s = pg->Exec("postgres", "CREATE DATABASE " + server.db); !s.ok()) {
      fprintf(stderr, "create database: %s\n", std::string(s.message()).c_str());
      return false;
    }
    argv.insert(argv.end(), {"--database", pg->Url(server.db)});
    server.postmaster = pg->postmaster();
  }
  argv.insert(argv.end(), flags.server_args.begin(), flags.server_args.end());
  server.process = minions::bench::SpawnLogged(argv, server.dir + "/server.log");
  if (!server.process) return false;
  minions::cli::Connection& connection = server.connection;
  for (int i = 0; i < 600; ++i) {
    if (connection.token.empty()) {
      auto token = minions::cli::ReadTokenFile(server.dir + "/server/admin-token");
      if (token.ok()) connection.token = *token;
    }
    if (!connection.token.empty() && minions::cli::JobsClient(connection).List("", 1).ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// Measures a phase's use of the machine: the server's, the simulator's and the store's CPU from
// its construction to Finish, and PostgreSQL's transactions.
class PhaseMeter {
 public:
  PhaseMeter(const PointServer& server, Postgres* pg, SimProcesses& fleet)
      : server_(server),
        pg_(pg),
        fleet_(fleet),
        cpu0_(CpuSeconds(server.process->pid())),
        sim0_(fleet.CpuSeconds()),
        store0_(TreeCpu(server.postmaster)),
        x0_(server.postmaster > 0 ? pg->Transactions(server.db) : 0),
        start_(absl::Now()) {}
  absl::Time start() const { return start_; }
  void Finish(PhaseReport& r) const {
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    r.server_cpu = (CpuSeconds(server_.process->pid()) - cpu0_) / r.seconds;
    r.sim_cpu = (fleet_.CpuSeconds() - sim0_) / r.seconds;
    r.server_rss = RssMiB(server_.process->pid());
    if (server_.postmaster > 0) {
      r.store_cpu = CpuDelta(store0_, TreeCpu(server_.postmaster)) / r.seconds;
      r.xacts_per_s = (pg_->Transactions(server_.db) - x0_) / r.seconds;
    }
  }

 private:
  const PointServer& server_;
  Postgres* pg_;
  SimProcesses& fleet_;
  const double cpu0_, sim0_;
  const std::map<pid_t, double> store0_;
  const double x0_;
  const absl::Time start_;
};

// The same heartbeats seen by the simulated executors and by the server, before the job's first
// tasks end and after.
void PrintHeartbeatsAroundTheEnd(const Flags& flags, const std::string& store, int n, const PhaseReport& r,
                                 absl::Time start, absl::Time end_part, const ServerHeartbeats& at_start,
                                 const ServerHeartbeats& before_end, const ServerHeartbeats& at_end) {
  std::vector<double> client_before, client_after;
  for (size_t i = 0; i < r.samples.heartbeat_at.size(); ++i) {
    (r.samples.heartbeat_at[i] < end_part ? client_before : client_after).push_back(r.samples.heartbeat_ms[i]);
  }
  printf("%-10s %-8s %6d %-5s heartbeats before the first tasks end (%.0f s), executors' p50 / p99 ms: %.1f / %.1f; "
         "the server's (bucket bounds): %.0f / %.0f | after: %.1f / %.1f; the server's %.0f / %.0f\n",
         flags.label.c_str(), store.c_str(), n, r.phase.c_str(), absl::ToDoubleSeconds(end_part - start),
         Percentile(client_before, 0.5), Percentile(client_before, 0.99), ServerQuantileMs(at_start, before_end, 0.5),
         ServerQuantileMs(at_start, before_end, 0.99), Percentile(client_after, 0.5), Percentile(client_after, 0.99),
         ServerQuantileMs(before_end, at_end, 0.5), ServerQuantileMs(before_end, at_end, 0.99));
}

// The idle phase: the fleet waits with no work. False when the workers fail.
bool RunIdlePhase(const Flags& flags, const std::string& store, int n, const PointServer& server, Postgres* pg,
                  SimProcesses& fleet) {
  PhaseReport r;
  r.phase = "idle";
  if (!fleet.Measure()) return false;
  const PhaseMeter meter(server, pg, fleet);
  absl::SleepFor(absl::Seconds(flags.idle_s));
  if (!fleet.Take(r.samples)) return false;
  meter.Finish(r);
  Print(flags, store, n, r);
  return true;
}

// The job phase: one job of --job-tasks one-record tasks, measured until it ends. True when it
// completed and measured something.
bool RunJobPhase(const Flags& flags, const std::string& store, int n, const PointServer& server, Postgres* pg,
                 SimProcesses& fleet) {
  PhaseReport r;
  r.phase = "job";
  std::string input;
  for (int i = 0; i < flags.job_tasks; ++i) absl::StrAppend(&input, R"({"custom_id":"t)", i, R"(","prompt":"x"})", "\n");
  v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(BinDir() + "/minions");  // any file: the fake runner loads nothing
  request.set_shard_size(1);
  minions::cli::JobsClient client(server.connection);
  const std::string& token = server.connection.token;
  // The server's heartbeat times: at the start, just before the first tasks end (the job's end
  // is its heaviest part), and at the end. Three scrapes, so as not to weigh on what they measure.
  ServerHeartbeats at_start = ScrapeServerHeartbeats(server.http, token), before_end, at_end;
  std::unique_ptr<PgWaitSampler> waits;
  if (flags.pg_waits && pg != nullptr) {
    waits = std::make_unique<PgWaitSampler>(pg->Url(server.db), server.db, [&] {
      return std::array<double, 3>{MachineCpuSeconds(), CpuSeconds(server.process->pid()), fleet.CpuSeconds()};
    });
  }
  if (!fleet.Measure()) return false;
  const PhaseMeter meter(server, pg, fleet);
  const absl::Time start = meter.start();
  const absl::Time end_part = start + absl::Milliseconds(static_cast<int64_t>(
                                          static_cast<double>(flags.task_ms) * (1 - flags.task_spread) * 0.95));
  absl::Notification job_over;  // the scrape before the end is not waited for once the job is over
  std::thread scrape_before_end([&] {
    if (!job_over.WaitForNotificationWithTimeout(end_part - absl::Now())) {
      before_end = ScrapeServerHeartbeats(server.http, token);
    }
  });
  auto job = client.Submit(request);
  if (!job.ok()) {
    fprintf(stderr, "submit: %s\n", std::string(job.status().message()).c_str());
    job_over.Notify();
    scrape_before_end.join();
    return false;
  }
  bool done = false;
  for (absl::Time deadline = start + absl::Minutes(5); absl::Now() < deadline;) {
    auto now = client.Get(job->id());
    if (now.ok() && now->state() != "queued" && now->state() != "running" && now->state() != "finalizing") {
      done = now->state() == "completed";
      if (!done) fprintf(stderr, "the job ended %s\n", now->state().c_str());
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Time job_end = absl::Now();
  if (waits != nullptr) waits->Stop();
  job_over.Notify();
  scrape_before_end.join();
  at_end = ScrapeServerHeartbeats(server.http, token);
  if (!fleet.Take(r.samples)) return false;
  meter.Finish(r);
  r.tasks_per_s = static_cast<double>(r.samples.completed) / r.seconds;
  if (!r.samples.leased_at.empty()) {
    r.first_lease_ms = absl::ToDoubleMilliseconds(*std::min_element(r.samples.leased_at.begin(), r.samples.leased_at.end()) - start);
  }
  if (!done) r.phase = "job!";  // did not complete in time
  Print(flags, store, n, r);
  PrintHeartbeatsAroundTheEnd(flags, store, n, r, start, end_part, at_start, before_end, at_end);
  if (waits != nullptr) {
    const std::string prefix = absl::StrCat(flags.label, " waits");
    waits->Print(absl::StrCat(prefix, " whole job:"), start, job_end);
    if (auto worst = WorstWindow(r.samples, flags.window_s)) {
      waits->Print(absl::StrCat(prefix, " worst heartbeat window:"), worst->first, worst->second);
    }
  }
  // A job that did not complete, or no task completed: nothing measured (bench-smoke fails).
  return done && r.samples.completed > 0;
}

// One point: a fresh server on `store` with `n` simulated executors; prints its phases.
bool RunPoint(const Flags& flags, const std::string& store, int n, Postgres* pg, int point) {
  PointServer server;
  if (!StartServer(flags, store, n, pg, point, server)) return false;
  v1::IssueTokenRequest join;
  join.set_role("join");
  join.set_principal("fleet-sim");
  join.set_uses(n);
  auto issued = minions::cli::RemoteAdmin(server.connection)->IssueToken(join);
  if (!issued.ok()) {
    fprintf(stderr, "join token: %s (see %s/server.log)\n", std::string(issued.status().message()).c_str(),
            server.dir.c_str());
    return false;
  }

  // The fleet, in --procs processes of its own (a few thousand executors each), more as a fleet's
  // machines are: each has its own gRPC completion queue, timers and threads (a precaution: one
  // process and four measured the same, docs/benchmarks.md "Thirteenth round").
  const int procs =
      std::clamp(flags.procs > 0 ? flags.procs : (n + kExecutorsPerProcess - 1) / kExecutorsPerProcess, 1, std::max(n, 1));
  SimProcesses fleet;
  const absl::Time enrol_start = absl::Now();
  if (auto s = fleet.Start(flags, server.connection.server, issued->token(), n, procs); !s.ok()) {
    fprintf(stderr, "the simulated fleet: %s (see %s/server.log)\n", std::string(s.message()).c_str(),
            server.dir.c_str());
    return false;
  }
  fprintf(stderr, "%s %s %d: %d processes enrolled, registered and attached their executors in %.1f s\n",
          flags.label.c_str(), store.c_str(), n, procs, absl::ToDoubleSeconds(absl::Now() - enrol_start));
  absl::SleepFor(absl::Seconds(flags.warmup_s > 0 ? flags.warmup_s : flags.ttl_ms / 1000.0));

  bool measured = RunIdlePhase(flags, store, n, server, pg, fleet);
  if (!measured) return false;
  if (flags.job_tasks > 0) measured = RunJobPhase(flags, store, n, server, pg, fleet);
  server.process->Signal(SIGKILL);
  (void)server.process->Wait(absl::Seconds(10));
  fleet.Stop();
  return measured;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as `minions` (apps/minions_main.cc)
  CLI::App app{"minions-bench-fleet: simulated executors against one real server"};
  Flags flags;
  app.add_option("--executors", flags.executors, "fleet sizes, one point each")->capture_default_str();
  app.add_option("--store", flags.stores, "sqlite and/or postgres")->capture_default_str();
  app.add_option("--ttl-ms", flags.ttl_ms, "the server's lease TTL (heartbeats every third; idle ones as the server says, 1.5 TTL by default)")
      ->capture_default_str();
  app.add_option("--idle-polls", flags.idle_polls,
                 "idle polls stand for idle heartbeats where the server says so (as the executor); false: beat anyway")
      ->capture_default_str();
  app.add_option("--beat-stream", flags.beat_stream,
                 "heartbeats on one Beats stream per executor (as the executor); false: a Heartbeat call each")
      ->capture_default_str();
  app.add_option("--lease-wait-ms", flags.lease_wait_ms, "an idle executor's long poll (the executor's: 30000)")
      ->capture_default_str();
  app.add_option("--channels", flags.channels, "gRPC connections (0: one per executor)")->capture_default_str();
  app.add_option("--warmup-s", flags.warmup_s, "seconds after the fleet is up before measuring (0: one TTL)");
  app.add_option("--idle-s", flags.idle_s, "seconds of the idle phase")->capture_default_str();
  app.add_option("--window-s", flags.window_s, "a long phase's heartbeats are also shown by window of this many seconds")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--job-tasks", flags.job_tasks, "one-record tasks of the job phase (0: none)")->capture_default_str();
  app.add_option("--task-ms", flags.task_ms, "the fake runner's time per task")->capture_default_str();
  app.add_option("--task-spread", flags.task_spread,
                 "each task runs --task-ms x (1 +- up to this); 0: all alike, so that tasks begun together end together")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--run-threads", flags.run_threads, "threads of the fake runner's file I/O")->capture_default_str();
  app.add_option("--enrol-threads", flags.enrol_threads, "threads that enrol the executors (not measured)")
      ->capture_default_str();
  app.add_flag("--pg-waits", flags.pg_waits,
               "PostgreSQL: sample what its backends wait for during the job, printed for the whole job and "
               "for its worst heartbeat window");
  app.add_option("--procs", flags.procs,
                 "processes that share the simulated executors out (0: one per 2,500 executors)")
      ->capture_default_str();
  // A worker's options (SimProcesses starts it): not for people.
  app.add_flag("--worker", flags.worker)->group("");
  app.add_option("--server", flags.server)->group("");
  app.add_option("--first", flags.first)->group("");
  app.add_option("--count", flags.count)->group("");
  app.add_option("--dir", flags.dir, "work folder (default: a fresh one under /tmp)");
  app.add_option("--label", flags.label, "names this run's rows")->capture_default_str();
  app.add_option("--server-arg", flags.server_args, "an option for the server (repeat)")->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);
  if (flags.worker) return WorkerMain(flags);
  if (flags.dir.empty()) flags.dir = absl::StrCat("/tmp/minions-fleet-", getpid());
  fs::create_directories(flags.dir);

  printf("# minions-bench-fleet: load average at start %s; %u cores; TTL %lld ms; long poll %lld ms; job %d tasks of %lld ms (+- %g %%)\n",
         LoadAverage().c_str(), std::thread::hardware_concurrency(), static_cast<long long>(flags.ttl_ms),
         static_cast<long long>(flags.lease_wait_ms), flags.job_tasks, static_cast<long long>(flags.task_ms),
         100 * flags.task_spread);
  printf("%-10s %-8s %6s %-5s %6s | heartbeat latency (ms) | Lease calls that got a task (ms), submit to first lease "
         "| tasks/s | server CPU (of one core), RSS | store CPU | store transactions/s | simulator CPU\n",
         "label", "store", "execs", "phase", "secs");
  std::unique_ptr<Postgres> pg;
  if (std::find(flags.stores.begin(), flags.stores.end(), "postgres") != flags.stores.end()) {
    pg = std::make_unique<Postgres>(flags.dir + "/pg");
    if (auto s = pg->Start(); !s.ok()) {
      fprintf(stderr, "PostgreSQL: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  int point = 0;
  bool ok = true;
  for (int n : flags.executors) {
    for (const std::string& store : flags.stores) {
      if (store != "sqlite" && store != "postgres") {
        fprintf(stderr, "--store: sqlite or postgres, not %s\n", store.c_str());
        return 2;
      }
      ok &= RunPoint(flags, store, n, store == "postgres" ? pg.get() : nullptr, point++);
    }
  }
  printf("# load average at end %s\n", LoadAverage().c_str());
  return ok ? 0 : 1;
}
