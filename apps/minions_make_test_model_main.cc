// minions-make-test-model: writes a tiny GGUF model with random weights and a real tokenizer
// (see src/runner/llama/test_model_writer.h), for tests, benchmarks and trying Minions out without
// downloading a model.
//
//   minions-make-test-model -o /tmp/text.gguf
//   minions-make-test-model --kind embedding --seed 7 -o /tmp/embed.gguf
//
// The tokenizer comes from --vocab, or else from ggml-vocab-llama-spm.gguf (text) or
// ggml-vocab-bert-bge.gguf (embedding) in $MINIONS_VOCAB_DIR, or else in the folder this program
// was built with (MINIONS_DEFAULT_VOCAB_DIR, llama.cpp's models/ folder).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>

#include "runner/llama/test_model_writer.h"

#ifndef MINIONS_DEFAULT_VOCAB_DIR
#define MINIONS_DEFAULT_VOCAB_DIR ""
#endif

namespace {

using minions::llama_runner::TestModelKind;
using minions::llama_runner::TestModelSpec;

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
  app.add_option("--n-embd", spec.n_embd, "embedding width")->capture_default_str();
  app.add_option("--n-layer", spec.n_layer, "number of layers")->capture_default_str();
  app.add_option("-o,--output", output, "the .gguf file to write")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return Fail(std::string(e.what()) + " (see --help)");
  }

  const bool text = kind == "text";
  spec.kind = text ? TestModelKind::kText : TestModelKind::kEmbedding;
  if (spec.vocab_path.empty()) {
    const char* env = std::getenv("MINIONS_VOCAB_DIR");
    const std::string dir = (env != nullptr && *env != '\0') ? env : MINIONS_DEFAULT_VOCAB_DIR;
    if (dir.empty()) {
      return Fail(
          "no tokenizer: pass --vocab FILE (one of llama.cpp's models/ggml-vocab-*.gguf) or set "
          "MINIONS_VOCAB_DIR to llama.cpp's models/ folder");
    }
    spec.vocab_path =
        (std::filesystem::path(dir) / (text ? "ggml-vocab-llama-spm.gguf" : "ggml-vocab-bert-bge.gguf"))
            .string();
  }

  if (absl::Status st = minions::llama_runner::WriteTestModel(spec, output); !st.ok()) {
    return Fail(std::string(st.message()));
  }

  std::error_code ec;
  const auto size = std::filesystem::file_size(output, ec);
  std::printf("wrote %s: %s test model (vocab %s, seed %llu), %llu bytes\n", output.c_str(),
              text ? "text" : "embedding", spec.vocab_path.c_str(),
              static_cast<unsigned long long>(spec.seed),
              static_cast<unsigned long long>(ec ? 0 : size));
  return 0;
}
