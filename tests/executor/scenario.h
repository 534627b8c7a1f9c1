#pragma once
// Scenario: the executor's stories told on fake time. A FakeControlPlane and any number of
// executors — the real ExecutorAgent, each with its fake runner (FakeRunner), a blob client that
// can fail, and an owner's work gate the test sets — all driven from the test's one thread.
// RunUntil() plays time forward as a discrete-event simulation: whatever is due now runs (each
// executor's main loop pass and heartbeat, its runner's records, the server's finaliser and
// watchdog), then the clock jumps to the next thing due. No thread, no sleep: an hour of leases
// and heartbeats takes milliseconds, and a run is the same every time.
// Threads: one (the test's).

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "executor/agent.h"
#include "fake_control_plane.h"
#include "testing/fake_clock.h"
#include "testing/fake_runner.h"

namespace minions::testing {

// The owner's side as the agent sees it, set by the test.
class FakeWorkGate : public WorkGate {
 public:
  explicit FakeWorkGate(Clock* clock) : clock_(clock), since_(clock->Now()) {}
  void Set(WorkMode mode) {
    if (mode == mode_) return;
    mode_ = mode;
    since_ = clock_->Now();
  }
  WorkMode mode() const override { return mode_; }
  absl::Time mode_since() const override { return since_; }
  std::string FleetState(bool holds_work) const override {
    if (mode_ == WorkMode::kRun || mode_ == WorkMode::kThrottle) return holds_work ? "busy" : "available";
    return "owner_active";
  }
  std::string Reason() const override { return mode_ == WorkMode::kRun ? "" : "owner active (test)"; }
  absl::Duration pause_grace() const override { return absl::Milliseconds(100); }

 private:
  Clock* clock_;
  WorkMode mode_ = WorkMode::kRun;
  absl::Time since_;
};

// The gang network on fake time (executor/gang_link.h), one for every executor of a scenario: a
// member serves a duty at its gang address until it stops; a gate answers while its member serves
// it and the test has not cut it.
class FakeGangNetwork : public GangLink {
 public:
  absl::StatusOr<std::unique_ptr<GangService>> Serve(const GangMemberOptions& options) override;
  bool Answers(const std::string& endpoint, const std::string& secret) override;

  // The test's hands: the gate at `endpoint` answers no more (its machine vanished), until a new
  // duty is served there.
  void Cut(const std::string& endpoint) { cut_.insert(endpoint); }
  // The next `n` questions about `endpoint` are answered yes, then no (it goes away meanwhile).
  void CutAfter(const std::string& endpoint, int n) { answers_left_[endpoint] = n; }
  // The facts: whether a member serves at `endpoint` now; duties ever served; questions asked.
  bool serving(const std::string& endpoint) const { return serving_.contains(endpoint); }
  int served() const { return served_; }
  int asked() const { return asked_; }

 private:
  class Service;
  std::set<std::string> serving_;
  std::set<std::string> cut_;
  std::map<std::string, std::string> secrets_;  // each gate's attempt secret (its duty's)
  std::map<std::string, int> answers_left_;
  int served_ = 0;
  int asked_ = 0;
};

class Scenario {
 public:
  struct Executor {
    std::string name;
    FakeRunnerScript runner;                     // how its runners behave; their tally
    std::unique_ptr<FakeRunnerFactory> runners;  // ... and the live one
    // Runners declared beside the built-in one (AgentOptions::declared_runners), by name: their
    // scripts and factories (AddExecutor fills them from `declared`).
    std::map<std::string, std::unique_ptr<FakeRunnerScript>> declared_scripts;
    std::map<std::string, std::shared_ptr<FakeRunnerFactory>> declared;
    FaultyBlobClient* blobs = nullptr;           // owned by the agent
    std::unique_ptr<FakeWorkGate> gate;
    std::unique_ptr<ExecutorAgent> agent;
    absl::Time next_step;
    bool gone = false;                           // crashed: no longer stepped (Crash())
    std::string id() const { return agent->id(); }
  };

  explicit Scenario(FakeControlPlane::Options server_options = {});

  // Options of a test executor: a quick prefetch and checkpoint cadence, short timeouts.
  static AgentOptions DefaultOptions();
  // ... of an executor whose gang address is `address` (on the scenario's FakeGangNetwork).
  static AgentOptions GangOptions(const std::string& address);
  // `declared`: names of runners the executor offers beside the built-in one (fake runners too).
  Executor& AddExecutor(const std::string& name, AgentOptions options = DefaultOptions(),
                        const std::vector<std::string>& declared = {});
  // An executor with the default options whose runner takes `per_record` to answer a record.
  Executor& AddExecutorTaking(const std::string& name, absl::Duration per_record) {
    Executor& e = AddExecutor(name);
    e.runner.record_time = per_record;
    return e;
  }
  Executor& executor(const std::string& name) { return *executors_.at(name); }
  // The executor vanishes (power cut): it takes no further step and sends nothing.
  void Crash(const std::string& name) { executor(name).gone = true; }

  // `n` records {"custom_id": "r<i>", "prompt": "x"}; the prompt of those in `marked` is "<mark>".
  static std::vector<std::string> Records(int n, const std::map<int, std::string>& marked = {});
  std::string Submit(const std::vector<std::string>& lines, int64_t shard_size, int max_attempts = 0,
                     absl::Duration completion_window = absl::ZeroDuration(), const std::string& runner = "",
                     const std::string& model = "", int gang_size = 0);

  // Plays time until `done()` holds (true) or `limit` of fake time has passed (false).
  bool RunUntil(const std::function<bool()>& done, absl::Duration limit = absl::Hours(1));
  void RunFor(absl::Duration d);
  // Until the job is completed, failed, cancelled or expired.
  bool RunUntilJobEnds(const std::string& job_id, absl::Duration limit = absl::Hours(1));
  // The same, succeeding when the job ended in `state` (the failure says how it ended, and why).
  ::testing::AssertionResult RunsToEndAs(const std::string& job_id, JobState state,
                                         absl::Duration limit = absl::Hours(1));
  bool RunUntilFinished(const std::string& executor_name, absl::Duration limit = absl::Hours(1));

  // The story's facts.
  absl::Duration elapsed() const { return clock.Now() - start_; }
  Job job(const std::string& id) { return server.GetJob(id); }
  std::vector<Task> tasks(const std::string& id) { return server.Tasks(id); }
  // Every custom_id of the job's records in its output and error files exactly once; how many
  // were in the error file.
  void ExpectEachRecordOnce(const std::string& job_id, int n_records);
  // The job completed, every record once, `poison` (a custom_id) its one error record
  // (runner_crashed), and no task failed or ran a second attempt: a poison record isolated.
  void ExpectPoisonIsolated(const std::string& job_id, int n_records, const std::string& poison);
  // Leases the server holds for this executor, as a count of running tasks.
  int RunningTasksOf(const std::string& executor_name);

  FakeClock clock;
  FakeControlPlane server;
  // Every executor with a gang address meets this one (AddExecutor sets it).
  std::shared_ptr<FakeGangNetwork> gangs = std::make_shared<FakeGangNetwork>();

 private:
  // One instant: runs whatever is due; true if anything ran.
  bool RunDue();
  absl::Time NextDue() const;

  absl::Time start_;
  std::map<std::string, std::unique_ptr<Executor>> executors_;
};

}  // namespace minions::testing
