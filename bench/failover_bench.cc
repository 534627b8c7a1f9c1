// minions-bench-failover: what an executor's death costs, side by side with Dask distributed losing
// a worker mid-task, in one run on one machine (docs/benchmarks.md records the figures).
//
// Each trial submits a one-task job whose records each take a fixed time (the paced runner,
// bench/paced_runner.cc), waits until the task is half done, SIGKILLs the executor running it
// (--fault kill: a process death, which the server sees at once on its presence stream) or
// SIGSTOPs it and its runner (--fault stop: a machine that hangs, seen only when its lease
// expires), starts a replacement, then measures
//   - failover: from the kill to the task's batch starting in a runner on another executor (the
//     runner's own log line), and the control plane's steps in between: the lease expired (task
//     back to pending) and the task leased again;
//   - records redone: records processed more than once (every record processed is logged by
//     custom_id; redone = lines - distinct records). Before checkpointing this is every record the
//     dead attempt had done; with checkpointed chunks it must be at most one chunk.
// The Dask side (bench/dask_failover.py) runs the same paced task body, logging the same lines,
// on a LocalCluster, and kills the worker process running it.

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "testing/process_pool.h"

namespace {

using minions::Json;
using minions::Subprocess;
using minions::testing::ProcessPool;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One line of the paced log (see bench/paced_runner.cc).
struct LogLine {
  int64_t ms = 0;
  std::string kind;   // "start" or "record"
  std::string batch;  // the executor's batch id ("job/task#attempt"); Dask: "trial<N>"
  std::string id;     // start: runner pid; record: custom_id
  std::string parent;  // start: the runner's parent pid (the executor)
};

std::vector<LogLine> ReadLog(const std::string& path) {
  std::vector<LogLine> lines;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    std::vector<std::string> f = absl::StrSplit(text, ' ');
    if (f.size() < 4) continue;  // a line being written
    LogLine l{std::atoll(f[0].c_str()), f[1], f[2], f[3], f.size() > 4 ? f[4] : ""};
    lines.push_back(std::move(l));
  }
  return lines;
}

struct Trial {
  double failover_s = -1;   // kill -> batch started on another executor / worker
  double requeued_s = -1;   // kill -> task pending again (Minions only)
  double leased_s = -1;     // kill -> task running under a new attempt (Minions only)
  int64_t done_by_dead = 0; // records the dead attempt had finished
  int64_t redone = 0;       // records processed more than once
  int64_t records = 0;
};

void PrintSummary(const char* who, const std::vector<Trial>& trials) {
  if (trials.empty()) return;
  std::vector<double> f;
  double redone = 0, dead = 0;
  int64_t max_redone = 0;
  for (const auto& t : trials) {
    f.push_back(t.failover_s);
    redone += t.redone;
    dead += t.done_by_dead;
    max_redone = std::max(max_redone, t.redone);
  }
  std::sort(f.begin(), f.end());
  printf("  %-8s failover median %.2f s, max %.2f s; records redone per failure: mean %.1f, max %lld "
         "(the dead attempt had done %.1f of %lld)\n",
         who, f[f.size() / 2], f.back(), redone / trials.size(), static_cast<long long>(max_redone),
         dead / trials.size(), static_cast<long long>(trials[0].records));
}

// Kills the executor running a one-task job midway, `trials` times.
std::vector<Trial> MinionsTrials(const std::string& work, int executors, int trials, int records, int record_ms,
                                 int ttl_ms, const std::string& fault, const std::vector<std::string>& executor_args) {
  const std::string log = work + "/minions-paced.log";
  std::filesystem::remove(log);
  // The executors' runners get these (--runner-env); they run unconfined, as the paced runner
  // appends to a log outside its scratch folder.
  const std::vector<std::string> runner_env = {absl::StrCat("MINIONS_PACED_RECORD_MS=", record_ms),
                                               absl::StrCat("MINIONS_PACED_LOG=", log)};
  std::vector<std::string> args = executor_args;
  args.insert(args.end(), {"--runner-sandbox", "off"});
  const std::string model = work + "/paced.model";  // the paced runner loads nothing; the path must exist
  std::ofstream(model) << "paced\n";
  const std::string runner = minions::SiblingProgram("minions-bench-paced-runner");

  ProcessPool pool(minions::SiblingProgram("minions"), work + "/minions", ttl_ms);
  pool.AllowModels({work});
  std::vector<Trial> results;
  if (auto s = pool.StartServer(); !s.ok()) {
    fprintf(stderr, "server: %s\n", std::string(s.message()).c_str());
    return results;
  }
  int next_name = 0;
  for (int i = 0; i < executors; ++i) {
    (void)pool.StartExecutor(absl::StrCat("e", ++next_name), 1, runner, "", args, runner_env);
  }
  minions::cli::JobsClient client(pool.connection());

  for (int t = 0; t < trials; ++t) {
    std::string input;
    for (int i = 0; i < records; ++i) {
      absl::StrAppend(&input, "{\"custom_id\":\"t", t, "-r", i, "\",\"method\":\"POST\",\"url\":\"/v1/completions\","
                      "\"body\":{\"model\":\"paced\",\"prompt\":\"x\",\"max_tokens\":1}}\n");
    }
    minions::v1::SubmitJobRequest request;
    request.set_input(input);
    request.set_model(model);
    request.set_shard_size(records);
    auto job = client.Submit(request);
    if (!job.ok()) {
      fprintf(stderr, "submit: %s\n", std::string(job.status().message()).c_str());
      return results;
    }
    const std::string prefix = job->id() + "/";
    auto ours = [&](const LogLine& l) { return l.batch.rfind(prefix, 0) == 0; };

    // Wait until the task is half done; the victim is the executor whose runner runs it.
    std::string victim_pid, victim;
    for (absl::Time until = absl::Now() + absl::Minutes(1); absl::Now() < until;) {
      int done = 0;
      for (const auto& l : ReadLog(log)) {
        if (!ours(l)) continue;
        if (l.kind == "start" && victim_pid.empty()) victim_pid = l.parent;
        done += l.kind == "record";
      }
      if (!victim_pid.empty() && done >= records / 2) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (const auto& name : pool.executor_names()) {
      if (std::to_string(pool.executor(name).pid()) == victim_pid) victim = name;
    }
    if (victim.empty()) {
      fprintf(stderr, "trial %d: no executor ran the task within a minute; see %s/minions/logs\n", t, work.c_str());
      return results;
    }
    const int64_t killed_ms = NowMs();
    if (fault == "stop") {
      // A hung machine: the executor and its runner freeze; its connections stay open.
      for (pid_t child : pool.ExecutorChildren(victim)) kill(child, SIGSTOP);
      pool.executor(victim).Signal(SIGSTOP);
    } else {
      (void)pool.StopExecutor(victim, SIGKILL);
    }
    // The fleet keeps its size.
    (void)pool.StartExecutor(absl::StrCat("e", ++next_name), 1, runner, "", args, runner_env);

    // Follow the task through the control plane until a runner elsewhere starts it.
    Trial trial;
    trial.records = records;
    while (NowMs() - killed_ms < 120000 && trial.failover_s < 0) {
      auto tasks = client.Tasks(job->id());
      double since = (NowMs() - killed_ms) / 1000.0;
      if (tasks.ok() && !tasks->empty()) {
        const auto& task = tasks->front();
        if (trial.requeued_s < 0 && (task.state() == "pending" || task.attempt() > 1)) trial.requeued_s = since;
        if (trial.leased_s < 0 && task.attempt() > 1 && task.state() != "pending") trial.leased_s = since;
      }
      for (const auto& l : ReadLog(log)) {
        if (ours(l) && l.kind == "start" && l.parent != victim_pid) {
          trial.failover_s = (l.ms - killed_ms) / 1000.0;
          break;
        }
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (fault == "stop") (void)pool.StopExecutor(victim, SIGKILL);  // its runner dies with it
    if (trial.failover_s < 0) {
      fprintf(stderr, "trial %d: the task did not run elsewhere within two minutes; see %s/minions/logs\n", t + 1,
              work.c_str());
      return {};
    }
    for (absl::Time until = absl::Now() + absl::Minutes(2); absl::Now() < until;) {
      auto now = client.Get(job->id());
      if (now.ok() && now->state() == "completed") break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    // Which runner ran which records: the dead attempt's are those of the victim's runner.
    std::map<std::string, std::string> runner_parent;  // batch -> executor pid
    std::map<std::string, int> seen;
    for (const auto& l : ReadLog(log)) {
      if (!ours(l)) continue;
      if (l.kind == "start") runner_parent[l.batch] = l.parent;
      if (l.kind != "record") continue;
      ++seen[l.id];
      trial.done_by_dead += runner_parent[l.batch] == victim_pid;
    }
    for (const auto& [id, n] : seen) trial.redone += n - 1;
    printf("  minions trial %d: %s %s with %lld/%d records done; lease expired after %.2f s, leased again "
           "after %.2f s, running elsewhere after %.2f s; %lld records redone\n",
           t + 1, fault == "stop" ? "stopped" : "killed", victim.c_str(), static_cast<long long>(trial.done_by_dead), records, trial.requeued_s,
           trial.leased_s, trial.failover_s, static_cast<long long>(trial.redone));
    fflush(stdout);
    results.push_back(trial);
  }
  return results;
}

std::vector<Trial> DaskTrials(const std::string& work, int workers, int trials, int records, int record_ms) {
  std::vector<Trial> results;
  std::string script = std::string(MINIONS_SOURCE_DIR) + "/bench/dask_failover.py";
  Subprocess::Options sp;
  sp.argv = {minions::bench::SystemPython(), script, "--workers", std::to_string(workers), "--trials", std::to_string(trials), "--records",
             std::to_string(records), "--record-ms", std::to_string(record_ms), "--log", work + "/dask-paced.log"};
  sp.stderr_path = work + "/dask.log";
  auto p = Subprocess::Start(sp);
  if (!p.ok()) return results;
  (*p)->CloseStdin();
  while (true) {
    auto line = (*p)->ReadLine();
    if (!line.ok()) break;
    auto json = minions::ParseJson(*line);
    if (!json.ok() || !json->contains("failover_s")) continue;
    Trial t;
    t.failover_s = (*json)["failover_s"].get<double>();
    t.done_by_dead = (*json)["done_by_dead"].get<int64_t>();
    t.redone = (*json)["redone"].get<int64_t>();
    t.records = records;
    printf("  dask    trial %zu: killed worker with %lld/%d records done; running elsewhere after %.2f s; "
           "%lld records redone\n",
           results.size() + 1, static_cast<long long>(t.done_by_dead), records, t.failover_s,
           static_cast<long long>(t.redone));
    fflush(stdout);
    results.push_back(t);
  }
  (void)(*p)->Wait();
  if (results.empty()) printf("  dask:    failed; see %s/dask.log\n", work.c_str());
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Failover: an executor (a Dask worker) dies mid-task; how long until its task runs elsewhere, and "
               "how much work is redone"};
  std::string work = "/tmp/minions-bench-failover";
  int executors = 3, trials = 5, records = 40, record_ms = 50, ttl_ms = 9000;
  bool no_dask = false;
  std::string fault = "kill";
  std::vector<std::string> executor_args;
  app.add_option("--work-dir", work, "scratch directory")->capture_default_str();
  app.add_option("--executors", executors, "executors (Dask: workers)")->capture_default_str();
  app.add_option("--trials", trials, "failures, one per trial")->capture_default_str();
  app.add_option("--records", records, "records in the task")->capture_default_str();
  app.add_option("--record-ms", record_ms, "time each record takes")->capture_default_str();
  app.add_option("--lease-ttl-ms", ttl_ms, "the server's lease TTL (default: the server's default)")
      ->capture_default_str();
  app.add_flag("--no-dask", no_dask, "skip the Dask side");
  app.add_option("--fault", fault,
                 "kill: SIGKILL the executor (a process death); stop: SIGSTOP it and its runner (a hung machine; "
                 "Minions only)")
      ->check(CLI::IsMember({"kill", "stop"}))
      ->capture_default_str();
  app.add_option("--executor-arg", executor_args,
                 "a flag for every executor, e.g. its checkpoint settings (repeat for several)")
      ->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);

  printf("== failover (%s): %d trials, %d executors, a task of %d records x %d ms, lease ttl %d ms ==\n",
         fault == "stop" ? "executor and runner stopped" : "executor killed", trials, executors, records, record_ms,
         ttl_ms);
  printf("   (%s when half done; target: running elsewhere within ttl + 1 s = %.1f s)\n",
         fault == "stop" ? "stopped" : "killed", ttl_ms / 1000.0 + 1);
  if (!executor_args.empty()) {
    std::string joined;
    for (const auto& a : executor_args) joined += " " + a;
    printf("   executors run with:%s\n", joined.c_str());
  }
  fflush(stdout);
  auto minions = MinionsTrials(work, executors, trials, records, record_ms, ttl_ms, fault, executor_args);
  // Dask's side kills a worker; a stopped one is another experiment.
  std::vector<Trial> dask;
  bool dask_ok = true;
  if (!no_dask && fault == "kill") {
    if (minions::bench::DaskInstalled()) {
      dask = DaskTrials(work, executors, trials, records, record_ms);
      dask_ok = static_cast<int>(dask.size()) == trials;
    } else {
      printf("  dask:    skipped, not installed (bench/install-peers: Debian's python3-distributed)\n");
    }
  }
  printf("\n");
  PrintSummary("minions", minions);
  PrintSummary("dask", dask);
  // Nothing measured (bench-smoke): a failure. A missing Dask is reported above, not a failure.
  return static_cast<int>(minions.size()) == trials && dask_ok ? 0 : 1;
}
