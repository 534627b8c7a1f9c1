#pragma once
// StartLlamaRunner: the llama runner program (minions-llama-runner, found as test_env.h says)
// started as the executor starts it, for the tests that speak the runner protocol to it.

#include <memory>
#include <string>
#include <vector>

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

// Runs `records` as batch `batch`: each record's output line, by its place (null where none came;
// the test fails when the batch does). `done`, when given, gets the batch_done message.
inline std::vector<Json> RunRecords(RunnerProcess& runner, const std::string& batch,
                                    const std::vector<std::string>& records, Json* done = nullptr) {
  std::vector<Json> outputs(records.size());
  auto result = runner.RunBatch(batch, records, [&](size_t i, const Json& line) { outputs[i] = line; });
  EXPECT_TRUE(result.ok()) << result.status();
  if (done && result.ok()) *done = *result;
  return outputs;
}

}  // namespace minions::testing
