// minions-bench-metrics: what one /metrics scrape costs a server, side by side in one run
// (docs/benchmarks.md records the figures and the command):
//
//   (a) the bare store reads a refresh makes: the jobs of each unfinished state, the newest jobs,
//       the executors, the tasks of every running job;
//   (b) a scrape whose store-derived gauges are stale: FleetView refresh + the whole registry
//       rendered in the text format (what Prometheus pays once per cache period, 1 s);
//   (c) a scrape within the cache period: render only;
//   (d) counting the ended jobs (a read of the job history), which a refresh adds when a job has
//       ended since the last count, and every 30 s.
//
// The fleet: --executors executors, --running-jobs jobs of --tasks tasks each with a quarter of
// their tasks leased, and --finished-jobs completed one-task jobs, in SQLite on a temporary file.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "dashboard/fleet_view.h"
#include "metrics/metrics.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/fake_clock.h"

namespace {

using namespace minions;

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "minions-bench-metrics: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}

std::string MakeJob(MetadataStore& store, int n_tasks, absl::Time now) {
  JobSpec spec;
  spec.team = "bench";
  spec.model = "/models/m.gguf";
  spec.input_key = "in";
  std::vector<Task> tasks = testing::EvenTasks(n_tasks, 10);
  Job job = Must(store.CreateJob(spec, now), "create job");
  if (!store.AddTasks(job.id, tasks, n_tasks * 10, now).ok()) Die("add tasks");
  return job.id;
}

// Median milliseconds of `repeat` runs of `f`.
double MedianMs(int repeat, const std::function<void()>& f) {
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"What a /metrics scrape costs, side by side with the bare store reads it needs"};
  int executors = 100, running_jobs = 20, tasks = 100, finished_jobs = 2000, repeat = 21;
  app.add_option("--executors", executors)->capture_default_str();
  app.add_option("--running-jobs", running_jobs)->capture_default_str();
  app.add_option("--tasks", tasks, "tasks per running job")->capture_default_str();
  app.add_option("--finished-jobs", finished_jobs)->capture_default_str();
  app.add_option("--repeat", repeat)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/minions-bench-metrics-", getpid());
  std::filesystem::create_directories(dir);
  auto store = Must(SqliteMetadataStore::Open(dir + "/minions.db", StoreOptions{}), "open store");
  testing::FakeClock clock;
  std::vector<std::string> ids;
  for (int e = 0; e < executors; ++e) {
    ExecutorInfo info;
    info.name = absl::StrCat("e", e);
    info.memory_bytes = int64_t{16} << 30;
    info.runners = {"llama"};
    info.max_tasks = 64;
    ids.push_back(Must(store->RegisterExecutor("", info, clock.Now()), "register").id);
  }
  for (int j = 0; j < finished_jobs; ++j) {
    std::string job = MakeJob(*store, 1, clock.Now());
    auto lease = Must(store->LeaseTasks(ids[j % executors], 1, absl::Hours(1), clock.Now()), "lease");
    if (lease.empty() || !store->CompleteTask(ids[j % executors], job, 0, lease[0].task.attempt, 10, 0, clock.Now()).ok()) {
      Die("complete");
    }
    if (!store->FinishJob(job, "o", "e", "m", clock.Now()).ok()) Die("finish");
  }
  for (int j = 0; j < running_jobs; ++j) MakeJob(*store, tasks, clock.Now());
  for (int e = 0; e < executors; ++e) {
    Must(store->LeaseTasks(ids[e], running_jobs * tasks / 4 / executors + 1, absl::Hours(1), clock.Now()), "lease");
  }

  double bare = MedianMs(repeat, [&] {
    for (JobState s : {JobState::kValidating, JobState::kQueued, JobState::kRunning, JobState::kFinalizing}) {
      auto jobs = Must(store->ListJobs(JobFilter{s, "", FleetView::kMaxJobs}), "list jobs");
      for (const Job& job : jobs) {
        if (job.state == JobState::kRunning) Must(store->ListTasks(job.id), "list tasks");
      }
    }
    Must(store->ListJobs(JobFilter{std::nullopt, "", FleetView::kRecentJobs}), "recent jobs");
    Must(store->ListExecutors(), "list executors");
  });
  double terminal = MedianMs(repeat, [&] {
    for (JobState s : {JobState::kCompleted, JobState::kFailed, JobState::kCancelled, JobState::kExpired}) {
      Must(store->ListJobs(JobFilter{s, "", FleetView::kMaxJobs}), "list ended jobs");
    }
  });
  metrics::Registry registry;
  ProgressTracker progress;
  FleetView fleet(store.get(), &clock, &progress, absl::Seconds(1), absl::Hours(24));  // (d) apart
  registry.Render();  // the first refresh counts the ended jobs
  fleet.ExportMetrics(&registry);
  size_t bytes = 0;
  double stale = MedianMs(repeat, [&] {
    clock.Advance(absl::Seconds(2));  // past the cache period: every scrape refreshes
    bytes = registry.Render().size();
  });
  double cached = MedianMs(repeat, [&] { registry.Render(); });
  printf("fleet: %d executors, %d running jobs x %d tasks, %d finished jobs (SQLite)\n", executors, running_jobs, tasks,
         finished_jobs);
  printf("  (a) bare store reads            %8.2f ms\n", bare);
  printf("  (b) scrape, gauges refreshed    %8.2f ms   %.2fx (a)   %zu bytes\n", stale, stale / bare, bytes);
  printf("  (c) scrape within cache period  %8.3f ms   %.3fx (a)\n", cached, cached / bare);
  printf("  (d) counting the ended jobs      %8.2f ms   %.2fx (a)   (after a job ends, at most every 5 s; every 30 s)\n", terminal,
         terminal / bare);
  std::filesystem::remove_all(dir);
  // A scrape that rendered nothing measured nothing (the suite's smoke run fails on it).
  return bytes > 0 && stale > 0 && bare > 0 ? 0 : 1;
}
