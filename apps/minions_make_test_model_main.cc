// minions-make-test-model: writes a GGUF model with random weights and a real tokenizer (see
// src/runner/llama/test_model_writer.h): a tiny one for tests and trying Minions out, or one with
// the dimensions and quantisation of a real model for benchmarks, without downloading a model.
//
//   minions-make-test-model -o /tmp/text.gguf
//   minions-make-test-model --kind embedding --seed 7 -o /tmp/embed.gguf
//   minions-make-test-model --shape 1b --type q4_0 -o /tmp/llama-1b-q4_0.gguf
//   minions-make-test-model --list-shapes
//
// The tokenizer comes from --vocab, or else from the shape's vocab file, ggml-vocab-llama-spm.gguf
// (text) or ggml-vocab-bert-bge.gguf (embedding) in $MINIONS_VOCAB_DIR, or else in the folder this
// program was built with (MINIONS_DEFAULT_VOCAB_DIR, llama.cpp's models/ folder).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"

#include "runner/llama/test_model_writer.h"

#ifndef MINIONS_DEFAULT_VOCAB_DIR
#define MINIONS_DEFAULT_VOCAB_DIR ""
#endif

namespace {

using minions::llama_runner::ModelShapes;
using minions::llama_runner::TestModelKind;
using minions::llama_runner::TestModelSpec;
using minions::llama_runner::TestModelWeights;

int Fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a tiny GGUF model with random weights and a real tokenizer (for tests)",
               "minions-make-test-model"};
  TestModelSpec spec;
  std::string output;
  std::string kind = "text";
  app.add_option("--kind", kind, "text (llama architecture) or embedding (bert, mean pooling)")
      ->check(CLI::IsMember({"text", "embedding"}))
      ->capture_default_str();
  app.add_option("--seed", spec.seed, "seed of the random weights (same seed: same bytes)")
      ->capture_default_str();
  app.add_option("--vocab", spec.vocab_path,
                 "tokenizer: a llama.cpp models/ggml-vocab-*.gguf file (default: "
                 "ggml-vocab-llama-spm.gguf / ggml-vocab-bert-bge.gguf in $MINIONS_VOCAB_DIR, "
                 "else in '" MINIONS_DEFAULT_VOCAB_DIR "')");
  std::string shape;
  std::string type = "small";
  bool list_shapes = false;
  auto* n_embd = app.add_option("--n-embd", spec.n_embd, "embedding width")->capture_default_str();
  auto* n_layer = app.add_option("--n-layer", spec.n_layer, "number of layers")->capture_default_str();
  auto* shape_opt = app.add_option("--shape", shape,
                                   "the dimensions and tokenizer of a real model (0.5b, 1b, 3b, 8b; "
                                   "see --list-shapes)")
                        ->excludes(n_embd)
                        ->excludes(n_layer);
  app.add_option("--type", type,
                 "weights: small (F16 embeddings, F32 matrices), f16, q8_0, q4_0, q4_k_m (as "
                 "llama-quantize lays them out)")
      ->capture_default_str();
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "the text model's chat template: chatml (the default), llama3, qwen2.5-tools (Qwen 2.5's, "
                 "with tool calling), none");
  app.add_flag("--list-shapes", list_shapes, "print the known shapes and exit");
  auto* output_opt = app.add_option("-o,--output", output, "the .gguf file to write");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return Fail(std::string(e.what()) + " (see --help)");
  }
  if (list_shapes) {
    for (const auto& s : ModelShapes()) {
      std::printf("%-5s %-60s n_embd %d, %d layers, %d/%d heads, n_ff %d, %s, %lld parameters\n",
                  s.name.c_str(), s.resembles.c_str(), s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.n_ff,
                  s.vocab_file.c_str(), static_cast<long long>(s.n_params));
    }
    return 0;
  }
  if (output_opt->count() == 0) return Fail("--output is required (see --help)");
  auto weights = minions::llama_runner::ParseTestModelWeights(type);
  if (!weights.ok()) return Fail(std::string(weights.status().message()));

  const bool text = kind == "text";
  const char* env = std::getenv("MINIONS_VOCAB_DIR");
  const std::string vocab_dir = (env != nullptr && *env != '\0') ? env : MINIONS_DEFAULT_VOCAB_DIR;
  if (shape_opt->count() > 0) {
    if (!text) return Fail("--shape makes text models; leave out --kind embedding");
    auto shaped = minions::llama_runner::ShapedModelSpec(shape, *weights, vocab_dir);
    if (!shaped.ok()) return Fail(std::string(shaped.status().message()));
    const uint64_t seed = spec.seed;
    const std::string vocab = spec.vocab_path;
    spec = *shaped;
    spec.seed = seed;
    if (!vocab.empty()) spec.vocab_path = vocab;
  } else {
    spec.kind = text ? TestModelKind::kText : TestModelKind::kEmbedding;
    spec.weights = *weights;
  }
  if (spec.vocab_path.empty()) {
    if (vocab_dir.empty()) {
      return Fail(
          "no tokenizer: pass --vocab FILE (one of llama.cpp's models/ggml-vocab-*.gguf) or set "
          "MINIONS_VOCAB_DIR to llama.cpp's models/ folder");
    }
    spec.vocab_path =
        (std::filesystem::path(vocab_dir) / (text ? "ggml-vocab-llama-spm.gguf" : "ggml-vocab-bert-bge.gguf"))
            .string();
  }
  if (!chat_template.empty()) {
    if (!text) return Fail("--chat-template is for text models; leave out --kind embedding");
    auto tmpl = minions::llama_runner::TestModelChatTemplate(chat_template);
    if (!tmpl.ok()) return Fail(std::string(tmpl.status().message()));
    spec.chat_template = *tmpl;
  }
  auto size = minions::llama_runner::PlanTestModel(spec);
  if (!size.ok()) return Fail(std::string(size.status().message()));

  if (absl::Status st = minions::llama_runner::WriteTestModel(spec, output); !st.ok()) {
    return Fail(std::string(st.message()));
  }

  std::error_code ec;
  const auto file_size = std::filesystem::file_size(output, ec);
  const std::string of_shape = shape.empty() ? "" : " of shape " + shape;
  std::printf("wrote %s: %s test model%s (vocab %s, weights %s, seed %llu), %lld parameters, %llu bytes\n",
              output.c_str(), text ? "text" : "embedding", of_shape.c_str(),
              spec.vocab_path.c_str(), type.c_str(), static_cast<unsigned long long>(spec.seed),
              static_cast<long long>(size->n_params), static_cast<unsigned long long>(ec ? 0 : file_size));
  return 0;
}
