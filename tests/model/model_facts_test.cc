// The model vocabulary: references (model_ref.h), GGUF headers (gguf_header.h) and the one memory
// estimate (memory_estimate.h).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "model/gguf_header.h"
#include "model/json_codec.h"
#include "model/memory_estimate.h"
#include "model/model_ref.h"
#include "testing/gguf_builder.h"

namespace minions {
namespace {

using testing::GgufBuilder;

using ::testing::HasSubstr;

const std::string kHex(64, 'a');

TEST(ModelRef, NamesDigestsAndPaths) {
  absl::StatusOr<ModelRef> ref = ParseModelRef("llama-3b");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->name, "llama-3b");
  EXPECT_EQ(ref->digest, "");
  EXPECT_FALSE(ref->is_path);

  ref = ParseModelRef("llama-3b@sha256:" + kHex);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->name, "llama-3b");
  EXPECT_EQ(ref->digest, "sha256:" + kHex);
  EXPECT_EQ(DigestHex(ref->digest), kHex);

  for (const char* path : {"/models/tiny.gguf", "tiny.gguf", "sub/dir/model", "Model.GGUF"}) {
    ref = ParseModelRef(path);
    ASSERT_TRUE(ref.ok()) << path;
    EXPECT_TRUE(ref->is_path) << path;
    EXPECT_EQ(ref->name, path);
  }
  for (const char* bad : {"", "bad name", "-leading", "x@sha256:abc", "x@md5:" , "x@sha256:" "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "a;b"}) {
    EXPECT_EQ(ParseModelRef(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ValidateModelName("a b").message()), HasSubstr("letters, digits"));
  EXPECT_TRUE(ValidateModelName(std::string(128, 'a')).ok());
  EXPECT_FALSE(ValidateModelName(std::string(129, 'a')).ok());
}

TEST(ModelRef, RunnerNames) {
  EXPECT_TRUE(ValidateRunnerName("llama").ok());
  EXPECT_TRUE(ValidateRunnerName("mlx-lm_2").ok());
  for (const char* bad : {"", "Llama", "1x", "a b", "../x", "a/b"}) {
    EXPECT_FALSE(ValidateRunnerName(bad).ok()) << bad;
  }
}

std::string LlamaHeader() {
  return GgufBuilder()
      .Llama(/*file_type=*/15, /*context_length=*/8192, /*blocks=*/4, /*embedding=*/128)
      .Float("llama.rope.freq_base", 10000.0f)
      .Strings("tokenizer.ggml.tokens", 300)
      .Tensor("token_embd.weight", {128, 300})
      .Tensor("blk.0.attn_q.weight", {128, 128})
      .Build();
}

TEST(GgufHeader, ReadsWhatPlacementNeeds) {
  const std::string header = LlamaHeader();
  absl::StatusOr<ModelFacts> facts = ReadGgufFacts(header, int64_t{1} << 20);
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_EQ(facts->format, "gguf");
  EXPECT_EQ(facts->architecture, "llama");
  EXPECT_EQ(facts->name, "tiny");
  EXPECT_EQ(facts->quantization, "Q4_K_M");
  EXPECT_EQ(facts->context_length, 8192);
  EXPECT_EQ(facts->layers, 4);
  EXPECT_EQ(facts->embedding_size, 128);
  EXPECT_EQ(facts->heads, 4);
  EXPECT_EQ(facts->kv_heads, 2);
  EXPECT_EQ(facts->head_dim, 32);  // embedding / heads when key_length is absent
  EXPECT_EQ(facts->vocab_size, 300);
  EXPECT_EQ(facts->parameters, 128 * 300 + 128 * 128);

  // The facts survive their JSON form (the registry's column).
  absl::StatusOr<ModelFacts> back = ModelFactsFromJson(ModelFactsToJson(*facts));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *facts);
}

TEST(GgufHeader, AShortPrefixAsksForMore) {
  const std::string header = LlamaHeader();
  for (size_t cut : {size_t{3}, size_t{30}, header.size() / 2, header.size() - 1}) {
    EXPECT_EQ(ReadGgufFacts(std::string_view(header).substr(0, cut), 1 << 20).status().code(),
              absl::StatusCode::kOutOfRange)
        << cut;
  }
}

TEST(GgufHeader, HostileHeadersAreRefused) {
  EXPECT_EQ(ReadGgufFacts("NOPE0000000000000000000000", 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadGgufFacts(GgufBuilder().Kv("general.architecture", std::string("x")).Build(9), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  // No architecture.
  EXPECT_EQ(ReadGgufFacts(GgufBuilder().Kv("general.name", std::string("x")).Build(), 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A string that claims more bytes than any file has: asks for more, never reads past the end.
  std::string lying = GgufBuilder().Kv("general.architecture", std::string("llama")).Build();
  const uint64_t huge = ~uint64_t{0} / 2;
  std::memcpy(lying.data() + 24, &huge, sizeof(huge));
  EXPECT_EQ(ReadGgufFacts(lying, 100).status().code(), absl::StatusCode::kOutOfRange);
  // Counts beyond any model.
  std::string many = GgufBuilder().Build();
  const uint64_t count = uint64_t{1} << 40;
  std::memcpy(many.data() + 16, &count, sizeof(count));
  EXPECT_EQ(ReadGgufFacts(many, 100).status().code(), absl::StatusCode::kInvalidArgument);
  // A tensor larger than its file.
  std::string big = GgufBuilder()
                        .Kv("general.architecture", std::string("llama"))
                        .Tensor("w", {uint64_t{1} << 40, uint64_t{1} << 40})
                        .Build();
  EXPECT_EQ(ReadGgufFacts(big, 1000).status().code(), absl::StatusCode::kInvalidArgument);
}

ModelFacts Llama8B() {
  ModelFacts facts;
  facts.architecture = "llama";
  facts.context_length = 131072;
  facts.layers = 32;
  facts.embedding_size = 4096;
  facts.heads = 32;
  facts.kv_heads = 8;
  facts.head_dim = 128;
  facts.vocab_size = 128256;
  return facts;
}

TEST(MemoryEstimate, TheKvCacheFollowsTheFormula) {
  MemoryEstimateOptions options;
  options.n_parallel = 8;
  options.n_ctx_per_seq = 0;  // min(training context, 4096)
  EXPECT_EQ(ContextPerSequence(Llama8B(), options), 4096);
  // 2 × layers × n_ctx_per_seq × parallel × kv_heads × head_dim × 2 bytes.
  EXPECT_EQ(KvCacheBytes(Llama8B(), options), int64_t{2} * 32 * 4096 * 8 * 8 * 128 * 2);
  options.n_ctx_per_seq = 1024;
  options.n_parallel = 2;
  EXPECT_EQ(KvCacheBytes(Llama8B(), options), int64_t{2} * 32 * 1024 * 2 * 8 * 128 * 2);
}

TEST(MemoryEstimate, TheWholeIsModelPlusKvPlusComputePlusMargin) {
  const int64_t model = int64_t{4700} << 20;
  MemoryEstimateOptions options;
  const int64_t sum = model + KvCacheBytes(Llama8B(), options) + ComputeBufferBytes(Llama8B(), options);
  const int64_t estimate = EstimateTaskMemory(model, Llama8B(), options);
  EXPECT_GT(estimate, sum);
  EXPECT_GE(estimate - sum, kMarginFloorBytes);
  EXPECT_NEAR(static_cast<double>(estimate - sum), sum * kMarginFraction, sum * 0.001);
  // More sequences need more memory; a tiny model still gets the margin's floor.
  options.n_parallel = 16;
  EXPECT_GT(EstimateTaskMemory(model, Llama8B(), options), estimate);
  EXPECT_GE(EstimateTaskMemory(1000, ModelFacts{}, MemoryEstimateOptions{}), kMarginFloorBytes);
}

TEST(MemoryEstimate, RunnerOptionsAreRead) {
  absl::StatusOr<MemoryEstimateOptions> options =
      MemoryEstimateOptionsFrom(Json{{"n_parallel", 4}, {"n_ctx_per_seq", 2048}, {"flash_attn", "on"}});
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->n_parallel, 4);
  EXPECT_EQ(options->n_ctx_per_seq, 2048);
  EXPECT_EQ(options->n_batch, 512);
  options = MemoryEstimateOptionsFrom(Json::object());
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->n_parallel, 8);  // the runner's default (runner_protocol::LoadOptions)
  EXPECT_FALSE(MemoryEstimateOptionsFrom(Json{{"n_parallel", "8"}}).ok());
  EXPECT_FALSE(MemoryEstimateOptionsFrom(Json{{"n_ctx_per_seq", -1}}).ok());
}

}  // namespace
}  // namespace minions
