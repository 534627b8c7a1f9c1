// An executor's own /metrics: its state, its runner's memory, its time to yield.

#include "executor/executor_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "testing/http_get.h"
#include "testing/prometheus_text.h"

namespace minions::testing {
namespace {

TEST(ExecutorMetricsTest, StateRunnerMemoryAndYieldAreServedOnItsOwnPort) {
  ExecutorMetrics metrics;
  ASSERT_TRUE(metrics.Serve("127.0.0.1:0").ok());
  metrics.SetState(ExecutorState::kOwnerActive, "keyboard");
  metrics.ObserveYieldSeconds(0.3);
  metrics.SetRunnerPid(getpid());  // any live process will do: this one
  HttpReply reply = HttpGet(absl::StrCat("http://127.0.0.1:", metrics.port(), "/metrics"));
  ASSERT_EQ(reply.status, 200);
  auto m = ParsePrometheusSamples(reply.body);
  EXPECT_EQ(m["minions_executor_state{state=\"owner_active\"}"], 1);
  EXPECT_EQ(m["minions_executor_state{state=\"available\"}"], 0);
  EXPECT_EQ(m["minions_executor_yield_seconds_count"], 1);
  EXPECT_EQ(m["minions_executor_yield_seconds_bucket{le=\"0.5\"}"], 1);
  EXPECT_EQ(m["minions_executor_yield_seconds_bucket{le=\"0.25\"}"], 0);
  // This test process is larger than a megabyte and smaller than its machine.
  EXPECT_GT(m["minions_executor_runner_memory_bytes"], 1 << 20);
  EXPECT_LT(m["minions_executor_runner_memory_bytes"], 1e12);

  metrics.SetRunnerPid(0);  // no runner: no sample, rather than a stale one
  auto none = ParsePrometheusSamples(HttpGet(absl::StrCat("http://127.0.0.1:", metrics.port(), "/metrics")).body);
  EXPECT_EQ(none.count("minions_executor_runner_memory_bytes"), 0u);
}

}  // namespace
}  // namespace minions::testing
