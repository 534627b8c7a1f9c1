#pragma once
// Writes GGUF models with random weights and a real tokenizer, for tests and benchmarks that need
// llama.cpp to load and run something without downloading a model: tiny ones for the tests, and
// ones with the dimensions and quantisations of real models (ShapedModelSpec) for benchmarks,
// whose throughput is then what it would be with the real weights (llama.cpp's kernels do the
// same work whatever the values).
//
// The tokenizer comes from one of llama.cpp's models/ggml-vocab-*.gguf files (they hold only
// tokenizer.* metadata, no tensors); every tokenizer.* key is copied over unchanged, so the
// model tokenizes exactly like the real one. The weights come from a splitmix64 stream per tensor,
// seeded from (spec.seed, tensor index), and are made with integer arithmetic only: uniform
// numbers converted to F16/F32 bit by bit, or, for quantised types, random quants under fixed
// block scales (no float quantiser runs). The same spec and vocab file give a byte-identical file
// on every platform and compiler. The text it generates is gibberish, but deterministic gibberish.
//
//   kText      architecture "llama" (RMS norm, RoPE, GQA, SwiGLU), general.name
//              "minions-test-text" unless spec.name says otherwise.
//   kEmbedding architecture "bert" (non-causal, mean pooling), general.name
//              "minions-test-embedding"; meant for the bert-bge (WordPiece) vocab.
//
// Tensors are written one at a time (a model of several GB never sits in memory), to
// out_path + ".tmp", which is renamed into place: a half-written model never appears at out_path.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace minions::llama_runner {

enum class TestModelKind { kText, kEmbedding };

// How the weights are stored. kSmall is the tiny test model's mix (embeddings and output F16,
// other matrices F32). The others follow llama.cpp's llama-quantize for that file type: kF16 and
// kQ8_0 store every matrix so; kQ4_0 stores the output matrix (or the tied embeddings) as Q6_K;
// kQ4_K_M also Q6_K for half of the attn_v and ffn_down layers. A k-quant whose rows are not a
// multiple of 256 falls back as llama-quantize does (Q4_K -> Q5_0, Q6_K -> Q8_0). Norms are F32.
enum class TestModelWeights { kSmall, kF16, kQ8_0, kQ4_0, kQ4_K_M };

// The template the small kText model stores (llama_chat_apply_template detects it as "chatml").
extern const char kTestModelChatTemplate[];
// Llama 3's chat format without the date preamble and tool handling: llama.cpp's built-in
// "llama3" format and a Jinja renderer (llama-server --jinja) give the same text from it.
extern const char kLlama3ChatTemplate[];
// Qwen 2.5 Instruct's own template, with tool calling (tools rendered into the system message,
// calls written as <tool_call>{...}</tool_call>): tool calls run end to end on a test model.
extern const char kQwen25ToolChatTemplate[];
// A template by name, for minions-make-test-model --chat-template: "chatml" (the default),
// "llama3", "qwen2.5-tools", "none".
absl::StatusOr<std::string> TestModelChatTemplate(std::string_view name);

struct TestModelSpec {
  TestModelKind kind = TestModelKind::kText;
  uint64_t seed = 42;
  // A llama.cpp models/ggml-vocab-*.gguf file (ggml-vocab-llama-spm.gguf for the small kText
  // model, ggml-vocab-bert-bge.gguf for kEmbedding).
  std::string vocab_path;
  std::string name;  // general.name; empty: "minions-test-text" / "minions-test-embedding"
  int n_embd = 128;
  int n_layer = 4;
  int n_head = 4;
  int n_head_kv = 2;  // GQA; ignored for kEmbedding (BERT has n_head_kv == n_head)
  int n_ff = 384;
  // Also the size of BERT's learned position table (n_ctx_train x n_embd floats), and the most
  // tokens one sequence of a kEmbedding model can hold.
  int n_ctx_train = 4096;
  float rope_freq_base = 10000.0f;  // kText
  // kText: no output.weight; the token embeddings serve as the output matrix too (Llama 3.2 1B
  // and 3B, Qwen2.5 0.5B).
  bool tied_embeddings = false;
  TestModelWeights weights = TestModelWeights::kSmall;
  // kText only: the chat template stored in tokenizer.chat_template; empty: none (any template
  // the vocab file carried is removed either way).
  std::string chat_template = kTestModelChatTemplate;
};

// A model with the dimensions of a real one.
struct ModelShape {
  std::string name;        // what --shape takes: "0.5b", "1b", "3b", "8b"
  std::string resembles;   // the real model whose dimensions these are
  std::string vocab_file;  // file name in llama.cpp's models/ folder
  int n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx_train;
  float rope_freq_base;
  bool tied_embeddings;
  bool llama3_template;  // else chatml
  // Parameters of the model this writer makes with that vocab file (what llama.cpp reports as
  // n_params); the tests check the tensor plan against it.
  int64_t n_params;
};

// The shapes ShapedModelSpec knows, smallest first.
const std::vector<ModelShape>& ModelShapes();

// The spec of a random-weight model with that shape's dimensions and tokenizer (found in
// vocab_dir) and those weights; an unknown shape is an error that lists the known ones.
absl::StatusOr<TestModelSpec> ShapedModelSpec(std::string_view shape, TestModelWeights weights,
                                              const std::string& vocab_dir);

// "f16", "q8_0", "q4_0", "q4_k_m" (and "small") <-> TestModelWeights.
absl::StatusOr<TestModelWeights> ParseTestModelWeights(std::string_view name);
std::string TestModelWeightsName(TestModelWeights weights);

// What a spec would write, without writing it: parameters (every tensor's elements, as llama.cpp
// counts them) and bytes of tensor data (before alignment padding).
struct TestModelSize {
  int64_t n_params = 0;
  uint64_t tensor_bytes = 0;
};
absl::StatusOr<TestModelSize> PlanTestModel(const TestModelSpec& spec);

absl::Status WriteTestModel(const TestModelSpec& spec, const std::string& out_path);

}  // namespace minions::llama_runner
