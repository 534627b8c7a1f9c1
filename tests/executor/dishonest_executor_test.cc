// Dishonest and broken executors among honest ones, with spot checks on (issue 38, point 6;
// docs/verification.md, "Caught quickly"): the real control plane and agents on fake time
// (Scenario), every runner a modelled fake (FakeRunnerScript::modelled: an honest answer is a
// function of its record, and `rescore` checks a claim against it as the real check does against
// the model's logits). One executor's runner corrupts its answers by a plan driven by its own
// progress (how many answers it gave), never by the clock: invented plausible answers, answers
// swapped between records, answers cut short, words flipped at random (1 in 1,000, as a failing
// core would), inflated usage. Each is caught and quarantined, every record it produced is redone
// by the others, and the job publishes exactly what an honest pool publishes.

#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "scenario.h"
#include "testing/must.h"

namespace minions::testing {
namespace {

constexpr int kRecords = 300;
constexpr int kShard = 10;

FakeControlPlane::Options SpotChecksOn() {
  FakeControlPlane::Options options;
  options.spot_checks = true;
  return options;
}

Scenario::Executor& AddModelled(Scenario& s, const std::string& name) {
  Scenario::Executor& e = s.AddExecutor(name);
  e.runner.modelled = true;
  return e;
}

// A published job's lines (output and errors), by custom_id.
std::map<std::string, std::string> Published(Scenario& s, const std::string& job) {
  std::map<std::string, std::string> lines;
  for (bool errors : {false, true}) {
    for (const Json& line : s.server.Results(job, errors)) lines[JsonString(line, "custom_id")] = DumpJson(line);
  }
  return lines;
}

// What an honest pool of three publishes for `records`.
std::map<std::string, std::string> HonestPool(const std::vector<std::string>& records) {
  Scenario s(SpotChecksOn());
  for (const char* name : {"A", "B", "C"}) AddModelled(s, name);
  std::string job = s.Submit(records, kShard);
  EXPECT_TRUE(s.RunUntilJobEnds(job));
  EXPECT_EQ(s.job(job).state, JobState::kCompleted) << s.job(job).error;
  return Published(s, job);
}

Json& Body(Json& output) { return output["response"]["body"]; }
std::string& Text(Json& output) { return Body(output)["choices"][0]["text"].get_ref<std::string&>(); }

// A corruption plan: changes an answer line (the runner's `n`th) from record `from` on, and
// counts the lines it changed.
struct Plan {
  std::string name;
  int64_t from = 0;
  std::function<void(int64_t n, Json& output)> corrupt;
  std::shared_ptr<int64_t> changed = std::make_shared<int64_t>(0);
};

Plan Invent(int64_t from) {
  Plan plan{"invented plausible answers", from, nullptr};
  plan.corrupt = [changed = plan.changed](int64_t, Json& output) {
    // Words of the model's own vocabulary, as many as an honest answer has, and an honest usage.
    Text(output) = ModelAnswer("made up for " + JsonString(output, "custom_id")).text;
    ++*changed;
  };
  return plan;
}

Plan Swap(int64_t from) {
  Plan plan{"answers swapped between records", from, nullptr};
  auto previous = std::make_shared<std::string>();
  plan.corrupt = [changed = plan.changed, previous](int64_t, Json& output) {
    // Each answer goes to the next record: the first record of each pair waits for its partner.
    std::string mine = Text(output);
    if (!previous->empty()) {
      Text(output) = *previous;
      ++*changed;
    }
    *previous = std::move(mine);
  };
  return plan;
}

Plan Truncate(int64_t from) {
  Plan plan{"answers cut short", from, nullptr};
  plan.corrupt = [changed = plan.changed](int64_t, Json& output) {
    // Half the words, still `stop`, and the usage made to fit.
    std::string& text = Text(output);
    size_t cut = text.size();
    for (int words = 0; words < kModelledWords / 2; ++words) cut = text.rfind(' ', cut - 1);
    text.resize(cut);
    Body(output)["usage"]["completion_tokens"] = kModelledWords - kModelledWords / 2;
    Body(output)["usage"]["total_tokens"] = Body(output)["usage"]["prompt_tokens"].get<int>() + kModelledWords / 2;
    ++*changed;
  };
  return plan;
}

Plan FlipWords(int64_t from, uint64_t seed) {
  Plan plan{"words flipped at random, 1 in 1,000", from, nullptr};
  auto random = std::make_shared<std::mt19937_64>(seed);
  plan.corrupt = [changed = plan.changed, random](int64_t, Json& output) {
    std::vector<std::string> words = absl::StrSplit(Text(output), ' ');
    bool flipped = false;
    for (std::string& word : words) {
      if (std::uniform_int_distribution<int>(0, 999)(*random) != 0) continue;
      word += "7";  // another word of the vocabulary's kind, one bit of it wrong
      flipped = true;
    }
    if (!flipped) return;
    Text(output) = absl::StrJoin(words, " ");
    ++*changed;
  };
  return plan;
}

Plan InflateUsage(int64_t from) {
  Plan plan{"inflated usage", from, nullptr};
  plan.corrupt = [changed = plan.changed](int64_t, Json& output) {
    Body(output)["usage"]["prompt_tokens"] = 999999;
    Body(output)["usage"]["total_tokens"] = 999999 + kModelledWords;
    ++*changed;
  };
  return plan;
}

// How long a dishonest executor got away with it (docs/verification.md, "Caught quickly").
struct Catch {
  int64_t answers_before = 0;  // answers it gave from its first corrupted one until quarantined
  int64_t corrupted_before = 0;  // of those, corrupted
  absl::Duration after;        // fake time from its first corrupted answer to its quarantine
};

// A pool of two honest executors and one that follows `plan`, on `records`: the dishonest one is
// quarantined, none of its chunks is left in the job, and the job publishes `honest`.
void ExpectCaughtAndRedone(const Plan& plan, const std::vector<std::string>& records,
                           const std::map<std::string, std::string>& honest, Catch* measured = nullptr) {
  SCOPED_TRACE(plan.name);
  Scenario s(SpotChecksOn());
  AddModelled(s, "A");
  AddModelled(s, "B");
  Scenario::Executor& bad = AddModelled(s, "F");
  auto first = std::make_shared<std::optional<std::pair<absl::Time, int64_t>>>();
  bad.runner.corrupt = [plan, first, &s](int64_t n, Json& output) {
    if (n < plan.from || !output.contains("response") || output["response"].is_null()) return;
    const int64_t before = *plan.changed;
    plan.corrupt(n, output);
    if (*plan.changed > before && !*first) *first = std::make_pair(s.clock.Now(), n);
  };
  std::string job = s.Submit(records, kShard);
  auto quarantined = [&] {
    absl::StatusOr<Executor> e = s.server.store().GetExecutor(bad.id());
    return e.ok() && e->state == ExecutorState::kQuarantined;
  };
  ASSERT_TRUE(s.RunUntil([&] { return quarantined() || s.job(job).state == JobState::kCompleted; }));
  if (quarantined() && *first) {
    Catch c{bad.runner.records_run - (*first)->second, *plan.changed, s.clock.Now() - (*first)->first};
    std::cout << plan.name << ": caught after " << c.answers_before << " answers (" << c.corrupted_before
              << " corrupted), " << c.after << " of fake time after the first corrupted one\n";
    if (measured != nullptr) *measured = c;
  }
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  ASSERT_GT(*plan.changed, 0) << "the plan never corrupted an answer";

  Executor caught = Must(s.server.store().GetExecutor(bad.id()));
  EXPECT_EQ(caught.state, ExecutorState::kQuarantined);
  EXPECT_THAT(caught.state_reason, ::testing::HasSubstr("failed"));
  // Every record it produced was redone: no chunk of the job is its own.
  for (const Task& task : s.tasks(job)) {
    for (const Chunk& chunk : task.chunks) EXPECT_NE(chunk.executor_id, bad.id()) << "task " << task.index;
  }
  const VerificationTally tally = Tally(Must(s.server.store().ListVerifications(job)));
  EXPECT_GE(tally.failed, 1);
  s.ExpectEachRecordOnce(job, static_cast<int>(records.size()));
  EXPECT_EQ(Published(s, job), honest) << "the job published answers an honest pool would not";
}

class DishonestExecutor : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    records_ = new std::vector<std::string>(Scenario::Records(kRecords));
    honest_ = new std::map<std::string, std::string>(HonestPool(*records_));
  }
  static void TearDownTestSuite() {
    delete records_;
    delete honest_;
  }
  static std::vector<std::string>* records_;
  static std::map<std::string, std::string>* honest_;
};
std::vector<std::string>* DishonestExecutor::records_ = nullptr;
std::map<std::string, std::string>* DishonestExecutor::honest_ = nullptr;

// The doubles do corrupt: without spot checks their answers publish.
TEST_F(DishonestExecutor, WithoutSpotChecksAForgersAnswersPublish) {
  Scenario s;
  AddModelled(s, "A");
  Scenario::Executor& bad = AddModelled(s, "F");
  Plan plan = Invent(0);
  bad.runner.corrupt = plan.corrupt;
  std::string job = s.Submit(*records_, kShard);
  ASSERT_TRUE(s.RunsToEndAs(job, JobState::kCompleted));
  ASSERT_GT(*plan.changed, 0);
  EXPECT_NE(Published(s, job), *honest_);
}

TEST_F(DishonestExecutor, AnHonestPoolPublishesTheModelsAnswersWithEveryRecordOfItsFirstTasksVerified) {
  ASSERT_EQ(honest_->size(), static_cast<size_t>(kRecords));
  for (const std::string& record : *records_) {
    const std::string id = ParseRecordLine(record).custom_id;
    EXPECT_THAT(honest_->at(id), ::testing::HasSubstr(ModelAnswer(record).text)) << id;
  }
}

// From its first answer on: an executor's first records are all drawn, so each is caught there.
TEST_F(DishonestExecutor, InventedAnswersAreCaughtAndRedone) { ExpectCaughtAndRedone(Invent(0), *records_, *honest_); }
TEST_F(DishonestExecutor, SwappedAnswersAreCaughtAndRedone) { ExpectCaughtAndRedone(Swap(0), *records_, *honest_); }
TEST_F(DishonestExecutor, TruncatedAnswersAreCaughtAndRedone) { ExpectCaughtAndRedone(Truncate(0), *records_, *honest_); }
TEST_F(DishonestExecutor, InflatedUsageIsCaughtAndRedone) { ExpectCaughtAndRedone(InflateUsage(0), *records_, *honest_); }
// A failing core: about one answer in 25 has a word flipped (40 words each). The seed fixes where,
// so the run is the same every time; its first flips fall among the records all drawn.
TEST_F(DishonestExecutor, WordsFlippedOneInAThousandAreCaughtAndRedone) {
  ExpectCaughtAndRedone(FlipWords(0, 38), *records_, *honest_);
}

// An executor that behaves while its every record is checked (its first 100) and forges after:
// only the default fraction (2 %) of its later records is drawn. Over its 900-odd forged records
// the chance that none is drawn is 0.98^900, about 1 in 80 million.
TEST_F(DishonestExecutor, AForgerThatWaitsOutItsFirstRecordsIsCaughtAtTheDefaultFraction) {
  const std::vector<std::string> records = Scenario::Records(3000);
  ExpectCaughtAndRedone(Invent(100), records, HonestPool(records));
}

}  // namespace
}  // namespace minions::testing
