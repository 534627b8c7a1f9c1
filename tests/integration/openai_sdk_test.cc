// The OpenAI Batch API driven by the official `openai` SDK (tests/js/openai_check.mjs) against real
// processes: a `minions server` and executors running the real llama.cpp runner on the test model,
// served to the SDK under the name "text" (--openai-model-dir). What the SDK downloads must equal
// `local-run` on the same file. Both backend pairs: SQLite and a folder, PostgreSQL and S3 (where
// a large file goes up as an S3 multipart upload while it arrives). The cancel test runs the no-op runner, stalled on one record so
// that the batch can never finish on its own: cancelled, it keeps the output its tasks committed.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pool_test_util.h"

namespace minions::testing {
namespace {

constexpr char kModelsDir[] = MINIONS_TEST_MODELS_DIR;

// `n` chat requests for the model "text", one line each.
std::vector<std::string> ChatLines(int n, const std::string& stall_at = "") {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    std::string content = absl::StrCat("Say something about the number ", i, ".");
    if (!stall_at.empty() && i == std::stoi(stall_at)) content += " STALL-HERE";
    lines.push_back(DumpJson(Json{{"custom_id", absl::StrCat("req-", i)},
                                  {"method", "POST"},
                                  {"url", "/v1/chat/completions"},
                                  {"body",
                                   {{"model", "text"},
                                    {"max_tokens", 4},
                                    {"temperature", 0},
                                    {"messages", {{{"role", "user"}, {"content", content}}}}}}}));
  }
  return lines;
}

class OpenAiSdk : public ::testing::TestWithParam<std::string> {
 protected:
  // A pool serving the OpenAI API with the test models, and keys for two teams.
  void StartPool(const std::string& name, const std::string& backend = "embedded", int lease_ttl_ms = 6000,
                 const std::string& openai_models = kModelsDir) {
    dir_ = TempDir("openai-" + name);
    pool_ = std::make_unique<ProcessPool>(kBin + "/minions", dir_ + "/pool", lease_ttl_ms);
    pool_->AllowModels({kModelsDir});
    UseBackend(*pool_, backend, "openai_" + name);
    if (HasFatalFailure()) return;
    pool_->AddServerArgs({"--openai-model-dir", openai_models});
    ASSERT_TRUE(pool_->StartServer().ok());
    ASSERT_TRUE(pool_->CreateTeam("search").ok());
    ASSERT_TRUE(pool_->CreateTeam("ads").ok());
    key_ = *pool_->IssueToken("submitter", "search", "alice");
    viewer_key_ = *pool_->IssueToken("viewer", "search", "vera");
    other_key_ = *pool_->IssueToken("submitter", "ads", "bob");
  }

  // Runs a phase of openai_check.mjs; its JSON summary (the test fails when the script does).
  Json RunCheck(const std::string& phase, const std::string& input, const std::vector<std::string>& env = {}) {
    Subprocess::Options sp;
    sp.argv = {"node", std::string(MINIONS_SOURCE_DIR) + "/tests/js/openai_check.mjs", phase};
    sp.extra_env = {"OPENAI_BASE_URL=http://" + pool_->http_address() + "/v1",
                    "MINIONS_KEY=" + key_,
                    "MINIONS_VIEWER_KEY=" + viewer_key_,
                    "MINIONS_OTHER_KEY=" + other_key_,
                    "INPUT=" + input,
                    "OUT_DIR=" + dir_};
    sp.extra_env.insert(sp.extra_env.end(), env.begin(), env.end());
    sp.stderr_path = dir_ + "/openai_check-" + phase + ".log";
    auto p = Subprocess::Start(sp);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    (*p)->CloseStdin();
    std::string out;
    while (true) {
      auto line = (*p)->ReadLine();
      if (!line.ok()) break;
      out += *line;
    }
    auto exit = (*p)->Wait(absl::Minutes(10));
    EXPECT_TRUE(exit.ok() && exit->exited && exit->code == 0)
        << "openai_check.mjs " << phase << " failed:\n" << ReadFile(sp.stderr_path) << "\nserver log: " << dir_
        << "/pool/logs/server.log";
    auto parsed = ParseJson(out);
    return parsed.ok() ? *parsed : Json(nullptr);
  }

  std::string dir_;
  std::unique_ptr<ProcessPool> pool_;
  std::string key_, viewer_key_, other_key_;
};

TEST_P(OpenAiSdk, AnSdkScriptRunsItsBatchAndGetsWhatLocalRunGets) {
  StartPool("sdk" + std::to_string(getpid()), GetParam());
  if (HasFatalFailure()) return;
  std::vector<std::string> lines = ChatLines(24);
  std::string input = WriteInput(dir_, lines);
  std::string bad = dir_ + "/bad.jsonl";
  {
    std::ofstream out(bad);
    out << lines[0] << "\n{not json\n" << lines[0] << "\n";
  }
  // A file of 20 MiB: several parts of an S3 multipart upload on the way in, streamed back out.
  std::string big = dir_ + "/big.jsonl";
  {
    std::ofstream out(big);
    for (int i = 0; out.tellp() < (20 << 20); ++i) out << lines[i % lines.size()] << "\n";
  }

  // No executor yet: a batch whose window passes expires, every record an error line.
  Json expired = RunCheck("expire", input);
  EXPECT_EQ(expired["errors"], 24) << expired;

  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool_->StartExecutor(name).ok());
  Json main = RunCheck("main", input, {"BAD_INPUT=" + bad, "BIG_INPUT=" + big});
  ASSERT_TRUE(main.is_object()) << main;
  EXPECT_EQ(main["counts"]["total"], 24);
  // The validation errors name the lines: 2 (not JSON) and 3 (a repeated custom_id).
  ASSERT_EQ(main["validation_errors"].size(), 2u) << main;
  EXPECT_EQ(main["validation_errors"][0]["line"], 2);
  EXPECT_EQ(main["validation_errors"][1]["line"], 3);
  EXPECT_EQ(main["validation_errors"][1]["code"], "duplicate_custom_id");

  // The batch is a job like any other: the CLI's client sees it, in the key's team.
  auto job = cli::JobsClient(pool_->connection()).Get(main["id"].get<std::string>());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->team(), "search");
  EXPECT_EQ(job->state(), "completed");

  auto output = Lines(ReadFile(dir_ + "/output.jsonl"));
  auto errors = Lines(ReadFile(dir_ + "/errors.jsonl"));
  ExpectEachRecordOnce(lines, output, errors);
  RunLocally(input, dir_);
  if (HasFatalFailure()) return;
  ExpectSameResults(output, errors, Lines(ReadFile(dir_ + "/local.jsonl")), Lines(ReadFile(dir_ + "/local-errors.jsonl")));
  std::filesystem::remove_all(dir_);
}

TEST_P(OpenAiSdk, ACancelledBatchGoesCancellingThenCancelledAndKeepsItsPartialOutput) {
  StartPool("cancel" + std::to_string(getpid()), GetParam());
  if (HasFatalFailure()) return;
  // 300 records in tasks of 100; the runner stalls for good on record 160, so the batch cannot end
  // by itself: the first task completes, the second commits a checkpoint (50 records) and hangs.
  std::vector<std::string> lines = ChatLines(300, "160");
  std::string input = WriteInput(dir_, lines);
  ASSERT_TRUE(pool_->StartExecutor("e1", 1, kBin + "/minions-noop-runner", "", {},
                                   {"MINIONS_NOOP_STALL_ON=STALL-HERE"})
                  .ok());
  Json cancelled = RunCheck("cancel", input, {"CANCEL_AFTER=100"});
  ASSERT_TRUE(cancelled.is_object()) << cancelled;
  EXPECT_EQ(cancelled["seen"][0], "cancelling");
  EXPECT_GE(cancelled["output"].get<int>(), 100);
  EXPECT_EQ(cancelled["output"].get<int>() + cancelled["errors"].get<int>(), 300);
  auto output = Lines(ReadFile(dir_ + "/cancel-output.jsonl"));
  auto errors = Lines(ReadFile(dir_ + "/cancel-errors.jsonl"));
  ExpectEachRecordOnce(lines, output, errors);
  for (const Json& e : errors) EXPECT_EQ(e["error"]["code"], "batch_cancelled") << e;
  auto job = cli::JobsClient(pool_->connection()).Get(cancelled["id"].get<std::string>());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), "cancelled");
  // The CLI and the API agree: the same counts, and `minions results` gives the files' bytes.
  EXPECT_EQ(job->request_counts().completed(), static_cast<int64_t>(output.size()));
  EXPECT_EQ(job->request_counts().failed(), 0);  // every error line is a record that never ran
  EXPECT_EQ(FetchResults(*pool_, job->id(), false), ReadFile(dir_ + "/cancel-output.jsonl"));
  EXPECT_EQ(FetchResults(*pool_, job->id(), true), ReadFile(dir_ + "/cancel-errors.jsonl"));
  std::filesystem::remove_all(dir_);
}

// Structured outputs, logprobs, penalties, biases, n and tool calls served with OpenAI's shapes;
// tools on a model that cannot render them, stream, unknown fields and bad values refused by name
// (tests/js/openai_params_check.mjs).
TEST_P(OpenAiSdk, EveryRequestParameterIsServedOrRefusedByName) {
  // The models folder with the tool-calling model beside the text one (make_test_models.cmake).
  StartPool("params" + std::to_string(getpid()), GetParam(), 6000, std::string(kModelsDir) + "/tools");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(pool_->StartExecutor("e1").ok());
  Subprocess::Options sp;
  sp.argv = {"node", std::string(MINIONS_SOURCE_DIR) + "/tests/js/openai_params_check.mjs"};
  sp.extra_env = {"OPENAI_BASE_URL=http://" + pool_->http_address() + "/v1", "MINIONS_KEY=" + key_, "OUT_DIR=" + dir_};
  sp.stderr_path = dir_ + "/openai_params_check.log";
  auto p = Subprocess::Start(sp);
  ASSERT_TRUE(p.ok()) << p.status();
  (*p)->CloseStdin();
  std::string out;
  for (auto line = (*p)->ReadLine(); line.ok(); line = (*p)->ReadLine()) out += *line;
  auto exit = (*p)->Wait(absl::Minutes(10));
  ASSERT_TRUE(exit.ok() && exit->exited && exit->code == 0)
      << "openai_params_check.mjs failed:\n" << ReadFile(sp.stderr_path) << "\nserver log: " << dir_ << "/pool/logs/server.log";
  auto summary = ParseJson(out);
  ASSERT_TRUE(summary.ok()) << out;
  EXPECT_EQ((*summary)["served"], 7);
  EXPECT_EQ((*summary)["refused"], 9);
  EXPECT_EQ((*summary)["tool_calls"], 2);
  std::filesystem::remove_all(dir_);
}

MINIONS_INSTANTIATE_ON_BOTH_BACKENDS(OpenAiSdk);

}  // namespace
}  // namespace minions::testing
