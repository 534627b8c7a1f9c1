#pragma once
// Writes tiny GGUF models with random weights and a real tokenizer, for tests and benchmarks that
// need llama.cpp to load and run something without downloading a model.
//
// The tokenizer comes from one of llama.cpp's models/ggml-vocab-*.gguf files (they hold only
// tokenizer.* metadata, no tensors); every tokenizer.* key is copied over unchanged, so the
// model tokenizes exactly like the real one. The weights are uniform random numbers drawn from a
// splitmix64 stream per tensor, seeded from (spec.seed, tensor index), and converted with integer
// arithmetic only: the same spec and vocab file give a byte-identical file on every platform and
// compiler. The text it generates is gibberish, but it is deterministic gibberish.
//
//   kText      architecture "llama" (RMS norm, RoPE, GQA, SwiGLU), general.name
//              "minions-test-text"; token_embd and output in F16, everything else F32. With the
//              llama-spm vocab and the default sizes the file is about 20 MB.
//   kEmbedding architecture "bert" (non-causal, mean pooling), general.name
//              "minions-test-embedding"; meant for the bert-bge (WordPiece) vocab.
//
// The file is written to out_path + ".tmp" and renamed into place, so a half-written model never
// appears at out_path.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace minions::llama_runner {

enum class TestModelKind { kText, kEmbedding };

struct TestModelSpec {
  TestModelKind kind = TestModelKind::kText;
  uint64_t seed = 42;
  // A llama.cpp models/ggml-vocab-*.gguf file (ggml-vocab-llama-spm.gguf for kText,
  // ggml-vocab-bert-bge.gguf for kEmbedding).
  std::string vocab_path;
  int n_embd = 128;
  int n_layer = 4;
  int n_head = 4;
  int n_head_kv = 2;  // GQA; ignored for kEmbedding (BERT has n_head_kv == n_head)
  int n_ff = 384;
  // Also the size of BERT's learned position table (n_ctx_train x n_embd floats), and the most
  // tokens one sequence of a kEmbedding model can hold.
  int n_ctx_train = 4096;
  // kText only: store a chatml template in tokenizer.chat_template (llama_chat_apply_template
  // detects it as "chatml"). When false, any template the vocab file carried is removed, so the
  // model has none.
  bool with_chat_template = true;
};

// The chat template WriteTestModel stores for kText models with with_chat_template.
extern const char kTestModelChatTemplate[];

absl::Status WriteTestModel(const TestModelSpec& spec, const std::string& out_path);

}  // namespace minions::llama_runner
