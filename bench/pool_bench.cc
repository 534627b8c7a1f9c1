// minions-bench-pool: the control plane and the whole pool, measured side by side with a baseline
// in one run (docs/benchmarks.md records the figures and these commands).
//
//   --mode control-plane   empty tasks through server + executors (no-op runner) vs Dask distributed
//   --mode first-result    submit -> first record's result on a warm pool
//   --mode scaling         one executor vs the runner alone; N executors vs N x the runner alone
//   --mode noop-job        a team's big job of tiny records through executors with the no-op
//                          runner (which answers one line at a time) vs that runner alone
//   --mode cold-model      a model no executor holds yet, pushed to the registry over the S3 server
//                          on loopback (--s3-endpoint): push, then submit -> first result on a
//                          fresh executor (download, digest check, load), vs copying the file into
//                          and out of the same server with the minio client (tests/js)
//   --mode affinity        two registry models' jobs alternating over four executors on loopback:
//                          model loads and total time with model affinity (warm executors first,
//                          the warm wait) against the server's --no-model-affinity, interleaved
//   --mode spot-checks     the same job on a warm pool with spot checks off and on (the default
//                          fraction), in turns: spot checks' share of the fleet's device time
//   --mode all             control-plane, first-result and scaling

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench_util.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/model_verbs.h"
#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "testing/process_pool.h"

namespace {

using minions::Json;
using minions::Subprocess;
using minions::testing::ProcessPool;

using minions::bench::BinDir;
using minions::bench::Slurp;

// Runs a command to completion; returns its stdout (what it wrote, even when it failed).
std::string RunCommand(const std::vector<std::string>& argv, const std::string& log) {
  std::string out;
  (void)minions::bench::RunProgram(argv, log, out);
  return out;
}

// Submits and waits; returns seconds from submit to completed (or -1).
double SubmitAndTime(ProcessPool& pool, const std::string& input, const std::string& model, int64_t shard,
                     const std::string& options, std::string* job_id = nullptr) {
  minions::cli::JobsClient client(pool.connection());
  minions::v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(model);
  request.set_shard_size(shard);
  request.set_runner_options_json(options);
  absl::Time start = absl::Now();
  auto job = client.Submit(request);
  if (!job.ok()) {
    fprintf(stderr, "submit failed: %s\n", std::string(job.status().message()).c_str());
    return -1;
  }
  if (job_id != nullptr) *job_id = job->id();
  // A pool that runs nothing must end the benchmark, not hang it.
  for (const absl::Time deadline = start + absl::Minutes(10); absl::Now() < deadline;) {
    auto now = client.Get(job->id());
    if (now.ok() && now->state() == "completed") return absl::ToDoubleSeconds(absl::Now() - start);
    if (now.ok() && (now->state() == "failed" || now->state() == "cancelled")) {
      fprintf(stderr, "job %s %s: %s\n", job->id().c_str(), now->state().c_str(), now->error().c_str());
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling harder would load the server being measured
  }
  fprintf(stderr, "job %s did not complete in 10 minutes; see %s/logs\n", job->id().c_str(), pool.dir().c_str());
  return -1;
}

// Waits until `n` executors have registered with the pool's server; false (and where the logs
// are) after a minute.
bool ExecutorsJoined(ProcessPool& pool, int n) {
  minions::cli::JobsClient client(pool.connection());
  for (const absl::Time deadline = absl::Now() + absl::Minutes(1); absl::Now() < deadline;) {
    auto executors = client.Executors();
    if (executors.ok() && static_cast<int>(executors->size()) >= n) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  fprintf(stderr, "no executor joined the pool within a minute; see %s/logs\n", pool.dir().c_str());
  return false;
}

// Starts the pool's server; false (and where its log is) when it does not come up.
bool StartedServer(ProcessPool& pool) {
  if (absl::Status s = pool.StartServer(); !s.ok()) {
    fprintf(stderr, "the server did not start: %s\n", std::string(s.message()).c_str());
    return false;
  }
  return true;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// Each mode returns whether it measured something (a rate above zero, at least one sample): a
// benchmark that measures nothing has rotted, and the suite's smoke run (tests/bench) fails on
// it. A peer that is not installed (Dask, the minio client) is reported as skipped instead.

bool ControlPlane(const std::string& work, int executors, int tasks) {
  printf("\n== control plane: %d empty tasks, %d executors (no-op runner) vs Dask distributed ==\n", tasks, executors);
  ProcessPool pool(BinDir() + "/minions", work + "/control-plane", 9000);
  pool.AllowModels({BinDir()});  // the "model" is the no-op runner's own file
  if (!StartedServer(pool)) return false;
  for (int i = 1; i <= executors; ++i) {
    (void)pool.StartExecutor(absl::StrCat("noop-", i), 1, BinDir() + "/minions-noop-runner");
  }
  if (!ExecutorsJoined(pool, executors)) return false;
  std::string model = BinDir() + "/minions-noop-runner";  // any existing file: the no-op runner loads nothing
  std::vector<std::string> records;
  for (int i = 0; i < tasks; ++i) records.push_back(absl::StrCat("{\"custom_id\":\"t", i, "\",\"prompt\":\"x\"}"));
  // Warm-up: executors registered and runners started.
  SubmitAndTime(pool, JoinLines({records.begin(), records.begin() + std::min(tasks, 50)}), model, 1, "");
  // CPU time of the server and the executors too: a machine shared with other work disturbs it far
  // less than wall time, so it shows a change in the control plane's own cost through the noise.
  auto cpu = [&] {
    double total = minions::bench::CpuSeconds(pool.server().pid());
    for (const std::string& name : pool.executor_names()) total += minions::bench::CpuSeconds(pool.executor(name).pid());
    return total;
  };
  const double cpu_before = cpu();
  double seconds = SubmitAndTime(pool, JoinLines(records), model, 1, "");
  if (seconds <= 0) return false;
  const double cpu_seconds = cpu() - cpu_before;
  double ours = tasks / seconds;
  printf("  minions: %d tasks in %.2f s = %.0f tasks/s (submit to job completed, incl. splitting and merging); "
         "%.2f CPU-s of the server and executors = %.0f tasks per CPU-second\n",
         tasks, seconds, ours, cpu_seconds, tasks / std::max(cpu_seconds, 1e-3));

  if (!minions::bench::DaskInstalled()) {
    printf("  dask:    skipped, not installed (bench/install-peers: Debian's python3-distributed)\n");
    return true;
  }
  std::string script = std::string(MINIONS_SOURCE_DIR) + "/bench/dask_noop.py";
  std::string out = RunCommand({minions::bench::SystemPython(), script, "--workers", std::to_string(executors), "--tasks",
                                std::to_string(tasks)},
                               work + "/dask.log");
  auto parsed = minions::ParseJson(out.substr(0, out.find('\n')));
  if (!parsed.ok() || !parsed->contains("tasks_per_second")) {
    printf("  dask:    failed; see %s/dask.log\n", work.c_str());
    return false;
  }
  double dask = (*parsed)["tasks_per_second"].get<double>();
  printf("  dask:    %d tasks in %.2f s = %.0f tasks/s (client.map + gather, LocalCluster %d workers)\n", tasks,
         (*parsed)["seconds"].get<double>(), dask, executors);
  printf("  minions / dask: %.2fx (target >= 5x)\n", ours / dask);
  return true;
}

// Seconds from submit to the first record's result (-1 on failure), then waits for the job to end.
double FirstResultSeconds(minions::cli::JobsClient& client, const std::string& input, const std::string& model,
                          absl::Duration poll = absl::Milliseconds(5)) {
  minions::v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(model);
  request.set_shard_size(1);
  absl::Time start = absl::Now();
  auto job = client.Submit(request);
  if (!job.ok()) {
    fprintf(stderr, "submit failed: %s\n", std::string(job.status().message()).c_str());
    return -1;
  }
  double first = -1;
  for (const absl::Time deadline = start + absl::Minutes(10); absl::Now() < deadline;) {
    auto now = client.Get(job->id());
    if (!now.ok()) {
      absl::SleepFor(poll);
      continue;
    }
    if (first < 0 && now->request_counts().completed() + now->request_counts().failed() > 0) {
      first = absl::ToDoubleSeconds(absl::Now() - start);
    }
    if (now->state() == "completed") return first;
    if (now->state() == "failed" || now->state() == "cancelled") {
      fprintf(stderr, "job %s %s: %s\n", job->id().c_str(), now->state().c_str(), now->error().c_str());
      return -1;
    }
    absl::SleepFor(first < 0 ? poll : absl::Milliseconds(20));  // after the first result, poll gently
  }
  fprintf(stderr, "job %s did not complete in 10 minutes\n", job->id().c_str());
  return -1;
}

bool FirstResult(const std::string& work, const std::string& model, int trials) {
  printf("\n== submit to first result, warm pool (1 executor, llama.cpp runner, test model) ==\n");
  ProcessPool pool(BinDir() + "/minions", work + "/first-result", 9000);
  pool.AllowModels({std::filesystem::path(model).parent_path().string()});
  if (!StartedServer(pool)) return false;
  (void)pool.StartExecutor("e1", 0);
  if (!ExecutorsJoined(pool, 1)) return false;
  minions::cli::SamplePromptOptions sample;
  sample.records = 20;
  sample.max_tokens = 8;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  std::string input = JoinLines(minions::cli::SamplePromptLines(sample));
  if (SubmitAndTime(pool, input, model, 1, "") < 0) return false;  // warm: the runner has the model loaded
  minions::cli::JobsClient client(pool.connection());
  std::vector<double> times;
  for (int t = 0; t < trials; ++t) {
    const double first = FirstResultSeconds(client, input, model, absl::Milliseconds(2));
    if (first < 0) return false;
    times.push_back(first);
  }
  if (times.empty()) return false;
  std::sort(times.begin(), times.end());
  printf("  %d trials: median %.3f s, max %.3f s (target < 1 s)\n", trials, times[times.size() / 2], times.back());
  return true;
}

double LocalRunRate(const std::string& work, const std::string& input_path, const std::string& model, int threads,
                    int records) {
  std::string out = RunCommand({BinDir() + "/minions", "local-run", input_path, "--model", model, "-o",
                                work + "/local.jsonl", "--threads", std::to_string(threads), "--parallel", "8",
                                "--no-progress"},
                               work + "/local-run.log");
  // "N records (E errors) in S s: ..."
  double seconds = 0;
  if (sscanf(out.c_str(), "%*d records (%*d errors) in %lf s", &seconds) != 1 || seconds <= 0) return -1;
  return records / seconds;
}

bool Scaling(const std::string& work, const std::string& model, int records, int max_tokens, int64_t shard) {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  printf("\n== end-to-end throughput vs the runner alone (%d records, max_tokens %d, shard %lld, %u cores) ==\n",
         records, max_tokens, static_cast<long long>(shard), cores);
  minions::cli::SamplePromptOptions sample;
  sample.records = records;
  sample.max_tokens = max_tokens;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  sample.greedy_only = true;
  std::string input = JoinLines(minions::cli::SamplePromptLines(sample));
  std::string input_path = work + "/scaling-input.jsonl";
  std::ofstream(input_path) << input;
  std::string options = R"({"n_parallel": 8})";

  // The executor's default: all cores but one, which the server, the agent and the machine's
  // owner keep (decode threads spin-wait; a core taken from them mid-step stalls all of them).
  int threads = std::max(1, static_cast<int>(cores) - 1);
  double alone = LocalRunRate(work, input_path, model, threads, records);
  double one;
  {
    ProcessPool pool(BinDir() + "/minions", work + "/scaling-1", 9000);
    pool.AllowModels({std::filesystem::path(model).parent_path().string()});
    if (!StartedServer(pool)) return false;
    (void)pool.StartExecutor("e1", threads);
    if (!ExecutorsJoined(pool, 1)) return false;
    SubmitAndTime(pool, JoinLines({minions::cli::SamplePromptLines(sample)[0]}), model, shard, options);  // warm
    const double seconds = SubmitAndTime(pool, input, model, shard, options);
    if (seconds <= 0 || alone <= 0) return false;
    one = records / seconds;
  }
  printf("  runner alone (%d threads):   %6.1f records/s\n", threads, alone);
  printf("  1 executor   (%d threads):   %6.1f records/s   = %.1f %% of the runner alone (target >= 98 %%)\n", threads,
         one, 100 * one / alone);

  int n = static_cast<int>(cores);
  if (n < 2) return true;
  double alone1 = LocalRunRate(work, input_path, model, 1, records);
  double many;
  {
    ProcessPool pool(BinDir() + "/minions", work + "/scaling-n", 9000);
    pool.AllowModels({std::filesystem::path(model).parent_path().string()});
    if (!StartedServer(pool)) return false;
    for (int i = 1; i <= n; ++i) (void)pool.StartExecutor(absl::StrCat("e", i), 1);
    if (!ExecutorsJoined(pool, n)) return false;
    SubmitAndTime(pool, JoinLines(minions::cli::SamplePromptLines(sample)), model, shard, options);  // warm all
    const double seconds = SubmitAndTime(pool, input, model, shard, options);
    if (seconds <= 0 || alone1 <= 0) return false;
    many = records / seconds;
  }
  printf("  runner alone (1 thread):     %6.1f records/s\n", alone1);
  printf("  %d executors (1 thread each): %6.1f records/s   = %.1f %% of %d x the runner alone (target >= 95 %%)\n", n,
         many, 100 * many / (n * alone1), n);
  return true;
}

// A team bringing its own runner: `records` tiny records, `shard` per task, through `executors`
// executors whose runner (the no-op one) reads a command and answers it before reading the next,
// against the same records through that runner alone (`minions local-run`).
bool NoopJob(const std::string& work, int executors, int records, int64_t shard) {
  printf("\n== a team's job: %d records, %lld per task, %d executors, no-op runner (one line at a time) ==\n", records,
         static_cast<long long>(shard), executors);
  std::vector<std::string> lines;
  for (int i = 0; i < records; ++i) lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"x\"}"));
  const std::string input = JoinLines(lines);
  const std::string input_path = work + "/noop-job.jsonl";
  std::ofstream(input_path) << input;
  const std::string noop = BinDir() + "/minions-noop-runner";
  double seconds;
  {
    ProcessPool pool(BinDir() + "/minions", work + "/noop-job", 9000);
    pool.AllowModels({BinDir()});  // the "model" is the no-op runner's own file
    if (!StartedServer(pool)) return false;
    for (int i = 1; i <= executors; ++i) (void)pool.StartExecutor(absl::StrCat("e", i), 1, noop);
    if (!ExecutorsJoined(pool, executors)) return false;
    seconds = SubmitAndTime(pool, input, noop, shard, "");  // the no-op runner loads nothing: any file will do
  }
  if (seconds <= 0) {
    printf("  the job did not complete\n");
    return false;
  }
  std::string out = RunCommand({BinDir() + "/minions", "local-run", input_path, "--model", "none", "--runner", noop,
                                "-o", work + "/noop-local.jsonl", "--no-progress"},
                               work + "/noop-local.log");
  double alone = 0;
  if (sscanf(out.c_str(), "%*d records (%*d errors) in %lf s", &alone) != 1 || alone <= 0) alone = -1;
  printf("  pool:          %.1f s = %.0f records/s (submit to job completed, incl. splitting and merging)\n", seconds,
         records / seconds);
  if (alone > 0) {
    printf("  runner alone:  %.1f s = %.0f records/s (minions local-run, one process)\n", alone, records / alone);
    printf("  pool / runner alone: %.2fx the time\n", seconds / alone);
    return true;
  }
  printf("  runner alone: failed; see %s/noop-local.log\n", work.c_str());
  return false;
}

bool ColdModel(const std::string& work, const std::string& model, const std::string& endpoint, int trials) {
  if (endpoint.empty()) {
    printf("\n== cold start: needs an S3 server (--s3-endpoint; tests/services/s3rver.sh start DIR 0) ==\n");
    return false;
  }
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(model));
  printf("\n== cold start: a %.0f MB model no executor holds, over the S3 server at %s ==\n", bytes / 1e6,
         endpoint.c_str());
  const std::string prefix = absl::StrCat("bench-", getpid());
  const std::vector<std::string> s3_env = {"AWS_ACCESS_KEY_ID=S3RVER", "AWS_SECRET_ACCESS_KEY=S3RVER",
                                           "AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1"};
  ProcessPool pool(BinDir() + "/minions", work + "/cold-model", 9000);
  pool.SetBackend({"--objects", "s3://minions-test/" + prefix}, s3_env);
  if (!StartedServer(pool)) return false;
  minions::cli::SamplePromptOptions sample;
  sample.records = 1;
  sample.max_tokens = 1;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  const std::string input = JoinLines(minions::cli::SamplePromptLines(sample));
  minions::cli::JobsClient client(pool.connection());
  minions::cli::ModelsClient models(pool.connection());

  absl::Time start = absl::Now();
  auto pushed = models.Push(model, "bench", "");
  const double push = absl::ToDoubleSeconds(absl::Now() - start);
  if (!pushed.ok()) {
    printf("  push failed: %s\n", std::string(pushed.status().message()).c_str());
    return false;
  }
  start = absl::Now();
  (void)models.Push(model, "bench-again", "");
  const double again = absl::ToDoubleSeconds(absl::Now() - start);
  // The baseline, interleaved with the cold starts: the same file into and out of the same server.
  const std::string script = std::string(MINIONS_SOURCE_DIR) + "/tests/js/minio_model_copy.mjs";
  std::vector<double> cold, put, get;
  for (int t = 0; t < trials; ++t) {
    std::string out = RunCommand({"env", s3_env[0], s3_env[1], "node", script, "--endpoint", endpoint, "--bucket",
                                  "minions-test", "--key", absl::StrCat(prefix, "/minio-", t), "--file", model, "--out",
                                  work + "/cold-model/minio-copy.gguf"},
                                 work + "/minio.log");
    auto parsed = minions::ParseJson(out.substr(0, out.find('\n')));
    if (parsed.ok() && parsed->contains("put_seconds")) {
      put.push_back((*parsed)["put_seconds"].get<double>());
      get.push_back((*parsed)["get_seconds"].get<double>());
    }
    // A fresh executor: an empty cache, no runner yet.
    const std::string name = absl::StrCat("cold-", t);
    if (!pool.StartExecutor(name, 0).ok()) return false;
    double seconds = FirstResultSeconds(client, input, "bench");
    (void)pool.StopExecutor(name, SIGTERM);
    if (seconds > 0) cold.push_back(seconds);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  printf("  minions models push:            %.2f s (%.0f MB/s: hash, parts, digest check, join)\n", push,
         bytes / 1e6 / push);
  printf("  the same bytes pushed again:    %.3f s (hash only; nothing sent)\n", again);
  printf("  submit -> first result, cold:   %.2f s median of %zu (download, digest check, load, 1 token)\n",
         median(cold), cold.size());
  if (!get.empty()) {
    printf("  minio client put / get:         %.2f s / %.2f s median of %zu\n", median(put), median(get), get.size());
    printf("  cold first result / minio get:  %.2fx;  push / minio put: %.2fx\n", median(cold) / median(get),
           push / median(put));
  } else {
    printf("  minio client: skipped, not installed (tests/js: npm ci); see %s/minio.log\n", work.c_str());
  }
  return !cold.empty();
}

// How many times the runners of a pool loaded a model: the "loaded model" lines of their logs.
int CountLoads(const std::string& pool_dir) {
  int loads = 0;
  for (const auto& entry : std::filesystem::directory_iterator(pool_dir + "/logs")) {
    if (entry.path().filename().string().rfind("runner-", 0) != 0) continue;
    std::istringstream lines(Slurp(entry.path().string()));
    for (std::string line; std::getline(lines, line);) loads += line.find("loaded model") != std::string::npos;
  }
  return loads;
}

// Two models' jobs alternating (alpha, beta, alpha, ...), `jobs` of them submitted `gap` apart,
// each of `records` records in tasks of `shard`, over four executors; the same with the server's
// model affinity off (--no-model-affinity), in turns, `trials` times each. Each side is a fresh pool
// (SQLite, objects in a folder) whose executors fetch both models from the registry once.
bool Affinity(const std::string& work, int trials, int jobs, int records, int64_t shard, absl::Duration gap,
              int embd) {
  std::vector<std::string> models;
  for (int seed : {1, 2}) {
    const std::string path = absl::StrCat(work, "/affinity-", embd, "-", seed, ".gguf");
    if (!std::filesystem::exists(path)) {
      RunCommand({BinDir() + "/minions-make-test-model", "--kind", "text", "--seed", std::to_string(seed), "--n-embd",
                  std::to_string(embd), "--n-layer", "8", "-o", path},
                 work + "/make-model.log");
    }
    models.push_back(path);
  }
  printf("\n== affinity: %d jobs alternating two %.0f MB models (%d records, tasks of %lld, %s apart), "
         "4 executors ==\n",
         jobs, std::filesystem::file_size(models[0]) / 1e6, records, static_cast<long long>(shard),
         absl::FormatDuration(gap).c_str());
  minions::cli::SamplePromptOptions sample;
  sample.records = records;
  sample.max_tokens = 4;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  const std::string input = JoinLines(minions::cli::SamplePromptLines(sample));
  struct Side {
    std::vector<int> loads;
    std::vector<double> seconds;
  };
  Side sides[2];  // 0: with affinity, 1: without
  for (int t = 0; t < trials; ++t) {
    for (int side = 0; side < 2; ++side) {
      const int which = (t % 2 == 0) ? side : 1 - side;  // alternate which side goes first
      const std::string dir = absl::StrCat(work, "/affinity-", which == 0 ? "on" : "off", "-", t);
      ProcessPool pool(BinDir() + "/minions", dir, 9000);
      if (which == 1) pool.AddServerArgs({"--no-model-affinity"});
      if (!StartedServer(pool)) return false;
      minions::cli::ModelsClient registry(pool.connection());
      for (int m = 0; m < 2; ++m) {
        auto pushed = registry.Push(models[m], m == 0 ? "alpha" : "beta", "");
        if (!pushed.ok()) {
          printf("  push failed: %s\n", std::string(pushed.status().message()).c_str());
          return false;
        }
      }
      for (int e = 0; e < 4; ++e) {
        if (!pool.StartExecutor(absl::StrCat("e", e)).ok()) return false;
      }
      minions::cli::JobsClient client(pool.connection());
      const absl::Time start = absl::Now();
      std::vector<std::string> ids;
      for (int j = 0; j < jobs; ++j) {
        minions::v1::SubmitJobRequest request;
        request.set_input(input);
        request.set_model(j % 2 == 0 ? "alpha" : "beta");
        request.set_shard_size(shard);
        auto job = client.Submit(request);
        if (!job.ok()) {
          printf("  submit failed: %s\n", std::string(job.status().message()).c_str());
          return false;
        }
        ids.push_back(job->id());
        absl::SleepFor(gap);
      }
      for (const std::string& id : ids) {
        while (true) {
          auto now = client.Get(id);
          if (now.ok() && now->state() == "completed") break;
          if (now.ok() && (now->state() == "failed" || now->state() == "cancelled")) {
            printf("  job %s %s: %s\n", id.c_str(), now->state().c_str(), now->error().c_str());
            return false;
          }
          absl::SleepFor(absl::Milliseconds(50));
        }
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      const int loads = CountLoads(dir);
      printf("  trial %d, %-17s %3d model loads, %6.1f s\n", t, which == 0 ? "with affinity:" : "without affinity:",
             loads, seconds);
      fflush(stdout);
      sides[which].loads.push_back(loads);
      sides[which].seconds.push_back(seconds);
    }
  }
  auto median = [](auto v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : static_cast<double>(v[v.size() / 2]);
  };
  const double loads_on = median(sides[0].loads), loads_off = median(sides[1].loads);
  const double time_on = median(sides[0].seconds), time_off = median(sides[1].seconds);
  printf("  median of %d: with affinity %.0f loads, %.1f s; without %.0f loads, %.1f s\n", trials, loads_on, time_on,
         loads_off, time_off);
  printf("  without / with: %.1fx the loads, %.2fx the time\n", loads_off / std::max(1.0, loads_on),
         time_off / std::max(1e-9, time_on));
  return loads_on > 0 && time_on > 0;
}

}  // namespace

// Spot checks' cost (issue 38, point 7; docs/verification.md): the same greedy job on a warm pool
// of `executors` executors with spot checks off and on (`minions server --spot-checks`, the default
// fraction), in turns, `trials` times each, each on a fresh pool. Each pool is warmed first with a
// job of 120 records per executor, so that every executor is past its first 100 records (all
// checked) and the measured job sees the 2 % draw. Every executor serves from submission to
// completion, so the fleet's device time is executors x the job's wall time, and the ratio of the
// sides' times is spot checks' overhead (their checks, and the wait for them before publication).
bool SpotCheckCost(const std::string& work, const std::string& model, int executors, int records, int max_tokens,
                   int64_t shard, int trials) {
  printf("\n== spot checks' cost: %d records, max_tokens %d, shard %lld, %d executors, %d trials a side ==\n", records,
         max_tokens, static_cast<long long>(shard), executors, trials);
  minions::cli::SamplePromptOptions sample;
  sample.max_tokens = max_tokens;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  sample.greedy_only = true;
  sample.records = static_cast<size_t>(120 * executors);
  const std::string warm = JoinLines(minions::cli::SamplePromptLines(sample));
  sample.records = static_cast<size_t>(records);
  const std::string input = JoinLines(minions::cli::SamplePromptLines(sample));
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / executors - 1);
  double total[2] = {0, 0};
  int64_t checked = 0, done = 0;
  for (int t = 0; t < trials; ++t) {
    for (int on = 0; on < 2; ++on) {
      ProcessPool pool(BinDir() + "/minions", absl::StrCat(work, "/spot-checks-", t, "-", on), 9000);
      pool.AllowModels({std::filesystem::path(model).parent_path().string()});
      if (on == 1) pool.AddServerArgs({"--spot-checks"});
      if (!StartedServer(pool)) return false;
      for (int i = 1; i <= executors; ++i) (void)pool.StartExecutor(absl::StrCat("e", i), threads);
      if (!ExecutorsJoined(pool, executors)) return false;
      if (SubmitAndTime(pool, warm, model, shard, "") <= 0) return false;
      std::string job_id;
      const double seconds = SubmitAndTime(pool, input, model, shard, "", &job_id);
      if (seconds <= 0) return false;
      total[on] += seconds;
      printf("  trial %d, spot checks %-3s: %7.2f s\n", t + 1, on ? "on" : "off", seconds);
      if (on == 1) {
        auto job = minions::cli::JobsClient(pool.connection()).Get(job_id);
        if (job.ok()) {
          checked += job->verification().checked();
          done += job->request_counts().total();
        }
      }
    }
  }
  printf("  spot checks off: %.2f s a job; on: %.2f s a job; overhead %.1f %% of the fleet's device time\n",
         total[0] / trials, total[1] / trials, 100 * (total[1] - total[0]) / total[0]);
  printf("  records re-scored in the measured jobs: %lld of %lld (%.1f %%)\n", static_cast<long long>(checked),
         static_cast<long long>(done), done > 0 ? 100.0 * checked / done : 0.0);
  return total[0] > 0;
}

int main(int argc, char** argv) {
  CLI::App app{"Minions pool benchmarks"};
  std::string mode = "all", model, work = "/tmp/minions-bench-pool";
  int executors = 2, tasks = 2000, trials = 5, records = 200, max_tokens = 16;
  int64_t shard = 25;
  app.add_option("--mode", mode,
                 "control-plane | first-result | scaling | noop-job | cold-model | affinity | spot-checks | all")
      ->check(CLI::IsMember(
          {"control-plane", "first-result", "scaling", "noop-job", "cold-model", "affinity", "spot-checks", "all"}))
      ->capture_default_str();
  app.add_option("--model", model, "GGUF model (default: a test model made in the work dir)");
  app.add_option("--work-dir", work, "scratch directory")->capture_default_str();
  app.add_option("--executors", executors, "executors for control-plane")->capture_default_str();
  app.add_option("--tasks", tasks, "empty tasks for control-plane")->capture_default_str();
  app.add_option("--trials", trials, "submissions for first-result")->capture_default_str();
  app.add_option("--records", records, "records for scaling and noop-job")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "max_tokens for scaling")->capture_default_str();
  app.add_option("--shard-size", shard, "records per task for scaling and noop-job")->capture_default_str();
  std::string s3_endpoint;
  app.add_option("--s3-endpoint", s3_endpoint,
                 "cold-model: the S3 server (tests/services/s3rver.sh start DIR 0 writes DIR/endpoint)");
  int jobs = 24, embd = 512;
  int64_t gap_ms = 250;
  app.add_option("--jobs", jobs, "affinity: jobs, alternating two models")->capture_default_str();
  app.add_option("--gap-ms", gap_ms, "affinity: time between submissions")->capture_default_str();
  app.add_option("--n-embd", embd, "affinity: the test models' width (8 layers)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::filesystem::create_directories(work);
  if (model.empty() && mode != "control-plane" && mode != "noop-job" && mode != "affinity") {
    model = work + "/text.gguf";
    if (!std::filesystem::exists(model)) {
      RunCommand({BinDir() + "/minions-make-test-model", "--kind", "text", "-o", model}, work + "/make-model.log");
    }
  }
  printf("machine: %u cores; %s\n", std::thread::hardware_concurrency(), model.empty() ? "" : model.c_str());
  bool measured = true;
  if (mode == "control-plane" || mode == "all") measured &= ControlPlane(work, executors, tasks);
  if (mode == "first-result" || mode == "all") measured &= FirstResult(work, model, trials);
  if (mode == "scaling" || mode == "all") measured &= Scaling(work, model, records, max_tokens, shard);
  if (mode == "noop-job") measured &= NoopJob(work, executors, records, shard);
  if (mode == "spot-checks") measured &= SpotCheckCost(work, model, executors, records, max_tokens, shard, trials);
  if (mode == "cold-model") measured &= ColdModel(work, model, s3_endpoint, trials);
  if (mode == "affinity") measured &= Affinity(work, trials, jobs, records, shard, absl::Milliseconds(gap_ms), embd);
  if (!measured) fprintf(stderr, "minions-bench-pool: a mode measured nothing; see the logs under %s\n", work.c_str());
  return measured ? 0 : 1;
}
