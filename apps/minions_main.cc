// minions: one binary, subcommands. Wiring only; the verbs live in src/cli.

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/demo.h"
#include "cli/local_run.h"
#include "minions/version.h"

namespace {

void AddLoadOptions(CLI::App* cmd, minions::runner_protocol::LoadOptions* load) {
  cmd->add_option("--parallel", load->n_parallel, "sequences decoded together")->capture_default_str();
  cmd->add_option("--ctx-per-seq", load->n_ctx_per_seq, "context tokens per sequence (0: model's, at most 4096)");
  cmd->add_option("--threads", load->n_threads, "CPU threads (0: all cores)");
  cmd->add_option("--gpu-layers", load->n_gpu_layers, "layers offloaded to the GPU (-1: all)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Minions: a virtual GPU cloud made of idle machines, for batch inference"};
  app.set_version_flag("--version", std::string("minions ") + minions::kVersion);
  app.require_subcommand(1);

  minions::cli::DemoOptions demo;
  demo.workdir = minions::cli::MinionsHome() + "/demo";
  auto* demo_cmd = app.add_subcommand("demo", "run the main job end to end on this machine (makes a test model and prompts)");
  demo_cmd->add_option("--workdir", demo.workdir, "where the model, input and output go")->capture_default_str();
  demo_cmd->add_option("--records", demo.records, "number of sample records")->capture_default_str();
  AddLoadOptions(demo_cmd, &demo.load);

  minions::cli::LocalRunOptions local;
  auto* local_cmd = app.add_subcommand("local-run", "run a JSONL batch file through a runner on this machine, without a server");
  local_cmd->add_option("input", local.input_path, "OpenAI Batch request lines (JSONL)")->required();
  local_cmd->add_option("--model", local.model_path, "GGUF model file")->required();
  local_cmd->add_option("-o,--output", local.output_path, "output lines")->required();
  local_cmd->add_option("--errors", local.errors_path, "error lines (default: OUTPUT.errors.jsonl)");
  local_cmd->add_option("--runner", local.runner, "runner program (default: minions-llama-runner)");
  local_cmd->add_option("--batch-size", local.batch_size, "records per runner batch")->capture_default_str();
  local_cmd->add_flag("!--no-progress", local.progress, "no progress line");
  AddLoadOptions(local_cmd, &local.load);

  CLI11_PARSE(app, argc, argv);

  if (demo_cmd->parsed()) return minions::cli::RunDemo(demo);
  if (local_cmd->parsed()) {
    if (local.errors_path.empty()) local.errors_path = local.output_path + ".errors.jsonl";
    auto summary = minions::cli::RunLocally(local);
    if (!summary.ok()) {
      fprintf(stderr, "error: %s\n", std::string(summary.status().message()).c_str());
      return 1;
    }
    printf("%zu records (%zu errors) in %.2f s: %.1f records/s, %.1f generated tokens/s\n",
           summary->records, summary->errors, summary->seconds,
           summary->records / std::max(summary->seconds, 1e-9),
           summary->completion_tokens / std::max(summary->seconds, 1e-9));
    return 0;
  }
  return 0;
}
