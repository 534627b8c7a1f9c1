#include "runner/llama/test_model_writer.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <cmath>

#include <gtest/gtest.h>

#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "runner/llama/llama_engine.h"
#include "test_env.h"
#include "testing/read_file.h"

namespace minions::llama_runner {
namespace {

namespace fs = std::filesystem;

class TestModelWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("minions-model-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    vocab_ = minions::testing::VocabDir() + "/ggml-vocab-llama-spm.gguf";
  }
  void TearDown() override { fs::remove_all(dir_); }
  TestModelSpec Spec(uint64_t seed) {
    TestModelSpec spec;
    spec.seed = seed;
    spec.vocab_path = vocab_;
    spec.n_layer = 1;
    return spec;
  }
  fs::path dir_;
  std::string vocab_;
};

TEST_F(TestModelWriter, SameSeedSameBytesOtherSeedOtherBytes) {
  ASSERT_TRUE(WriteTestModel(Spec(1), (dir_ / "a.gguf").string()).ok());
  ASSERT_TRUE(WriteTestModel(Spec(1), (dir_ / "b.gguf").string()).ok());
  ASSERT_TRUE(WriteTestModel(Spec(2), (dir_ / "c.gguf").string()).ok());
  std::string a = minions::testing::ReadFile((dir_ / "a.gguf").string());
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_EQ(a.substr(0, 4), "GGUF");
  EXPECT_EQ(a, minions::testing::ReadFile((dir_ / "b.gguf").string()));
  EXPECT_NE(a, minions::testing::ReadFile((dir_ / "c.gguf").string()));
}

TEST_F(TestModelWriter, MissingVocabIsAClearErrorAndLeavesNoFile) {
  TestModelSpec spec = Spec(1);
  spec.vocab_path = (dir_ / "no-such-vocab.gguf").string();
  auto status = WriteTestModel(spec, (dir_ / "m.gguf").string());
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_FALSE(fs::exists(dir_ / "m.gguf"));
  EXPECT_FALSE(fs::exists(dir_ / "m.gguf.tmp"));
}

// The published parameter counts of the models whose dimensions the shapes copy.
TEST_F(TestModelWriter, ShapesHaveTheParameterCountsOfTheModelsTheyCopy) {
  const std::map<std::string, int64_t> published = {
      {"0.5b", 494032768 - 27648},  // Qwen2.5 0.5B without its q/k/v biases (llama architecture)
      {"1b", 1235814400},           // Llama 3.2 1B
      {"3b", 3212749824},           // Llama 3.2 3B
      {"8b", 8030261248},           // Llama 3.1 8B
  };
  ASSERT_EQ(ModelShapes().size(), published.size());
  for (const ModelShape& shape : ModelShapes()) {
    SCOPED_TRACE(shape.name);
    ASSERT_EQ(published.count(shape.name), 1u);
    EXPECT_EQ(shape.n_params, published.at(shape.name));
    // The weight type changes bytes, not parameters (each plan reads the vocab file: one will do).
    auto spec = ShapedModelSpec(shape.name, TestModelWeights::kQ4_K_M, minions::testing::VocabDir());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto size = PlanTestModel(*spec);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(size->n_params, shape.n_params);
  }
  // Bytes per weight follow the file type: 8B in Q4_0 is about 4.65 GB, in F16 16.06 GB.
  auto q4 = PlanTestModel(*ShapedModelSpec("8b", TestModelWeights::kQ4_0, minions::testing::VocabDir()));
  auto f16 = PlanTestModel(*ShapedModelSpec("8b", TestModelWeights::kF16, minions::testing::VocabDir()));
  EXPECT_NEAR(q4->tensor_bytes / 1e9, 4.65, 0.01);
  EXPECT_NEAR(f16->tensor_bytes / 1e9, 16.06, 0.01);
  EXPECT_FALSE(ShapedModelSpec("70b", TestModelWeights::kQ4_0, minions::testing::VocabDir()).ok());
  EXPECT_FALSE(ParseTestModelWeights("q3_k").ok());
}

// Tensor name -> type, read back from a written file's header.
std::map<std::string, ggml_type> TensorTypes(const std::string& path) {
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* ctx = gguf_init_from_file(path.c_str(), params);
  std::map<std::string, ggml_type> types;
  if (ctx == nullptr) return types;
  for (int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i) types[gguf_get_tensor_name(ctx, i)] = gguf_get_tensor_type(ctx, i);
  gguf_free(ctx);
  return types;
}

// Loads the model with llama.cpp, checks its parameter count and decodes a prompt: the logits
// must be finite (random weights that overflowed would give NaN or inf).
void ExpectLoadsAndRuns(const std::string& path, int64_t n_params) {
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(path.c_str(), mp);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(static_cast<int64_t>(llama_model_n_params(model)), n_params);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = 64;
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  ASSERT_NE(ctx, nullptr);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const std::string text = "The quick brown fox jumps over the lazy dog";
  std::vector<llama_token> tokens(64);
  tokens.resize(llama_tokenize(vocab, text.data(), text.size(), tokens.data(), tokens.size(), true, false));
  ASSERT_GT(tokens.size(), 4u);
  ASSERT_EQ(llama_decode(ctx, llama_batch_get_one(tokens.data(), tokens.size())), 0);
  const float* logits = llama_get_logits_ith(ctx, -1);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  float lo = logits[0], hi = logits[0];
  for (int i = 0; i < n_vocab; ++i) {
    ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i;
    lo = std::min(lo, logits[i]);
    hi = std::max(hi, logits[i]);
  }
  EXPECT_LT(lo, hi);  // not all the same: the weights do something
  llama_free(ctx);
  llama_model_free(model);
}

TEST_F(TestModelWriter, EveryWeightTypeLoadsAndRunsWithLlamaQuantizesLayout) {
  InstallLlamaLogging();
  for (auto weights : {TestModelWeights::kF16, TestModelWeights::kQ8_0, TestModelWeights::kQ4_0,
                       TestModelWeights::kQ4_K_M}) {
    const std::string name = TestModelWeightsName(weights);
    SCOPED_TRACE(name);
    TestModelSpec spec = Spec(7);
    spec.weights = weights;
    spec.n_embd = 256;  // k-quant rows: multiples of 256
    spec.n_ff = 640;    // not one: ffn_down's k-quants fall back, as llama-quantize's do
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_layer = 8;
    const std::string path = (dir_ / (name + ".gguf")).string();
    ASSERT_TRUE(WriteTestModel(spec, path).ok());
    auto size = PlanTestModel(spec);
    ASSERT_TRUE(size.ok());
    ExpectLoadsAndRuns(path, size->n_params);
    auto types = TensorTypes(path);
    EXPECT_EQ(types["output_norm.weight"], GGML_TYPE_F32);
    switch (weights) {
      case TestModelWeights::kF16:
        EXPECT_EQ(types["blk.0.ffn_up.weight"], GGML_TYPE_F16);
        EXPECT_EQ(types["output.weight"], GGML_TYPE_F16);
        break;
      case TestModelWeights::kQ8_0:
        EXPECT_EQ(types["blk.0.ffn_up.weight"], GGML_TYPE_Q8_0);
        EXPECT_EQ(types["output.weight"], GGML_TYPE_Q8_0);
        break;
      case TestModelWeights::kQ4_0:
        EXPECT_EQ(types["blk.0.ffn_up.weight"], GGML_TYPE_Q4_0);
        EXPECT_EQ(types["token_embd.weight"], GGML_TYPE_Q4_0);
        EXPECT_EQ(types["output.weight"], GGML_TYPE_Q6_K);
        break;
      case TestModelWeights::kQ4_K_M:
        EXPECT_EQ(types["blk.1.attn_q.weight"], GGML_TYPE_Q4_K);
        EXPECT_EQ(types["blk.0.attn_v.weight"], GGML_TYPE_Q6_K);  // llama-quantize's use_more_bits
        EXPECT_EQ(types["blk.1.attn_v.weight"], GGML_TYPE_Q4_K);
        EXPECT_EQ(types["blk.0.ffn_down.weight"], GGML_TYPE_Q8_0);  // Q6_K, 640 columns: fallback
        EXPECT_EQ(types["blk.1.ffn_down.weight"], GGML_TYPE_Q5_0);  // Q4_K, 640 columns: fallback
        EXPECT_EQ(types["output.weight"], GGML_TYPE_Q6_K);
        break;
      default:
        break;
    }
  }
}

TEST_F(TestModelWriter, TheSmallestShapeLoadsInLlamaCppWithTheCountItClaims) {
  // 0.5b in Q4_0 is the smallest real shape (350 MB); the larger ones are the same code with
  // bigger numbers, checked above without writing them.
  InstallLlamaLogging();
  auto spec = ShapedModelSpec("0.5b", TestModelWeights::kQ4_0, minions::testing::VocabDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string path = (dir_ / "shape-0.5b.gguf").string();
  ASSERT_TRUE(WriteTestModel(*spec, path).ok());
  ExpectLoadsAndRuns(path, ModelShapes()[0].n_params);
  auto types = TensorTypes(path);
  EXPECT_EQ(types.count("output.weight"), 0u);                // tied embeddings
  EXPECT_EQ(types["token_embd.weight"], GGML_TYPE_Q8_0);      // as output: Q6_K, 896 columns: Q8_0
  EXPECT_EQ(types["blk.0.ffn_down.weight"], GGML_TYPE_Q4_0);
}

}  // namespace
}  // namespace minions::llama_runner
