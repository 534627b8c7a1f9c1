#pragma once
// The fair-share half of the store contract (fair_share_contract.cc): teams' weights, usage and
// running-task quotas in the lease order. Instantiated wherever IdentityStoreContract is.

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "identity_store_contract.h"

namespace minions {

// Long enough that no lease expires in a simulation (nothing heartbeats there).
inline const absl::Duration kSimTtl = absl::Hours(12);

class FairShare : public IdentityStoreContract {
 protected:
  Team WeightedTeam(const std::string& name, int64_t weight, int64_t max_running_tasks = 0) {
    Team team = NewTeam(name);
    team.weight = weight;
    team.max_running_tasks = max_running_tasks;
    return team;
  }

  // A job of `team` with `n_tasks` tasks.
  std::string SubmitFor(const std::string& team, int n_tasks, int priority = 0) {
    JobSpec spec = Spec(priority);
    spec.team = team;
    const std::string id = Submit(spec, n_tasks);
    team_of_job_[id] = team;
    return id;
  }

  TeamUsage UsageOf(const std::string& team) {
    for (const TeamUsage& usage : Must(store_->ListTeamUsage(now_), "ListTeamUsage")) {
      if (usage.team == team) return usage;
    }
    return TeamUsage{team};
  }

  // One simulated executor: one task at a time, each taking `task_time`.
  struct SimExecutor {
    std::string id;
    absl::Duration task_time;
    std::optional<Lease> lease;
    absl::Time started;
    absl::Time free_at;
  };

  // `n` executors whose task times spread over [50 s, 70 s] (so they do not all come back at
  // once); all idle now.
  std::vector<SimExecutor> Fleet(int n) {
    std::vector<SimExecutor> fleet;
    for (int i = 0; i < n; ++i) {
      fleet.push_back({Register(absl::StrCat("sim-", i)), absl::Seconds(50 + (i * 7) % 21), std::nullopt, now_, now_});
    }
    return fleet;
  }

  // Runs the fleet until `until`: an executor whose task is done completes it and leases the
  // next; one that got nothing asks again a second later. Adds to `held` the executor time each
  // team's attempts ran inside [window_begin, until). With `batched_`, the executors free at one
  // moment complete first and then lease in one LeaseMany (as a server's lease batcher gathers
  // them).
  void Run(std::vector<SimExecutor>& fleet, absl::Time until, absl::Time window_begin,
           std::map<std::string, absl::Duration>& held) {
    while (now_ < until) {
      std::vector<SimExecutor*> asking;
      for (SimExecutor& e : fleet) {
        if (e.free_at > now_) continue;
        if (e.lease) Finish(e, window_begin, held);
        if (batched_) {
          asking.push_back(&e);
          continue;
        }
        Take(e, Must(store_->LeaseTasks(e.id, 1, kSimTtl, now_), "LeaseTasks"));
      }
      if (!asking.empty()) {
        std::vector<LeaseAsk> asks;
        for (const SimExecutor* e : asking) asks.push_back({e->id, 1});
        auto answers = Must(store_->LeaseMany(asks, kSimTtl, now_), "LeaseMany");
        for (size_t i = 0; i < asking.size(); ++i) Take(*asking[i], Must(std::move(answers.at(i)), "a lease"));
      }
      absl::Time next = until;
      for (const SimExecutor& e : fleet) next = std::min(next, e.free_at);
      now_ = std::max(next, now_ + absl::Milliseconds(1));
    }
    // What is still running counts up to `until`.
    for (const SimExecutor& e : fleet) {
      if (e.lease) held[team_of_job_.at(e.lease->task.job_id)] += until - std::max(e.started, window_begin);
    }
  }

  // `e` starts what it was granted, or asks again a second later.
  void Take(SimExecutor& e, const std::vector<Lease>& leases) {
    if (leases.empty()) {
      e.free_at = now_ + absl::Seconds(1);
      return;
    }
    e.lease = leases[0];
    e.started = now_;
    e.free_at = now_ + e.task_time;
  }

  void Finish(SimExecutor& e, absl::Time window_begin, std::map<std::string, absl::Duration>& held) {
    const Task& task = e.lease->task;
    Must(store_->CompleteTask(e.id, task.job_id, task.index, task.attempt, task.n_records, 0, now_), "CompleteTask");
    if (now_ > window_begin) held[team_of_job_.at(task.job_id)] += now_ - std::max(e.started, window_begin);
    e.lease.reset();
  }

  // search (weight 3) and ads (weight 1), each with plenty of work, on 8 executors: over the
  // second simulated hour each team's share is its weight's (within 10 %).
  void TwoTeamsConverge() {
    ASSERT_OK(store_->CreateTeam(WeightedTeam("search", 3)));
    ASSERT_OK(store_->CreateTeam(WeightedTeam("ads", 1)));
    SubmitFor("search", 1000);
    SubmitFor("ads", 1000);
    const std::map<std::string, double> shares = SharesOfTheSecondHour(8);
    EXPECT_NEAR(shares.at("search"), 0.75, 0.075);
    EXPECT_NEAR(shares.at("ads"), 0.25, 0.025);
  }

  // A fleet of `executors` runs what is queued for two simulated hours: each team's share of the
  // executor time of the second (the first lets usage settle).
  std::map<std::string, double> SharesOfTheSecondHour(int executors) {
    std::vector<SimExecutor> fleet = Fleet(executors);
    std::map<std::string, absl::Duration> warmup, held;
    const absl::Time start = now_;
    Run(fleet, start + absl::Hours(1), start + absl::Hours(1), warmup);
    Run(fleet, start + absl::Hours(2), start + absl::Hours(1), held);
    return Shares(held);
  }

  // Teams "batch" (weight 10, at most 3 running tasks) and "ads" (weight 1), 500 tasks each, on a
  // fleet of 6 for 30 simulated minutes: checks the quota each minute and that the fleet was never
  // idle; answers the most tasks "batch" ran at once.
  int64_t RunAQuotaOverASimulatedFleet() {
    EXPECT_OK(store_->CreateTeam(WeightedTeam("batch", 10, /*max_running_tasks=*/3)));
    EXPECT_OK(store_->CreateTeam(WeightedTeam("ads", 1)));
    SubmitFor("batch", 500);
    SubmitFor("ads", 500);
    std::vector<SimExecutor> fleet = Fleet(6);
    std::map<std::string, absl::Duration> held;
    int64_t most = 0;
    for (int minute = 0; minute < 30; ++minute) {
      Run(fleet, now_ + absl::Minutes(1), now_, held);
      most = std::max(most, UsageOf("batch").running);
      EXPECT_LE(UsageOf("batch").running, 3);
    }
    // The rest of the fleet was not left idle.
    EXPECT_EQ(held["batch"] + held["ads"], 6 * absl::Minutes(30));
    return most;
  }

  static std::map<std::string, double> Shares(const std::map<std::string, absl::Duration>& held) {
    absl::Duration total;
    for (const auto& [team, time] : held) total += time;
    std::map<std::string, double> shares;
    for (const auto& [team, time] : held) shares[team] = absl::FDivDuration(time, total);
    return shares;
  }

  std::map<std::string, std::string> team_of_job_;
  bool batched_ = false;  // Run leases the executors free at one moment in one LeaseMany
};

// Placement (issue 11) over the same fixture: executors that hold models, jobs that need them.
class Placement : public FairShare {
 protected:
  std::string RegisterHolding(const std::string& name, int64_t usable_memory, std::vector<std::string> cached,
                              const std::string& loaded) {
    ExecutorInfo info;
    info.name = name;
    info.os = "linux";
    info.memory_bytes = 64 * kGiB;
    info.usable_memory_bytes = usable_memory;
    info.runners = {"llama"};
    info.models = std::move(cached);
    info.model_loaded = loaded;
    info.max_tasks = 4;
    return Must(store_->RegisterExecutor("", info, now_), "RegisterExecutor").id;
  }
  // A job of `n_tasks` that needs model `digest` ("": a path); time moves on 10 ms (distinct
  // ages, well within the warm-executor wait).
  std::string SubmitModel(const std::string& digest, int n_tasks, int64_t min_memory = 0) {
    JobSpec spec = Spec(0, 4, min_memory);
    spec.model_digest = digest;
    Job job = Must(store_->CreateJob(spec, now_), "CreateJob");
    Must(store_->AddTasks(job.id, Shards(n_tasks), n_tasks * kRecordsPerTask, now_), "AddTasks");
    Advance(absl::Milliseconds(10));
    return job.id;
  }
  static std::string Digest(char c) { return "sha256:" + std::string(64, c); }

  // What a two-model workload did to the fleet (RunTwoModels).
  struct ModelTraffic {
    int loads = 0;                  // a runner loaded a model (its first included)
    std::vector<int> switches;      // per executor: loads that replaced another loaded model
    std::vector<int> late_switches; // per executor: switches in the second half of the run
    int tasks = 0;                  // tasks completed
  };

  // Two models' jobs alternate (A, B, A, ...: one every 2 s, 2 tasks each) over four executors
  // that run one task at a time, taking 1, 1.5, 2 and 2.5 s a task (so they come back at
  // different times; the fleet is about 40% busy, and an executor comes free within the stores'
  // 3 s warm-executor wait), for `length`. Every half second the free executors ask for work, in
  // an order that rotates each time (so no executor is always first); each reports in a
  // heartbeat what it has loaded and cached, as the agent does, and keeps its runner loaded
  // between tasks. The executors start with `cached` in their caches and nothing loaded.
  ModelTraffic RunTwoModels(const std::vector<std::string>& cached, absl::Duration length) {
    struct Machine {
      std::string id;
      absl::Duration task_time;
      std::optional<Lease> lease;
      absl::Time free_at;
      std::string loaded;
      std::vector<std::string> cached;
    };
    std::vector<Machine> fleet;
    for (int i = 0; i < 4; ++i) {
      fleet.push_back({RegisterHolding(absl::StrCat("two-", i), 32 * kGiB, cached, ""), absl::Milliseconds(1000 + 500 * i),
                       std::nullopt, now_, "", cached});
    }
    ModelTraffic traffic;
    traffic.switches.assign(fleet.size(), 0);
    traffic.late_switches.assign(fleet.size(), 0);
    const absl::Time end = now_ + length, half = now_ + length / 2;
    absl::Time next_job = now_;
    int jobs = 0;
    for (int tick = 0; now_ < end; ++tick) {
      if (now_ >= next_job) {
        const std::string digest = Digest(jobs++ % 2 == 0 ? 'a' : 'b');
        JobSpec spec = Spec();
        spec.model_digest = digest;
        Job job = Must(store_->CreateJob(spec, now_), "CreateJob");
        Must(store_->AddTasks(job.id, Shards(2), 2 * kRecordsPerTask, now_), "AddTasks");
        next_job = now_ + absl::Seconds(2);
      }
      for (size_t k = 0; k < fleet.size(); ++k) {
        const size_t i = (k + tick) % fleet.size();
        Machine& m = fleet[i];
        if (m.free_at > now_) continue;
        if (m.lease) {
          const Task& task = m.lease->task;
          Must(store_->CompleteTask(m.id, task.job_id, task.index, task.attempt, task.n_records, 0, now_),
               "CompleteTask");
          ++traffic.tasks;
          m.lease.reset();
        }
        std::vector<Lease> got = Must(store_->LeaseTasks(m.id, 1, kSimTtl, now_), "LeaseTasks");
        if (got.empty()) continue;
        const std::string& digest = got[0].model_digest;
        if (digest != m.loaded) {
          ++traffic.loads;
          if (!m.loaded.empty()) {
            ++traffic.switches[i];
            if (now_ >= half) ++traffic.late_switches[i];
          }
          m.loaded = digest;
          if (std::find(m.cached.begin(), m.cached.end(), digest) == m.cached.end()) m.cached.push_back(digest);
          Must(store_->Heartbeat(m.id, ExecutorState::kBusy, "", {}, kSimTtl, now_, ModelHoldings{m.cached, m.loaded}),
               "Heartbeat");
        }
        m.lease = got[0];
        m.free_at = now_ + m.task_time;
      }
      now_ += absl::Milliseconds(500);
    }
    return traffic;
  }
};

}  // namespace minions
