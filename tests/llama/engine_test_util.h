#pragma once
// Helpers the engine tests share: serving parsed records through a LlamaEngine and reading what
// came back.

#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llama.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/test_model_writer.h"
#include "test_env.h"

namespace minions::llama_runner::engine_test {

// The generated text of a completion or chat output line.
inline std::string GeneratedText(const Json& line) {
  const Json& choice = line["response"]["body"]["choices"][0];
  return choice.contains("message") ? choice["message"]["content"].get<std::string>()
                                    : choice["text"].get<std::string>();
}

inline std::vector<WorkItem> ParseItems(const std::vector<std::string>& lines, const std::string& batch = "") {
  std::vector<WorkItem> items;
  for (size_t i = 0; i < lines.size(); ++i) {
    auto parsed = ParseRecordLine(lines[i]);
    EXPECT_TRUE(parsed.ok()) << parsed.error_message;
    if (parsed.ok()) items.push_back({batch, i, *parsed.request});
  }
  return items;
}

// A tiny text model with the tokenizer of `vocab_file` (a llama.cpp models/ggml-vocab-*.gguf) and
// `chat_template`, loaded for its vocabulary and metadata only.
struct VocabModel {
  llama_model* model = nullptr;
  VocabModel(const std::string& vocab_file, const std::string& chat_template, const std::string& name) {
    TestModelSpec spec;
    spec.vocab_path = minions::testing::VocabDir() + "/" + vocab_file;
    spec.n_embd = 32;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_head_kv = 1;
    spec.n_ff = 64;
    spec.chat_template = chat_template;
    const std::string path = ::testing::TempDir() + "/vocab-" + name + "-" + std::to_string(getpid()) + ".gguf";
    absl::Status written = WriteTestModel(spec, path);
    EXPECT_TRUE(written.ok()) << written;
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    model = llama_model_load_from_file(path.c_str(), params);
    std::remove(path.c_str());
    EXPECT_NE(model, nullptr);
  }
  ~VocabModel() {
    if (model) llama_model_free(model);
  }
  VocabModel(const VocabModel&) = delete;
  VocabModel& operator=(const VocabModel&) = delete;
  const llama_vocab* vocab() const { return llama_model_get_vocab(model); }
};

// The text test model in an engine of `n_parallel` slots, CPU attention off (deterministic).
inline std::unique_ptr<LlamaEngine> LoadTextEngine(int n_parallel, int n_ctx_per_seq) {
  runner_protocol::LoadOptions options;
  options.n_parallel = n_parallel;
  options.n_ctx_per_seq = n_ctx_per_seq;
  options.flash_attn = "off";
  auto engine = LlamaEngine::Load(minions::testing::TestModel("text.gguf"), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Serves the lines as one batch; every result by the line's index.
inline std::map<size_t, WorkResult> ServeResults(LlamaEngine& engine, const std::vector<std::string>& lines) {
  std::map<size_t, WorkResult> results;
  auto unserved = engine.Serve(
      ParseItems(lines), [&](WorkResult r) { results[r.index] = std::move(r); }, [] { return false; });
  EXPECT_TRUE(unserved.empty());
  return results;
}

// Serves the lines as one batch; every output line by the line's index.
inline std::map<size_t, Json> ServeAll(LlamaEngine& engine, const std::vector<std::string>& lines) {
  std::map<size_t, Json> outputs;
  for (auto& [index, result] : ServeResults(engine, lines)) outputs[index] = std::move(result.output);
  return outputs;
}

}  // namespace minions::llama_runner::engine_test
