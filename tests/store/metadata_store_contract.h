#pragma once
// The MetadataStore contract: one scenario suite every backend passes. A backend's test file
// instantiates it with a factory that makes a fresh, empty store with default StoreOptions:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, MetadataStoreContract,
//                            ::testing::Values(StoreFactory([] { return ...; })));
//
// The suite's tests live in metadata_store_contract.cc, report_contract.cc and listing_contract.cc (linked once into the test binary,
// whatever the number of backends). Time is an absl::Time the tests advance; nothing sleeps.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/status_checks.h"

namespace minions {

// The matchers the contract suites read with.
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

using StoreFactory = std::function<std::unique_ptr<MetadataStore>()>;
// What GoogleTest prints for the parameter (found by ADL through MetadataStore); the instance
// name (e.g. Sqlite/.../File) says which backend it is.
inline void PrintTo(const StoreFactory&, std::ostream* os) { *os << "a store factory"; }

// A status's message, for the matchers (HasSubstr...).
inline std::string Message(const absl::Status& status) { return std::string(status.message()); }

// A job's state and counts (tasks done and succeeded, records completed and failed), compared at
// once.
struct JobTally {
  JobState state;
  int64_t tasks_done;
  int64_t tasks_succeeded;
  int64_t completed;
  int64_t failed;
  bool operator==(const JobTally&) const = default;
};
inline JobTally TallyOf(const Job& job) {
  return JobTally{job.state, job.tasks_done, job.tasks_succeeded, job.counts.completed, job.counts.failed};
}
inline void PrintTo(const JobTally& t, std::ostream* os) {
  *os << JobStateName(t.state) << ", tasks done " << t.tasks_done << " (succeeded " << t.tasks_succeeded
      << "), records completed " << t.completed << ", failed " << t.failed;
}

// Executor t of `executors` leases from stores[t] on a thread of its own, batch(t) tasks a call,
// until nothing is left: what each was granted (failed calls are reported and counted).
struct ConcurrentLeases {
  std::vector<std::vector<Lease>> granted;  // by executor
  int errors = 0;
};
inline ConcurrentLeases LeaseConcurrently(const std::vector<MetadataStore*>& stores,
                                          const std::vector<std::string>& executors,
                                          const std::function<int(int)>& batch, absl::Duration ttl, absl::Time now) {
  std::vector<std::vector<Lease>> granted(executors.size());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < executors.size(); ++t) {
    threads.emplace_back([&, t] {
      while (true) {
        absl::StatusOr<std::vector<Lease>> leases = stores[t]->LeaseTasks(executors[t], batch(t), ttl, now);
        if (!leases.ok()) {
          ADD_FAILURE() << leases.status();
          ++errors;
          return;
        }
        if (leases->empty()) return;  // nothing pending is left
        for (Lease& lease : *leases) granted[t].push_back(std::move(lease));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return ConcurrentLeases{std::move(granted), errors.load()};
}

class MetadataStoreContract : public ::testing::TestWithParam<StoreFactory> {
 protected:
  static constexpr int64_t kGiB = int64_t{1} << 30;
  static constexpr int64_t kRecordsPerTask = 10;
  const absl::Duration kTtl = absl::Seconds(30);
  const RetryPolicy kRetry{};  // the factory's stores use default StoreOptions

  void SetUp() override {
    store_ = GetParam()();
    ASSERT_NE(store_, nullptr);
  }

  void Advance(absl::Duration d) { now_ += d; }

  // The value of a call that must succeed (a helper cannot ASSERT; a failure throws, which the
  // test reports and stops at).
  template <typename T>
  static T Must(absl::StatusOr<T> result, const char* what) {
    if (!result.ok()) {
      ADD_FAILURE() << what << ": " << result.status();
      throw std::runtime_error(what);
    }
    return std::move(result).value();
  }
  static void Must(const absl::Status& status, const char* what) {
    if (!status.ok()) {
      ADD_FAILURE() << what << ": " << status;
      throw std::runtime_error(what);
    }
  }

  static JobSpec Spec(int priority = 0, int max_attempts = 4, int64_t min_memory_bytes = 0,
                      const std::string& runner = "llama") {
    JobSpec spec;
    spec.team = "search";
    spec.model = "/models/tiny.gguf";
    spec.input_key = "inputs/in.jsonl";
    spec.shard_size = kRecordsPerTask;
    spec.priority = priority;
    spec.max_attempts = max_attempts;
    spec.requirements.min_memory_bytes = min_memory_bytes;
    spec.requirements.runner = runner;
    spec.runner_options = Json{{"n_parallel", 2}};
    return spec;
  }

  static std::vector<Task> Shards(int n_tasks) { return testing::EvenTasks(n_tasks, kRecordsPerTask, 1000); }

  // Creates a job and gives it `n_tasks` tasks of kRecordsPerTask records: a queued job. Time
  // moves on a second, so jobs submitted one after the other have distinct ages.
  std::string Submit(const JobSpec& spec, int n_tasks) {
    Job job = Must(store_->CreateJob(spec, now_), "CreateJob");
    Must(store_->AddTasks(job.id, Shards(n_tasks), n_tasks * kRecordsPerTask, now_), "AddTasks");
    Advance(absl::Seconds(1));
    return job.id;
  }

  std::string Register(const std::string& name, int64_t memory_bytes = 8 * kGiB,
                       std::vector<std::string> runners = {"llama"}) {
    ExecutorInfo info;
    info.name = name;
    info.os = "linux";
    info.memory_bytes = memory_bytes;
    info.runners = std::move(runners);
    info.max_tasks = 4;
    return Must(store_->RegisterExecutor("", info, now_), "RegisterExecutor").id;
  }

  // Registers an executor of each name (Register's defaults): their ids, in order.
  template <size_t N>
  std::array<std::string, N> RegisterAll(const char* const (&names)[N]) {
    std::array<std::string, N> ids;
    for (size_t i = 0; i < N; ++i) ids[i] = Register(names[i]);
    return ids;
  }

  std::vector<Lease> LeaseUpTo(const std::string& executor_id, int max_tasks) {
    return Must(store_->LeaseTasks(executor_id, max_tasks, kTtl, now_), "LeaseTasks");
  }
  // Leases that must be exactly `n_tasks` (a failure stops the test, as Must's do).
  std::vector<Lease> LeaseExactly(const std::string& executor_id, int n_tasks) {
    std::vector<Lease> leases = LeaseUpTo(executor_id, n_tasks);
    if (leases.size() != static_cast<size_t>(n_tasks)) {
      ADD_FAILURE() << executor_id << " leased " << leases.size() << " tasks, not " << n_tasks;
      throw std::runtime_error("LeaseTasks");
    }
    return leases;
  }

  Job GetJob(const std::string& job_id) { return Must(store_->GetJob(job_id), "GetJob"); }
  Task GetTask(const std::string& job_id, int64_t index) {
    for (Task& task : Must(store_->ListTasks(job_id), "ListTasks")) {
      if (task.index == index) return task;
    }
    ADD_FAILURE() << "no task " << job_id << "/" << index;
    throw std::runtime_error("no such task");
  }
  Executor GetExecutor(const std::string& executor_id) {
    return Must(store_->GetExecutor(executor_id), "GetExecutor");
  }

  static LeaseProgress Progress(const Lease& lease, int64_t done = 0, int64_t failed = 0) {
    return LeaseProgress{lease.task.job_id, lease.task.index, lease.task.attempt, done, failed};
  }

  std::unique_ptr<MetadataStore> store_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace minions
