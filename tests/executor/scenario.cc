#include "scenario.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace minions::testing {

Scenario::Scenario(FakeControlPlane::Options server_options) : server(&clock, server_options), start_(clock.Now()) {}

AgentOptions Scenario::DefaultOptions() {
  AgentOptions options;
  options.name = "test";
  options.checkpoint_records = 10;
  options.checkpoint_interval = absl::Seconds(5);
  options.hang.min_silence = absl::Seconds(30);
  options.load_timeout = absl::Minutes(1);
  return options;
}

class FakeGangNetwork::Service : public GangService {
 public:
  Service(FakeGangNetwork* network, std::string endpoint) : network_(network), endpoint_(std::move(endpoint)) {}
  ~Service() override { Stop(); }
  const std::string& endpoint() const override { return endpoint_; }
  int64_t refused() const override { return 0; }
  int64_t admitted() const override { return 0; }
  int64_t bytes_in() const override { return 0; }
  int64_t bytes_out() const override { return 0; }
  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    network_->serving_.erase(endpoint_);
  }

 private:
  FakeGangNetwork* network_;
  std::string endpoint_;
  bool stopped_ = false;
};

absl::StatusOr<std::unique_ptr<GangService>> FakeGangNetwork::Serve(const GangMemberOptions& options) {
  std::string endpoint = absl::StrCat(options.bind_host, ":", options.port);
  if (serving_.contains(endpoint)) return absl::UnavailableError(absl::StrCat(endpoint, " is in use"));
  serving_.insert(endpoint);
  secrets_[endpoint] = options.secret;
  cut_.erase(endpoint);  // a new gate
  answers_left_.erase(endpoint);
  ++served_;
  return std::make_unique<Service>(this, std::move(endpoint));
}

bool FakeGangNetwork::Answers(const std::string& endpoint, const std::string& secret) {
  ++asked_;
  if (auto left = answers_left_.find(endpoint); left != answers_left_.end()) {
    if (left->second-- <= 0) cut_.insert(endpoint);
  }
  // As the real gate: it answers only a leader that proves the attempt's secret.
  auto served = secrets_.find(endpoint);
  return serving_.contains(endpoint) && !cut_.contains(endpoint) && served != secrets_.end() &&
         !secret.empty() && served->second == secret;
}

AgentOptions Scenario::GangOptions(const std::string& address) {
  AgentOptions options = DefaultOptions();
  AgentOptions::Gang gang;
  gang.address = address;
  options.gang = gang;
  return options;
}

Scenario::Executor& Scenario::AddExecutor(const std::string& name, AgentOptions options,
                                          const std::vector<std::string>& declared) {
  auto e = std::make_unique<Executor>();
  e->name = name;
  options.name = name;
  if (options.gang && !options.gang->link) options.gang->link = gangs;
  for (const std::string& runner : declared) {
    auto script = std::make_unique<FakeRunnerScript>();
    auto factory = std::make_shared<FakeRunnerFactory>(&clock, script.get());
    options.declared_runners[runner] = factory;
    options.runners.push_back(runner);
    e->declared[runner] = factory;
    e->declared_scripts[runner] = std::move(script);
  }
  if (!options.models) {  // the owner's model folder holds the server's model
    ModelAccessOptions models;
    models.folders = {server.models_dir()};
    auto access = ModelAccess::Create(models);
    if (!access.ok()) std::abort();
    options.models = std::make_shared<const ModelAccess>(*std::move(access));
  }
  e->runners = std::make_unique<FakeRunnerFactory>(&clock, &e->runner);
  auto blobs = std::make_unique<FaultyBlobClient>(std::make_unique<UrlBlobClient>());
  e->blobs = blobs.get();
  e->gate = std::make_unique<FakeWorkGate>(&clock);

  // The agent owns its factory; this one forwards to the executor's, which the test inspects.
  class Forward : public RunnerFactory {
   public:
    explicit Forward(FakeRunnerFactory* to) : to_(to) {}
    absl::StatusOr<std::unique_ptr<Runner>> Start(std::function<void()> on_event) override {
      return to_->Start(std::move(on_event));
    }
    absl::StatusOr<std::unique_ptr<Runner>> StartConnecting(std::function<void()> on_event,
                                                            const std::vector<int>& tcp_ports) override {
      return to_->StartConnecting(std::move(on_event), tcp_ports);
    }

   private:
    FakeRunnerFactory* to_;
  };
  e->agent = std::make_unique<ExecutorAgent>(options, server.NewClient(), std::move(blobs),
                                             std::make_unique<Forward>(e->runners.get()), &clock);
  e->agent->SetWorkGate(e->gate.get());
  e->next_step = clock.Now();
  Executor& ref = *e;
  executors_[name] = std::move(e);
  return ref;
}

std::vector<std::string> Scenario::Records(int n, const std::map<int, std::string>& marked) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    auto it = marked.find(i);
    lines.push_back(absl::StrCat("{\"custom_id\":\"r", i, "\",\"prompt\":\"", it == marked.end() ? "x" : it->second,
                                 "\"}"));
  }
  return lines;
}

std::string Scenario::Submit(const std::vector<std::string>& lines, int64_t shard_size, int max_attempts,
                             absl::Duration completion_window, const std::string& runner,
                             const std::string& model, int gang_size) {
  auto job = server.Submit(lines, shard_size, max_attempts, completion_window, runner, model, gang_size);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : "";
}

bool Scenario::RunDue() {
  const absl::Time now = clock.Now();
  bool ran = false;
  for (auto& [name, e] : executors_) {
    if (e->gone || e->agent->finished()) continue;
    absl::Time runner_event = e->runners->NextEventAt();
    for (const auto& [runner, factory] : e->declared) runner_event = std::min(runner_event, factory->NextEventAt());
    if (e->next_step <= now || runner_event <= now) {
      e->next_step = e->agent->Step();
      ran = true;
    }
    if (e->agent->NextBeat() <= now) {
      e->agent->Beat();
      e->next_step = now;  // what the server answered (a cancel, a drain) is for the main loop
      ran = true;
    }
  }
  if (server.NextTickAt() <= now) {
    server.Tick(now);
    ran = true;
  }
  return ran;
}

absl::Time Scenario::NextDue() const {
  absl::Time next = server.NextTickAt();
  for (const auto& [name, e] : executors_) {
    if (e->gone || e->agent->finished()) continue;
    next = std::min({next, e->next_step, e->runners->NextEventAt(), e->agent->NextBeat()});
    for (const auto& [runner, factory] : e->declared) next = std::min(next, factory->NextEventAt());
  }
  return next;
}

bool Scenario::RunUntil(const std::function<bool()>& done, absl::Duration limit) {
  const absl::Time end = clock.Now() + limit;
  // A ring from outside (a test's Drain(), a new mode) is seen by the next pass.
  for (auto& [name, e] : executors_) e->next_step = std::min(e->next_step, clock.Now());
  int passes_this_instant = 0;
  while (!done()) {
    if (RunDue()) {
      // Everything due at one instant settles in a few passes; thousands mean a loop that spins.
      if (++passes_this_instant > 100000) {
        ADD_FAILURE() << "the executors spin at " << absl::FormatTime(clock.Now()) << " without time moving";
        return false;
      }
      continue;
    }
    passes_this_instant = 0;
    const absl::Time next = NextDue();
    if (next > end) {
      clock.Advance(end - clock.Now());
      return done();
    }
    clock.Advance(std::max(absl::ZeroDuration(), next - clock.Now()));
  }
  return true;
}

void Scenario::RunFor(absl::Duration d) {
  const absl::Time end = clock.Now() + d;
  RunUntil([&] { return clock.Now() >= end; }, d);
}

bool Scenario::RunUntilJobEnds(const std::string& job_id, absl::Duration limit) {
  return RunUntil(
      [&] {
        JobState state = server.GetJob(job_id).state;
        return state == JobState::kCompleted || state == JobState::kFailed || state == JobState::kCancelled ||
               state == JobState::kExpired;
      },
      limit);
}

::testing::AssertionResult Scenario::RunsToEndAs(const std::string& job_id, JobState state, absl::Duration limit) {
  if (!RunUntilJobEnds(job_id, limit)) {
    return ::testing::AssertionFailure() << "job " << job_id << " did not end within " << limit;
  }
  Job ended = job(job_id);
  if (ended.state != state) {
    return ::testing::AssertionFailure() << "job " << job_id << " ended " << JobStateName(ended.state) << ", not "
                                         << JobStateName(state) << ": " << ended.error;
  }
  return ::testing::AssertionSuccess();
}

bool Scenario::RunUntilFinished(const std::string& executor_name, absl::Duration limit) {
  return RunUntil([&] { return executor(executor_name).agent->finished(); }, limit);
}

void Scenario::ExpectEachRecordOnce(const std::string& job_id, int n_records) {
  std::map<std::string, int> seen;
  for (bool errors : {false, true}) {
    for (const Json& line : server.Results(job_id, errors)) ++seen[JsonString(line, "custom_id")];
  }
  std::vector<std::string> wrong;
  for (int i = 0; i < n_records; ++i) {
    const std::string id = absl::StrCat("r", i);
    auto it = seen.find(id);
    int times = it == seen.end() ? 0 : it->second;
    if (times != 1) wrong.push_back(absl::StrCat(id, " x", times));
    if (it != seen.end()) seen.erase(it);
  }
  for (const auto& [id, times] : seen) wrong.push_back(absl::StrCat("unexpected ", id, " x", times));
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " records not exactly once, e.g. "
                             << (wrong.empty() ? "" : wrong.front());
}

void Scenario::ExpectPoisonIsolated(const std::string& job_id, int n_records, const std::string& poison) {
  Job done = job(job_id);
  ASSERT_EQ(done.state, JobState::kCompleted) << done.error;
  EXPECT_EQ(done.counts.completed, n_records - 1);
  EXPECT_EQ(done.counts.failed, 1);
  std::vector<Json> errors = server.Results(job_id, true);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["custom_id"], poison);
  EXPECT_EQ(errors[0]["error"]["code"], "runner_crashed");
  ExpectEachRecordOnce(job_id, n_records);
  for (const Task& t : tasks(job_id)) {
    EXPECT_EQ(t.attempt, 1) << "task " << t.index << ": a poison record is no task failure";
    EXPECT_EQ(t.failures, 0) << "task " << t.index;
  }
}

int Scenario::RunningTasksOf(const std::string& executor_name) {
  auto running = server.store().ListRunningTasks();
  EXPECT_TRUE(running.ok()) << running.status();
  int n = 0;
  if (!running.ok()) return n;
  for (const Task& task : *running) n += task.executor_id == executor(executor_name).id();
  return n;
}

}  // namespace minions::testing
