// Reference equality: the engine's batched, continuously refilled decoding gives, token for token,
// what llama.cpp gives when the same model runs one prompt at a time through its plain API.

#include <cmath>
#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ggml-backend.h"
#include "llama.h"
#include "runner/llama/llama_engine.h"
#include "direct_llama.h"
#include "engine_test_util.h"
#include "test_env.h"

namespace minions::llama_runner {
namespace {

using minions::testing::TestModel;
using engine_test::GeneratedText;
using engine_test::ServeAll;

// llama.cpp used directly: one prompt at a time, greedy argmax over the logits.
class DirectLlama : public DirectModel {
 public:
  explicit DirectLlama(const std::string& path, bool embeddings = false)
      : DirectModel(path, [embeddings](llama_model* model, llama_context_params& cp) {
          cp.n_ctx = 512;
          cp.n_batch = 512;
          cp.n_ubatch = 512;
          cp.n_seq_max = 1;
          cp.embeddings = embeddings;
          // Same attention as the engine under test (flash_attn "off"; see the runner protocol doc).
          cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
          if (embeddings) {
            const char* arch_key = "general.architecture";
            char arch[64];
            llama_model_meta_val_str(model, arch_key, arch, sizeof(arch));
            cp.pooling_type = std::string(arch) == "llama" ? LLAMA_POOLING_TYPE_MEAN : LLAMA_POOLING_TYPE_UNSPECIFIED;
          }
        }) {}

  std::string ChatPrompt(const std::vector<std::pair<std::string, std::string>>& messages) {
    std::vector<llama_chat_message> chat;
    for (auto& [role, content] : messages) chat.push_back({role.c_str(), content.c_str()});
    std::vector<char> buf(8192);
    int n = llama_chat_apply_template(llama_model_chat_template(model_, nullptr), chat.data(), chat.size(),
                                      true, buf.data(), (int)buf.size());
    return std::string(buf.data(), n);
  }

  // Greedy generation; returns the text.
  std::string Generate(const std::string& prompt, bool parse_special, int max_tokens) {
    llama_memory_clear(llama_get_memory(ctx_), true);
    std::vector<llama_token> tokens = Tokenize(prompt, parse_special);
    llama_batch batch = llama_batch_get_one(tokens.data(), (int)tokens.size());
    std::string text;
    llama_token next = 0;
    for (int i = 0; i < max_tokens; ++i) {
      if (llama_decode(ctx_, batch) != 0) return "<decode failed>";
      const float* logits = llama_get_logits_ith(ctx_, -1);
      int n_vocab = llama_vocab_n_tokens(vocab());
      next = (llama_token)(std::max_element(logits, logits + n_vocab) - logits);
      if (llama_vocab_is_eog(vocab(), next)) break;
      char piece[256];
      int n = llama_token_to_piece(vocab(), next, piece, sizeof(piece), 0, false);
      text.append(piece, n);
      batch = llama_batch_get_one(&next, 1);
    }
    return text;
  }

  std::vector<float> Embed(const std::string& input) {
    if (auto* mem = llama_get_memory(ctx_)) llama_memory_clear(mem, true);
    std::vector<llama_token> tokens = Tokenize(input, false);
    llama_batch batch = llama_batch_init((int)tokens.size(), 0, 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.token[i] = tokens[i];
      batch.pos[i] = (llama_pos)i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = true;
    }
    batch.n_tokens = (int)tokens.size();
    EXPECT_EQ(llama_decode(ctx_, batch), 0);
    const float* e = llama_get_embeddings_seq(ctx_, 0);
    std::vector<float> v(e, e + llama_model_n_embd_out(model_));
    llama_batch_free(batch);
    return v;
  }
};

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += (double)a[i] * b[i];
    na += (double)a[i] * a[i];
    nb += (double)b[i] * b[i];
  }
  return dot / std::sqrt(na * nb);
}

class EngineReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InstallLlamaLogging(); }
};

TEST_F(EngineReference, BatchedGreedyGenerationEqualsOnePromptAtATime) {
  const std::string model = TestModel("text.gguf");
  DirectLlama direct(model);
  ASSERT_TRUE(direct.ok());
  // Different prompt lengths and max_tokens, more records than slots: sequences finish at
  // different steps and their slots are refilled while others are mid-generation.
  std::vector<std::string> lines;
  std::vector<std::string> expected;
  const char* topics[] = {"the sea", "a very long and winding road through the mountains of the north",
                          "x", "numbers: 1 2 3 4 5 6 7 8 9 10 11 12", "why cats purr", "the moon"};
  for (int i = 0; i < 12; ++i) {
    int max_tokens = 6 + (i * 7) % 27;
    std::string topic = topics[i % 6];
    if (i % 2 == 0) {
      std::string prompt = "Tell me about " + topic;
      lines.push_back(DumpJson({{"custom_id", "c" + std::to_string(i)}, {"url", "/v1/completions"},
                                {"body", {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}}}}));
      expected.push_back(direct.Generate(prompt, false, max_tokens));
    } else {
      lines.push_back(DumpJson({{"custom_id", "h" + std::to_string(i)}, {"url", "/v1/chat/completions"},
                                {"body", {{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                                                        {{"role", "user"}, {"content", topic}}}},
                                          {"max_tokens", max_tokens}, {"temperature", 0}}}}));
      expected.push_back(direct.Generate(direct.ChatPrompt({{"system", "Be brief."}, {"user", topic}}), true, max_tokens));
    }
  }
  runner_protocol::LoadOptions options;
  options.n_parallel = 4;
  options.n_ctx_per_seq = 512;
  options.flash_attn = "off";
  options.n_batch = 64;  // small: long prompts are fed in several chunks alongside generation
  auto engine = LlamaEngine::Load(model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto results = ServeAll(**engine, lines);
  ASSERT_EQ(results.size(), lines.size());
  int nonempty = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_FALSE(IsErrorOutputLine(results[i])) << DumpJson(results[i]);
    EXPECT_EQ(GeneratedText(results[i]), expected[i]) << "record " << i;
    nonempty += !expected[i].empty();
  }
  EXPECT_GT(nonempty, 6);  // the comparison is about real text, not empty strings
}

TEST_F(EngineReference, SequencesMovedIntoFreeSlotsAtTheTailKeepTheirOutput) {
  // The last records outlive their neighbours: the engine moves them into the free slots below
  // (a copy of their KV streams) so the busy sequences stay consecutive. Their text must not
  // change, with or without shared prefixes.
  const std::string model = TestModel("text.gguf");
  DirectLlama direct(model);
  ASSERT_TRUE(direct.ok());
  std::vector<std::string> lines, expected;
  const int max_tokens[] = {3, 40, 2, 35, 4, 30};
  for (int i = 0; i < 6; ++i) {
    std::string prompt = "Record " + std::to_string(i) + " says hello to the other records";
    lines.push_back(DumpJson({{"custom_id", "t" + std::to_string(i)}, {"prompt", prompt},
                              {"max_tokens", max_tokens[i]}, {"temperature", 0}}));
    expected.push_back(direct.Generate(prompt, false, max_tokens[i]));
  }
  for (bool share : {false, true}) {
    SCOPED_TRACE(share ? "sharing" : "not sharing");
    runner_protocol::LoadOptions options;
    options.n_parallel = 4;
    options.n_ctx_per_seq = 256;
    options.flash_attn = "off";
    options.share_prefixes = share;
    auto engine = LlamaEngine::Load(model, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto results = ServeAll(**engine, lines);
    for (size_t i = 0; i < lines.size(); ++i) {
      ASSERT_FALSE(IsErrorOutputLine(results[i])) << DumpJson(results[i]);
      EXPECT_EQ(GeneratedText(results[i]), expected[i]) << "record " << i;
    }
  }
}

// Whether this machine has an accelerator of its own (RPC devices are other machines).
bool HasLocalAccelerator() {
  ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    auto type = ggml_backend_dev_type(dev);
    if ((type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) &&
        (rpc == nullptr || ggml_backend_dev_backend_reg(dev) != rpc)) {
      return true;
    }
  }
  return false;
}

TEST_F(EngineReference, DefaultAttentionKeepsCpuOutputIndependentOfTheBatch) {
  // Executors load with flash_attn "auto" (the default). On a machine without a GPU that must mean
  // off, RPC backend compiled in or not: llama.cpp's llama_supports_gpu_offload() says yes as soon
  // as the RPC backend exists, and the CPU flash-attention kernels change with the batch, so a
  // record's text would depend on its neighbours (the chaos suite saw it).
  const std::string model = TestModel("text.gguf");
  DirectLlama direct(model);
  ASSERT_TRUE(direct.ok());
  std::vector<std::string> lines, expected;
  for (int i = 0; i < 8; ++i) {
    std::string prompt = "Default attention, record " + std::to_string(i) + std::string(i * 3, '!');
    lines.push_back(DumpJson({{"custom_id", "d" + std::to_string(i)}, {"prompt", prompt},
                              {"max_tokens", 4 + 5 * (i % 3)}, {"temperature", 0}}));
    expected.push_back(direct.Generate(prompt, false, 4 + 5 * (i % 3)));
  }
  runner_protocol::LoadOptions options;
  ASSERT_EQ(options.flash_attn, "auto");
  options.n_parallel = 4;
  options.n_ctx_per_seq = 256;
  auto engine = LlamaEngine::Load(model, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  if (HasLocalAccelerator()) GTEST_SKIP() << "this machine has a GPU: auto leaves the choice to llama.cpp";
  EXPECT_EQ((*engine)->Info()["flash_attn"], "disabled");
  auto results = ServeAll(**engine, lines);
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_FALSE(IsErrorOutputLine(results[i])) << DumpJson(results[i]);
    EXPECT_EQ(GeneratedText(results[i]), expected[i]) << "record " << i;
  }
}

TEST_F(EngineReference, SeededSamplingIsReproducibleWhateverTheBatch) {
  runner_protocol::LoadOptions options;
  options.n_ctx_per_seq = 256;
  options.flash_attn = "off";
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i) {
    lines.push_back(DumpJson({{"custom_id", "s" + std::to_string(i)},
                              {"prompt", "Sampling test " + std::to_string(i)},
                              {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 1234 + i}}));
  }
  options.n_parallel = 4;
  auto batched = LlamaEngine::Load(TestModel("text.gguf"), options);
  ASSERT_TRUE(batched.ok());
  auto together = ServeAll(**batched, lines);
  batched->reset();
  options.n_parallel = 1;
  auto single = LlamaEngine::Load(TestModel("text.gguf"), options);
  ASSERT_TRUE(single.ok());
  std::set<std::string> distinct;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto alone = ServeAll(**single, {lines[i]});
    EXPECT_EQ(GeneratedText(together[i]), GeneratedText(alone[0])) << "record " << i;
    distinct.insert(GeneratedText(together[i]));
  }
  EXPECT_GT(distinct.size(), 1u);
}

TEST_F(EngineReference, EmbeddingsAgreeWithDirectLlamaCpp) {
  for (const char* file : {"embedding.gguf", "text.gguf"}) {
    SCOPED_TRACE(file);
    DirectLlama direct(TestModel(file), /*embeddings=*/true);
    ASSERT_TRUE(direct.ok());
    std::vector<std::string> inputs = {"The quick brown fox", "jumps over the lazy dog",
                                       "a", "Embeddings are vectors that capture meaning in text."};
    runner_protocol::LoadOptions options;
    options.n_parallel = 4;
    options.flash_attn = "off";
    auto engine = LlamaEngine::Load(TestModel(file), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto results = ServeAll(**engine, {DumpJson({{"custom_id", "e"}, {"url", "/v1/embeddings"},
                                                  {"body", {{"input", inputs}}}})});
    const Json& data = results[0]["response"]["body"]["data"];
    ASSERT_EQ(data.size(), inputs.size()) << DumpJson(results[0]);
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<float> got = data[i]["embedding"].get<std::vector<float>>();
      std::vector<float> want = direct.Embed(inputs[i]);
      ASSERT_EQ(got.size(), want.size());
      double norm = 0;
      for (float x : got) norm += (double)x * x;
      EXPECT_NEAR(norm, 1.0, 1e-4) << "not L2-normalised";
      EXPECT_GT(Cosine(got, want), 1.0 - 1e-4) << "input " << i;
    }
  }
}

TEST_F(EngineReference, EmbeddingModelRefusesGeneration) {
  auto engine = LlamaEngine::Load(TestModel("embedding.gguf"), {});
  ASSERT_TRUE(engine.ok());
  auto results = ServeAll(**engine, {R"({"custom_id":"g","prompt":"hello"})"});
  EXPECT_EQ(OutputLineError(results[0])["code"], "invalid_request");
  EXPECT_THAT(OutputLineError(results[0])["message"].get<std::string>(), ::testing::HasSubstr("embedding model"));
}

}  // namespace
}  // namespace minions::llama_runner
