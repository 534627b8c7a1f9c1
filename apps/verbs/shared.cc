#include "verbs/shared.h"

#include <signal.h>

#include <atomic>

namespace minions::apps {
namespace {

std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }

}  // namespace

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int SignalsReceived() { return g_signals.load(); }

void AddLoadOptions(CLI::App* cmd, minions::runner_protocol::LoadOptions* load) {
  cmd->add_option("--parallel", load->n_parallel, "sequences decoded together")->capture_default_str();
  cmd->add_option("--ctx-per-seq", load->n_ctx_per_seq, "context tokens per sequence (0: model's, at most 4096)");
  cmd->add_option("--threads", load->n_threads, "CPU threads (0: all cores)");
  cmd->add_option("--gpu-layers", load->n_gpu_layers, "layers offloaded to the GPU (-1: all)");
}

void AddServerAddress(CLI::App* cmd, minions::cli::Connection* connection) {
  cmd->add_option("--server", connection->server,
                  "server address (default: MINIONS_SERVER, else [executor] server of the config file, else "
                  "127.0.0.1:7070); an executor takes several, A,B,...: the next when one is gone");
  cmd->add_option("--ca", connection->tls.ca_file, "the pool's CA certificate: talk TLS (or MINIONS_CA)");
  cmd->add_option("--tls-server-name", connection->tls.server_name,
                  "the name the server's certificate carries, when it is not the address dialled");
}

void AddConnection(CLI::App* cmd, minions::cli::Connection* connection, std::string* config_path) {
  AddServerAddress(cmd, connection);
  cmd->add_option("--token-file", connection->token_file, "file holding your token, mode 0600 (or MINIONS_TOKEN_FILE)");
  cmd->add_option("--token", connection->token, "your token (or MINIONS_TOKEN; a file is safer)");
  if (config_path != nullptr) {
    cmd->add_option("--config", *config_path, "TOML config file (or MINIONS_CONFIG) for [executor] server");
  }
}

// What a bare `minions` prints: the verbs, grouped for a person who has not used it before. Each
// verb's line is its own description (so it cannot drift); verbs not named in a group are listed

}  // namespace minions::apps
