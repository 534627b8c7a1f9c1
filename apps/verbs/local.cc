#include "verbs/local.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/credentials.h"
#include "local_pool.h"

namespace minions::apps {

void AddUpVerb(CLI::App& app, const SharedFlags& shared, LocalVerbs* l) {
  minions::cli::PoolOptions& pool_options = l->pool_options;
  pool_options.data_dir = shared.home + "/pool";
  pool_options.listen = "127.0.0.1:7070";
  pool_options.http_listen = "127.0.0.1:7080";
  auto* up_cmd = l->up_cmd =
      app.add_subcommand("up", "run a whole pool on this machine: server, watchdog, executors");
  up_cmd->add_option("--executors", pool_options.executors, "executor processes")->capture_default_str();
  up_cmd->add_option("--listen", pool_options.listen, "server address")->capture_default_str();
  up_cmd->add_option("--http-listen", pool_options.http_listen, "dashboard and metrics address (off: none)")
      ->capture_default_str();
  up_cmd->add_option("--data-dir", pool_options.data_dir, "database, objects, logs")->capture_default_str();
  up_cmd->add_flag("--tls", pool_options.tls, "TLS from a private CA made in DATA_DIR/tls (needed off loopback)");
  up_cmd->add_option("--tls-cert", pool_options.tls_cert, "TLS certificate of your own");
  up_cmd->add_option("--tls-key", pool_options.tls_key, "its private key");
  up_cmd->add_option("--ca", pool_options.tls_ca, "the CA that signed --tls-cert");
  up_cmd->add_option("--models", pool_options.model_folders,
                     "a folder the executors may load models from (repeat; default ~/.minions/models)");
}

void AddDemoAndLocalRun(CLI::App& app, const SharedFlags& shared, LocalVerbs* l) {
  minions::cli::DemoOptions& demo = l->demo;
  demo.workdir = shared.home + "/demo";
  auto* demo_cmd = l->demo_cmd =
      app.add_subcommand("demo", "the main job: a pool of 2 executors runs a batch end to end");
  demo_cmd->add_option("--workdir", demo.workdir, "where the model, input, output and pool data go")->capture_default_str();
  demo_cmd->add_option("--records", demo.records, "number of sample records")->capture_default_str();
  demo_cmd->add_option("--executors", demo.executors, "executor processes")->capture_default_str();

  minions::cli::LocalRunOptions& local = l->local;
  auto* local_cmd = l->local_cmd =
      app.add_subcommand("local-run", "run a JSONL file through one runner on this machine, no server");
  local_cmd->add_option("input", local.input_path, "OpenAI Batch request lines (JSONL)")->required();
  local_cmd->add_option("--model", local.model_path, "GGUF model file")->required();
  local_cmd->add_option("-o,--output", local.output_path, "output lines")->required();
  local_cmd->add_option("--errors", local.errors_path, "error lines (default: OUTPUT.errors.jsonl)");
  local_cmd->add_option("--runner", local.runner, "runner program (default: minions-llama-runner)");
  local_cmd->add_option("--batch-size", local.batch_size, "records per runner batch")->capture_default_str();
  local_cmd->add_flag("!--no-progress", local.progress, "no progress line");
  AddLoadOptions(local_cmd, &local.load);
}

int RunUp(const minions::cli::PoolOptions& options) {
  auto pool = minions::apps::StartLocalPool(options);
  if (!pool.ok()) {
    fprintf(stderr, "error: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  const std::string ca = (*pool)->ca_file().empty() ? "" : " --ca " + (*pool)->ca_file();
  // Each path on a line of its own: the rest fits an 80-column terminal.
  const std::string token_file = (*pool)->admin_token_file();
  const int executors = (*pool)->executor_count();
  printf("pool up: server %s, %d executor%s\n"
         "  data:      %s\n"
         "  submit:    minions submit FILE --model PATH --server %s\n",
         (*pool)->address().c_str(), executors, executors == 1 ? "" : "s", options.data_dir.c_str(),
         (*pool)->address().c_str());
  if (!ca.empty()) printf("             %s\n", ca.c_str() + 1);
  printf("  admin:     its token (mode 0600) is in\n"
         "             %s\n",
         token_file.c_str());
  if (token_file == minions::cli::MinionsHome() + "/pool/admin-token") {
    printf("             where the CLI on this machine finds it\n");
  } else {
    printf("             which the CLI finds with MINIONS_TOKEN_FILE set to it\n");
  }
  if (!(*pool)->dashboard_url().empty()) {
    printf("  dashboard: %s\n"
           "             (Prometheus metrics at %smetrics)\n"
           "             sign in with a token: the admin's (cat the file above),\n"
           "             or a viewer's: minions admin token issue --role viewer --name NAME\n",
           (*pool)->dashboard_url().c_str(), (*pool)->dashboard_url().c_str());
  }
  printf("  Ctrl-C stops the pool\n");
  fflush(stdout);
  InstallSignalHandlers();
  while (SignalsReceived() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pool->reset();
  return 0;
}

int RunLocalRun(minions::cli::LocalRunOptions local) {
  if (local.errors_path.empty()) local.errors_path = local.output_path + ".errors.jsonl";
  auto summary = minions::cli::RunLocally(local);
  if (!summary.ok()) {
    fprintf(stderr, "error: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  printf("%zu records (%zu errors) in %.2f s: %.1f records/s, %.1f generated tokens/s\n", summary->records,
         summary->errors, summary->seconds, summary->records / std::max(summary->seconds, 1e-9),
         summary->completion_tokens / std::max(summary->seconds, 1e-9));
  // Where the files went, as paths that work from anywhere.
  std::error_code ec;
  printf("output    %s\nerrors    %s\n", std::filesystem::absolute(local.output_path, ec).lexically_normal().c_str(),
         std::filesystem::absolute(local.errors_path, ec).lexically_normal().c_str());
  return 0;
}

}  // namespace minions::apps
