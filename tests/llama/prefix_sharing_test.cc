// Shared prefixes: records whose prompts start alike reuse the KV cells of the common part
// (within a batch, across batches, while another record is still computing it), and the output of
// every record is exactly what it is without sharing.

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "runner/llama/llama_engine.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using engine_test::GeneratedText;
using engine_test::ParseItems;
using engine_test::ServeResults;
using minions::testing::TestModel;

// About 300 tokens with the test model's tokenizer: the shared instructions of a batch job.
std::string LongInstructions() {
  std::string text = "You are a careful assistant that classifies customer messages. ";
  const char* rules[] = {"Read the whole message before you answer.", "Answer with one word when you can.",
                         "Never invent facts about orders or refunds.", "Say unknown when the message is unclear.",
                         "Keep personal data out of your answer.", "Prefer the most specific category."};
  for (int i = 0; i < 6; ++i) {
    text += "Rule " + std::to_string(i + 1) + ": " + rules[i] + " ";
    text += "Example " + std::to_string(i + 1) + ": the parcel number " + std::to_string(1000 + 37 * i) +
            " arrived late and the box was damaged, category shipping. ";
  }
  return text;
}

std::string ChatRecord(const std::string& id, const std::string& system, const std::string& user, int max_tokens) {
  return DumpJson({{"custom_id", id},
                   {"url", "/v1/chat/completions"},
                   {"body", {{"messages", {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}}},
                             {"max_tokens", max_tokens},
                             {"temperature", 0}}}});
}

std::string CompletionRecord(const std::string& id, const std::string& prompt, int max_tokens) {
  return DumpJson({{"custom_id", id}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}});
}

runner_protocol::LoadOptions Options(bool share, int n_parallel = 4, int n_batch = 64, int n_ctx_per_seq = 1024) {
  runner_protocol::LoadOptions options;
  options.n_parallel = n_parallel;
  options.n_ctx_per_seq = n_ctx_per_seq;
  options.n_batch = n_batch;  // small: prompts are fed in chunks, next to other sequences
  options.flash_attn = "off";
  options.share_prefixes = share;
  return options;
}

std::unique_ptr<LlamaEngine> LoadEngine(const runner_protocol::LoadOptions& options) {
  auto engine = LlamaEngine::Load(TestModel("text.gguf"), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Same output line, record for record: text, finish reason, usage.
void ExpectSameOutputs(const std::map<size_t, WorkResult>& shared, const std::map<size_t, WorkResult>& unshared,
                       size_t n) {
  ASSERT_EQ(shared.size(), n);
  ASSERT_EQ(unshared.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const Json& a = shared.at(i).output;
    const Json& b = unshared.at(i).output;
    ASSERT_FALSE(IsErrorOutputLine(a)) << DumpJson(a);
    ASSERT_FALSE(IsErrorOutputLine(b)) << DumpJson(b);
    EXPECT_EQ(GeneratedText(a), GeneratedText(b)) << "record " << i;
    EXPECT_EQ(a["response"]["body"]["choices"][0]["finish_reason"], b["response"]["body"]["choices"][0]["finish_reason"])
        << "record " << i;
    EXPECT_EQ(a["response"]["body"]["usage"], b["response"]["body"]["usage"]) << "record " << i;
  }
}

int CachedTokens(const std::map<size_t, WorkResult>& results) {
  int n = 0;
  for (const auto& [index, result] : results) n += result.cached_tokens;
  return n;
}

class PrefixSharing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InstallLlamaLogging(); }
};

TEST_F(PrefixSharing, GreedyOutputWithSharingEqualsOutputWithout) {
  const std::string instructions = LongInstructions();
  // Records sharing the instructions (chat and completions), records sharing nothing, two
  // identical records, and one whose whole prompt is another's prefix; more records than slots,
  // so slots are refilled while others are mid-prompt or mid-generation.
  std::vector<std::string> lines = {
      ChatRecord("s0", instructions, "My parcel never came.", 12),
      ChatRecord("s1", instructions, "The invoice shows the wrong address.", 7),
      CompletionRecord("u0", "Tell me about the sea", 9),
      ChatRecord("s2", instructions, "Can I change my password?", 15),
      CompletionRecord("p0", instructions + "Message: where is my refund? Category:", 6),
      ChatRecord("s3", instructions, "The box was damaged.", 4),
      CompletionRecord("u1", "numbers: 1 2 3 4 5 6 7 8 9 10 11 12", 11),
      CompletionRecord("p1", instructions + "Message: the app crashes. Category:", 13),
      ChatRecord("s4", instructions, "My parcel never came.", 12),  // the same as s0
      CompletionRecord("p2", instructions, 5),  // p0's and p1's prompts start with it
      ChatRecord("s5", instructions, "I was charged twice for one order.", 20),
      CompletionRecord("u2", "why cats purr", 8),
      ChatRecord("s6", "Be brief.", "My parcel never came.", 10),  // another system prompt
      ChatRecord("s7", instructions, "Thanks, that solved it.", 9),
  };
  auto unshared_engine = LoadEngine(Options(false));
  auto shared_engine = LoadEngine(Options(true));
  ASSERT_TRUE(unshared_engine && shared_engine);
  auto unshared = ServeResults(*unshared_engine, lines);
  auto shared = ServeResults(*shared_engine, lines);
  ExpectSameOutputs(shared, unshared, lines.size());

  EXPECT_EQ(CachedTokens(unshared), 0);
  // The ten records with the instructions compute them once between them (up to one slot's
  // worth more while the first computation is under way).
  int reused_by_sharers = 0;
  for (const char* id : {"s1", "s2", "s3", "s4", "s5", "s7", "p0", "p1", "p2"}) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find(std::string("\"") + id + "\"") != std::string::npos) {
        reused_by_sharers += shared.at(i).cached_tokens;
        EXPECT_GT(shared.at(i).cached_tokens, 0) << id;
      }
    }
  }
  EXPECT_GT(reused_by_sharers, 9 * 150);
  int nonempty = 0;
  for (const auto& [i, r] : shared) nonempty += !GeneratedText(r.output).empty();
  EXPECT_GT(nonempty, 8);  // the comparison is about real text, not empty strings
}

TEST_F(PrefixSharing, ConsecutiveBatchesReuseTheCellsTheLastOneLeft) {
  const std::string instructions = LongInstructions();
  std::vector<std::string> first, second;
  for (int i = 0; i < 5; ++i) {
    first.push_back(ChatRecord("a" + std::to_string(i), instructions, "Question number " + std::to_string(i), 6));
    second.push_back(ChatRecord("b" + std::to_string(i), instructions, "Another question, " + std::to_string(i), 8));
  }
  auto unshared_engine = LoadEngine(Options(false));
  auto shared_engine = LoadEngine(Options(true));
  ASSERT_TRUE(unshared_engine && shared_engine);
  ExpectSameOutputs(ServeResults(*shared_engine, first), ServeResults(*unshared_engine, first), first.size());
  // The second task starts with the first one's cells still in the slots: not one of its records
  // computes the instructions again.
  auto shared = ServeResults(*shared_engine, second);
  ExpectSameOutputs(shared, ServeResults(*unshared_engine, second), second.size());
  for (const auto& [i, result] : shared) EXPECT_GT(result.cached_tokens, 150) << "record " << i;
}

TEST_F(PrefixSharing, APromptLongerThanTheContextIsStillRefusedPerRecord) {
  const std::string instructions = LongInstructions();
  std::string longer = instructions;
  for (int i = 0; i < 3; ++i) longer += instructions;  // well past 512 tokens
  std::vector<std::string> lines = {
      ChatRecord("fits", instructions, "Hello", 5),
      ChatRecord("too-long", longer, "Hello", 5),
      CompletionRecord("plus-max-tokens", instructions + "Message: hi. Category:", 480),
      ChatRecord("fits-too", instructions, "Goodbye", 5),
  };
  auto engine = LoadEngine(Options(true, 2, 64, 512));
  ASSERT_TRUE(engine);
  auto results = ServeResults(*engine, lines);
  ASSERT_EQ(results.size(), lines.size());
  EXPECT_FALSE(IsErrorOutputLine(results[0].output));
  EXPECT_EQ(OutputLineError(results[1].output)["code"], "context_length_exceeded");
  EXPECT_THAT(OutputLineError(results[1].output)["message"].get<std::string>(), ::testing::HasSubstr("tokens per sequence"));
  EXPECT_EQ(OutputLineError(results[2].output)["code"], "context_length_exceeded");
  EXPECT_THAT(OutputLineError(results[2].output)["message"].get<std::string>(), ::testing::HasSubstr("max_tokens"));
  EXPECT_FALSE(IsErrorOutputLine(results[3].output)) << DumpJson(results[3].output);
  EXPECT_GT(results[3].cached_tokens, 150);
}

// Two batches in one stream; cancels batch "a" once `cancel_after_steps` decode steps are done.
class TwoBatchSource : public WorkSource {
 public:
  TwoBatchSource(std::vector<WorkItem> items, int cancel_after_steps)
      : items_(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end())),
        cancel_after_steps_(cancel_after_steps) {}
  std::optional<WorkItem> Next() override {
    if (items_.empty()) return std::nullopt;
    WorkItem item = std::move(items_.front());
    items_.pop_front();
    return item;
  }
  void OnResult(WorkResult result) override { results[result.batch][result.index] = std::move(result); }
  bool Cancelled(const WorkItem& item) override { return item.batch == "a" && steps_ >= cancel_after_steps_; }
  void OnDropped(const WorkItem& item) override { dropped.insert(item.batch + std::to_string(item.index)); }
  bool Stopping() override { return false; }
  void StepDone() override { ++steps_; }

  std::map<std::string, std::map<size_t, WorkResult>> results;
  std::set<std::string> dropped;

 private:
  std::deque<WorkItem> items_;
  int cancel_after_steps_;
  int steps_ = 0;
};

TEST_F(PrefixSharing, RecordsWaitingForAPrefixGoOnWhenItsRecordIsCancelled) {
  // Batch a's record starts computing the instructions; batch b's records, which share them, wait
  // for it rather than compute them too. Then batch a is cancelled mid-prompt: b's records must
  // still be served, and right.
  const std::string instructions = LongInstructions();
  std::vector<std::string> a_lines = {ChatRecord("a0", instructions, "First question", 8)};
  std::vector<std::string> b_lines;
  for (int i = 0; i < 3; ++i) {
    b_lines.push_back(ChatRecord("b" + std::to_string(i), instructions, "Question " + std::to_string(i), 6 + i));
  }
  std::vector<WorkItem> items = ParseItems(a_lines, "a");
  for (WorkItem& item : ParseItems(b_lines, "b")) items.push_back(std::move(item));

  auto engine = LoadEngine(Options(true, 4, 32));
  auto reference = LoadEngine(Options(false));
  ASSERT_TRUE(engine && reference);
  TwoBatchSource source(std::move(items), /*cancel_after_steps=*/2);
  engine->ServeStream(source);
  EXPECT_EQ(source.dropped, std::set<std::string>{"a0"});
  EXPECT_TRUE(source.results["a"].empty());
  ExpectSameOutputs(source.results["b"], ServeResults(*reference, b_lines), b_lines.size());
  // What a0 computed before it was cancelled still served b's records.
  EXPECT_GT(CachedTokens(source.results["b"]), 0);
}

TEST_F(PrefixSharing, EmbeddingsAreTheSameWithAndWithoutSharing) {
  const std::string instructions = LongInstructions();
  std::vector<std::string> lines;
  for (int i = 0; i < 4; ++i) {
    lines.push_back(ChatRecord("g" + std::to_string(i), instructions, "Question " + std::to_string(i), 5));
    lines.push_back(DumpJson({{"custom_id", "e" + std::to_string(i)},
                              {"url", "/v1/embeddings"},
                              {"body", {{"input", {instructions + " item " + std::to_string(i), "short text"}}}}}));
  }
  // n_batch 512: an embedding input must fit one micro-batch.
  auto unshared_engine = LoadEngine(Options(false, 4, 512));
  auto shared_engine = LoadEngine(Options(true, 4, 512));
  ASSERT_TRUE(unshared_engine && shared_engine);
  auto unshared = ServeResults(*unshared_engine, lines);
  auto shared = ServeResults(*shared_engine, lines);
  ASSERT_EQ(shared.size(), lines.size());
  for (size_t i = 1; i < lines.size(); i += 2) {
    const Json& a = shared.at(i).output;
    const Json& b = unshared.at(i).output;
    ASSERT_FALSE(IsErrorOutputLine(a)) << DumpJson(a);
    ASSERT_EQ(a["response"]["body"]["data"].size(), 2u);
    EXPECT_EQ(a["response"]["body"]["data"], b["response"]["body"]["data"]) << "record " << i;
    EXPECT_EQ(GeneratedText(shared.at(i - 1).output), GeneratedText(unshared.at(i - 1).output)) << "record " << i - 1;
  }
  EXPECT_GT(CachedTokens(shared), 0);
}

}  // namespace
}  // namespace minions::llama_runner
