// RunnerSupervisor alone, over fake runners on the fake clock: which runner it starts, the model it
// loads and reports, a load that takes too long, a hang and a freeze, its end (stopped, killed on
// purpose, shut down) and a new runner after. No agent, no server: the agent's use of it is
// covered by agent_parts_test.cc and agent_scenario_test.cc.

#include "executor/runner_supervisor.h"

#include <signal.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/json_util.h"
#include "testing/fake_clock.h"
#include "testing/fake_runner.h"

namespace minions {
namespace {

using ::minions::testing::FakeClock;
using ::minions::testing::FakeRunnerFactory;
using ::minions::testing::FakeRunnerScript;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kLoadTimeout = absl::Minutes(2);

class RunnerSupervisorTest : public ::testing::Test {
 protected:
  RunnerSupervisorTest() {
    RunnerWatch::Options hang;
    hang.min_silence = absl::Minutes(1);
    std::map<std::string, std::shared_ptr<RunnerFactory>> declared;
    declared["custom"] = std::make_shared<FakeRunnerFactory>(&clock_, &custom_script_);
    supervisor_ = std::make_unique<RunnerSupervisor>(RunnerSupervisor::Options{hang, kLoadTimeout, nullptr},
                                                     std::make_unique<FakeRunnerFactory>(&clock_, &script_),
                                                     std::move(declared), [this] { ++rings_; });
  }
  // The runner's events until it has none due now (the fake plays what the clock has reached).
  std::vector<runner_protocol::Event> Events() {
    std::vector<runner_protocol::Event> events;
    while (true) {
      auto event = supervisor_->Poll();
      if (!event.ok() || !*event) return events;
      events.push_back(**event);
    }
  }
  runner_protocol::LoadRequest LoadOf(const std::string& model) {
    runner_protocol::LoadRequest load;
    load.model = model;
    return load;
  }

  FakeClock clock_;
  FakeRunnerScript script_;
  FakeRunnerScript custom_script_;
  int rings_ = 0;
  std::unique_ptr<RunnerSupervisor> supervisor_;
};

TEST_F(RunnerSupervisorTest, ItStartsTheBuiltInRunnerOrADeclaredOneAndNoOther) {
  EXPECT_FALSE(supervisor_->running());
  ASSERT_TRUE(supervisor_->Start(RunnerSupervisor::kBuiltInRunner).ok());
  EXPECT_TRUE(supervisor_->running());
  EXPECT_TRUE(supervisor_->Is("llama", {}));
  EXPECT_FALSE(supervisor_->Is("llama", {9000}));
  EXPECT_EQ(supervisor_->generation(), 1);
  EXPECT_EQ(script_.starts, 1);
  supervisor_->Stop();
  EXPECT_FALSE(supervisor_->running());
  EXPECT_EQ(script_.kills, 1);

  absl::Status unknown = supervisor_->Start("nonesuch");
  EXPECT_TRUE(absl::IsFailedPrecondition(unknown));
  EXPECT_THAT(unknown.message(), HasSubstr("offers no runner 'nonesuch'"));
  EXPECT_FALSE(supervisor_->running());

  ASSERT_TRUE(supervisor_->Start("custom", {9000, 9001}).ok());
  EXPECT_EQ(custom_script_.starts, 1);
  EXPECT_THAT(custom_script_.tcp_ports, ElementsAre(9000, 9001));
  EXPECT_TRUE(supervisor_->Is("custom", {9000, 9001}));
  EXPECT_EQ(supervisor_->generation(), 2);
}

TEST_F(RunnerSupervisorTest, ARunnerThatCannotStartLeavesNoneRunning) {
  script_.refuse_start = true;
  EXPECT_FALSE(supervisor_->Start("llama").ok());
  EXPECT_FALSE(supervisor_->running());
  EXPECT_EQ(supervisor_->generation(), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(supervisor_->Poll().status()));
}

TEST_F(RunnerSupervisorTest, ItLoadsAModelAndReportsItUntilTheLoadFailsOrTheRunnerEnds) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  supervisor_->Load(LoadOf("/models/a.gguf"), "llama:a", "a.gguf", clock_.Now());
  EXPECT_TRUE(supervisor_->loading());
  EXPECT_TRUE(supervisor_->Has("llama:a"));
  EXPECT_FALSE(supervisor_->Has("llama:b"));
  EXPECT_EQ(supervisor_->model_loaded(), "a.gguf");
  clock_.Advance(script_.load_time);
  bool loaded = false;
  for (const auto& event : Events()) loaded |= event.type == runner_protocol::Event::Type::kLoaded;
  EXPECT_TRUE(loaded);
  supervisor_->Loaded();
  EXPECT_FALSE(supervisor_->loading());
  EXPECT_TRUE(supervisor_->Has("llama:a"));

  // Another model that does not load: it then has none (the next lease asks again).
  supervisor_->Load(LoadOf("/models/b.gguf"), "llama:b", "b.gguf", clock_.Now());
  supervisor_->LoadFailed();
  EXPECT_FALSE(supervisor_->loading());
  EXPECT_FALSE(supervisor_->Has("llama:b"));
  EXPECT_EQ(supervisor_->model_loaded(), "");
  EXPECT_TRUE(supervisor_->running());

  supervisor_->Load(LoadOf("/models/a.gguf"), "llama:a", "a.gguf", clock_.Now());
  supervisor_->Stop();
  EXPECT_FALSE(supervisor_->Has("llama:a"));
  EXPECT_FALSE(supervisor_->loading());
  EXPECT_EQ(supervisor_->model_loaded(), "");
}

TEST_F(RunnerSupervisorTest, ALoadNotAnsweredInTimeHasTimedOut) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  const absl::Time asked = clock_.Now();
  script_.load_time = absl::Hours(1);
  supervisor_->Load(LoadOf("/models/a.gguf"), "llama:a", "a.gguf", asked);
  EXPECT_EQ(supervisor_->NextCheck(), asked + kLoadTimeout);
  EXPECT_FALSE(supervisor_->LoadTimedOut(asked + kLoadTimeout - absl::Seconds(1)));
  EXPECT_TRUE(supervisor_->LoadTimedOut(asked + kLoadTimeout));
}

TEST_F(RunnerSupervisorTest, ASilentRunnerHoldingWorkIsHungButNotWhileFrozen) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  script_.stall_on = "stuck";
  const absl::Time sent = clock_.Now();
  supervisor_->StartBatch("b1", {R"({"custom_id":"stuck"})"}, sent);
  EXPECT_EQ(supervisor_->NextCheck(), sent + absl::Minutes(1));
  EXPECT_FALSE(supervisor_->Hung(sent + absl::Seconds(59)));
  EXPECT_TRUE(supervisor_->Hung(sent + absl::Minutes(1)));
  EXPECT_EQ(supervisor_->Silence(sent + absl::Minutes(1)), absl::Minutes(1));
  EXPECT_EQ(supervisor_->hang_limit(), absl::Minutes(1));

  // Stopped for the owner: its silence is no hang, and the watch starts again when it goes on.
  supervisor_->Freeze(true, sent);
  EXPECT_TRUE(supervisor_->frozen());
  EXPECT_FALSE(supervisor_->Hung(sent + absl::Hours(1)));
  EXPECT_EQ(supervisor_->NextCheck(), absl::InfiniteFuture());
  supervisor_->Freeze(false, sent + absl::Hours(1));
  EXPECT_FALSE(supervisor_->frozen());
  EXPECT_FALSE(supervisor_->Hung(sent + absl::Hours(1) + absl::Seconds(59)));
  EXPECT_THAT(script_.signals, ElementsAre(SIGSTOP, SIGCONT));

  // A new runner starts with a watch of its own, and no runner is never frozen.
  supervisor_->Stop();
  supervisor_->Freeze(true, clock_.Now());
  EXPECT_FALSE(supervisor_->frozen());
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  EXPECT_FALSE(supervisor_->Hung(clock_.Now() + absl::Hours(2)));
}

TEST_F(RunnerSupervisorTest, AKillFromAnotherThreadIsOnPurposeOnce) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  EXPECT_FALSE(supervisor_->TakeKilledOnPurpose());
  std::thread controller([this] { supervisor_->Kill("the owner needs the memory"); });
  controller.join();
  absl::Status ended;
  while (true) {
    auto event = supervisor_->Poll();
    if (!event.ok()) {
      ended = event.status();
      break;
    }
    ASSERT_TRUE(event->has_value()) << "the killed runner never said it ended";
  }
  EXPECT_TRUE(absl::IsUnavailable(ended));
  EXPECT_TRUE(supervisor_->TakeKilledOnPurpose());
  EXPECT_FALSE(supervisor_->TakeKilledOnPurpose());
  // Killing none is nothing.
  supervisor_->Stop();
  supervisor_->Kill("again");
  EXPECT_FALSE(supervisor_->TakeKilledOnPurpose());
}

TEST_F(RunnerSupervisorTest, AShutDownRunnerIsDrainedThenStopped) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  supervisor_->RequestShutdown();
  EXPECT_TRUE(supervisor_->Drained());  // the fake exits as soon as it reads it
  supervisor_->Stop();
  EXPECT_FALSE(supervisor_->running());
  EXPECT_TRUE(supervisor_->Drained());  // none runs
  EXPECT_EQ(script_.kills, 0);          // it had exited: nothing killed
}

TEST_F(RunnerSupervisorTest, WorkGoesToTheRunnerAndACancelReachesIt) {
  ASSERT_TRUE(supervisor_->Start("llama").ok());
  supervisor_->StartBatch("b1", {R"({"custom_id":"r1"})", R"({"custom_id":"r2"})"}, clock_.Now());
  supervisor_->Cancel("b1");
  clock_.Advance(absl::Seconds(1));
  bool cancelled = false;
  for (const auto& event : Events()) {
    if (event.type == runner_protocol::Event::Type::kBatchDone) cancelled = JsonBool(event.body, "cancelled");
  }
  EXPECT_TRUE(cancelled);
  EXPECT_THAT(script_.batches, ElementsAre("b1"));
}

}  // namespace
}  // namespace minions
