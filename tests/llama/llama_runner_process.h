#pragma once
// StartLlamaRunner: the llama runner program (minions-llama-runner, found as test_env.h says)
// started as the executor starts it, for the tests that speak the runner protocol to it.

#include <memory>

#include <gtest/gtest.h>

#include "runner/runner_process.h"
#include "test_env.h"

namespace minions::testing {

// The started runner; nullptr with the test failed when it could not start.
inline std::unique_ptr<RunnerProcess> StartLlamaRunner() {
  RunnerProcess::Options options;
  options.command = {TestProgram("minions-llama-runner")};
  auto runner = RunnerProcess::Start(options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

}  // namespace minions::testing
