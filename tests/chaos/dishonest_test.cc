// The chaos suite's dishonest executors (issue 38, point 6): one executor of a pool with spot checks
// on runs a dishonest or broken runner (tests/runners/dishonest_runner.py: invented answers,
// answers swapped between records, truncated answers, 1-in-1,000 token flips, inflated usage)
// beside two honest executors running the real llama.cpp runner. Then: the dishonest executor is
// quarantined, every record it answered is redone by an honest one, and the job publishes exactly
// what an honest run does (chaos_util.h's reference), every record once.
//
// Nothing waits on the clock. The dishonest executor starts alone and answers instantly; the honest
// ones start once the job has done half its records (progress, not time), so the dishonest one has
// answered at least that many whatever the machine's speed, and every one of them is checked (an
// executor's first 100 records all are). The records are greedy: the random-weight test model's
// sampled distributions are nearly flat, so a corrupted sampled answer may be a likely draw
// (docs/verification.md, "Limits").

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>

#include "chaos_util.h"
#include "cli/sample_prompts.h"

namespace minions::testing {
namespace {

constexpr int kRecords = 40;
constexpr int kShardSize = 5;
// The flip mode's generator, seeded so that its first flip falls on the first token it answers
// (then 1 in 1,000, as a failing core): the job is small, and the test must see a corruption.
constexpr int kFlipSeed = 1514;

struct Double {
  std::string mode, backend;
};

std::string Name(const ::testing::TestParamInfo<Double>& info) {
  return info.param.mode + (info.param.backend == "embedded" ? "" : "_PostgresS3");
}

// The records and their honest results (kept on disk across the tests).
Reference Honest() {
  cli::SamplePromptOptions sample;
  sample.records = kRecords;
  sample.max_tokens = 8;
  sample.greedy_only = true;
  sample.include_embeddings = false;  // the doubles corrupt text
  return MakeReference(cli::SamplePromptLines(sample), MINIONS_CHAOS_REFERENCE_DIR "-dishonest");
}

class DishonestExecutor : public ::testing::TestWithParam<Double> {};

TEST_P(DishonestExecutor, IsQuarantinedAndItsRecordsRedoneBeforeTheJobPublishes) {
  const Double& param = GetParam();
  const Reference reference = Honest();
  if (HasFatalFailure()) return;
  ASSERT_EQ(reference.output.size() + reference.errors.size(), reference.lines.size());

  std::string dir = TempDir("dishonest-" + param.mode);
  // The honest answers the double corrupts, in a folder its sandbox lets it read (a model folder).
  const std::string answers = dir + "/answers";
  std::filesystem::create_directories(answers);
  {
    std::ofstream out(answers + "/honest.jsonl");
    for (const auto* lines : {&reference.output, &reference.errors}) {
      for (const Json& line : *lines) out << line.dump() << "\n";
    }
  }

  ProcessPool pool(kBin + "/minions", dir + "/pool", 6000);
  pool.AllowModels({MINIONS_TEST_MODELS_DIR});
  pool.AddServerArgs({"--spot-checks"});
  UseBackend(pool, param.backend, "chaos");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool.StartServer().ok());
  auto job = Submit(pool, WriteInput(dir, reference.lines), kShardSize);
  ASSERT_TRUE(job.ok()) << job.status();

  ASSERT_TRUE(pool.StartExecutor("dishonest", 1, std::string(MINIONS_TEST_SOURCE_DIR) + "/tests/runners/dishonest_runner.py",
                                 "", {"--models", MINIONS_TEST_MODELS_DIR, "--models", answers},
                                 {"DISHONEST_MODE=" + param.mode, "DISHONEST_ANSWERS=" + answers + "/honest.jsonl",
                                  absl::StrCat("DISHONEST_SEED=", kFlipSeed)})
                  .ok());
  cli::JobsClient client(pool.connection());
  absl::Time deadline = absl::Now() + absl::Minutes(8);  // a stuck job fails the test, not the plan
  bool honest_started = false;
  v1::Job last;
  while (absl::Now() < deadline) {
    auto now = client.Get(job->id());
    if (now.ok()) last = *now;
    if (now.ok() && IsFinished(last)) break;
    if (!honest_started && 2 * (last.request_counts().completed() + last.request_counts().failed()) >= kRecords) {
      for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name).ok());
      honest_started = true;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(last.state(), "completed") << DescribeState(pool, job->id()) << "logs in " << pool.dir() << "/logs";

  // Quarantined, after it did work; no honest executor is.
  auto executors = client.Executors();
  ASSERT_TRUE(executors.ok()) << executors.status();
  std::string dishonest_id;
  for (const auto& e : *executors) {
    if (e.name() != "dishonest") {
      EXPECT_NE(e.state(), "quarantined") << e.name() << ": " << e.state_reason();
      continue;
    }
    dishonest_id = e.id();
    EXPECT_EQ(e.state(), "quarantined") << e.state_reason();
    EXPECT_GT(e.records_done(), 0);  // it did take work, which was caught
    std::cout << "dishonest (" << param.mode << ") " << e.state() << ": " << e.state_reason() << std::endl;
  }
  ASSERT_FALSE(dishonest_id.empty()) << "the dishonest executor never registered";
  EXPECT_GT(last.verification().failed(), 0);

  // Its records redone: every task's last attempt is an honest executor's, and the job publishes
  // what an honest run does, every record once.
  auto tasks = client.Tasks(job->id());
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  for (const auto& t : *tasks) {
    EXPECT_EQ(t.state(), "succeeded") << "task " << t.index();
    EXPECT_NE(t.executor_id(), dishonest_id) << "task " << t.index() << " kept the dishonest executor's answers";
  }
  EXPECT_EQ(last.request_counts().total(), kRecords);
  auto output = Lines(FetchResults(pool, job->id(), false));
  auto errors = Lines(FetchResults(pool, job->id(), true));
  ExpectEachRecordOnce(reference.lines, output, errors);
  ExpectSameResults(output, errors, reference.output, reference.errors);

  if (HasFailure() || std::getenv("MINIONS_CHAOS_KEEP_LOGS")) {
    if (HasFailure()) std::cout << DescribeState(pool, job->id());
    std::cout << "logs kept in " << pool.dir() << "/logs" << std::endl;
  } else {
    std::filesystem::remove_all(dir);
  }
}

// Every double on the embedded backend; one on PostgreSQL + S3 as well (the spot checks' store
// side runs on both: tests/store/spot_check_contract.cc).
INSTANTIATE_TEST_SUITE_P(Doubles, DishonestExecutor,
                         ::testing::Values(Double{"invent", "embedded"}, Double{"swap", "embedded"},
                                           Double{"truncate", "embedded"}, Double{"flip", "embedded"},
                                           Double{"inflate", "embedded"}, Double{"swap", "postgres-s3"}),
                         Name);

}  // namespace
}  // namespace minions::testing
