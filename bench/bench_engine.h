#pragma once
// The engine benchmarks' shared steps (rescore_bench.cc, schema_bench.cc): the model they run
// (given, or a random-weight test model made once) and the engine they load it in.

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench_util.h"
#include "runner/llama/llama_engine.h"

namespace minions::bench {

// `model` when given; else a random-weight test model in `work_dir` (of `shape` and `type`, or
// the test model "text" without a shape), made by minions-make-test-model unless it is there.
inline absl::StatusOr<std::string> BenchModel(const std::string& model, const std::string& shape,
                                              const std::string& type, const std::string& work_dir) {
  if (!model.empty()) return model;
  std::filesystem::create_directories(work_dir);
  const std::string made = work_dir + "/" + (shape.empty() ? "text" : shape + "-" + type) + ".gguf";
  if (std::filesystem::exists(made)) return made;
  std::vector<std::string> make = {BinDir() + "/minions-make-test-model", "-o", made};
  if (!shape.empty()) make.insert(make.end(), {"--shape", shape, "--type", type});
  std::string out;
  if (auto status = RunProgram(make, work_dir + "/make-model.log", out); !status.ok()) return status;
  return made;
}

// An engine of `model` for a benchmark: flash attention off (on a CPU the output then does not
// depend on the batch); n_batch 0 keeps the runner's default.
inline absl::StatusOr<std::unique_ptr<llama_runner::LlamaEngine>> LoadBenchEngine(const std::string& model,
                                                                                  int threads, int parallel,
                                                                                  int n_ctx_per_seq, int n_batch = 0) {
  runner_protocol::LoadOptions options;
  options.n_threads = threads;
  options.n_parallel = parallel;
  if (n_batch > 0) options.n_batch = n_batch;
  options.n_ctx_per_seq = n_ctx_per_seq;
  options.flash_attn = "off";
  return llama_runner::LlamaEngine::Load(model, options);
}

}  // namespace minions::bench
