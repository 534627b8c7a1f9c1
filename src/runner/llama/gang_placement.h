#pragma once
// Gang placement: how a gang's leader spreads a model's layers over its own accelerators and its
// members' rpc-servers (llama.cpp's RPC backend), in proportion to the memory each offers.
//
// Threads: the runner's one serving thread (it registers RPC servers with llama.cpp).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "ggml-backend.h"
#include "runner/protocol.h"

namespace minions::llama_runner {

// How a gang shares a model: the devices llama.cpp offloads to (the leader's accelerators, then
// each member's rpc-server devices), the share of the offloaded layers each gets, and how many
// layers are offloaded (a leader without an accelerator keeps its share of the first layers on
// its CPU).
struct GangPlacement {
  std::vector<ggml_backend_dev_t> devices;  // null-terminated, as llama_model_params wants
  std::vector<float> split;                 // llama_max_devices() entries
  int n_gpu_layers = 0;
  Json info;
};

// Checks that every member answers (llama.cpp's RPC client aborts the process on one that does
// not), registers the members with the RPC backend and places the layers.
absl::StatusOr<GangPlacement> PlaceGang(const std::string& model_path, const runner_protocol::Gang& gang,
                                        int n_gpu_layers_option);

}  // namespace minions::llama_runner
