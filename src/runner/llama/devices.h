#pragma once
// The devices llama.cpp can compute on in this runner (ggml_backend_dev_count/_get): what
// `minions-llama-runner --devices` prints for the executor, which reports the accelerator in its
// capabilities from it (executor/runner_devices.h). The one place the runner enumerates devices.
//
// Threads: any, after llama.cpp's backends are loaded (LoadLlamaBackends).

#include <string>
#include <vector>

#include "common/json_util.h"
#include "ggml-backend.h"

namespace minions::llama_runner {

// Registers llama.cpp's backends. A build with dynamically loaded backends (the `vulkan` variant
// links the prebuilt shared libraries of the pinned release: libggml-vulkan.so and the CPU
// variants are loaded at run time) loads them from the folder of the libggml it runs with; a
// static build has them registered already. Idempotent.
void LoadLlamaBackends();

// {"devices": [{"name": "Vulkan0", "description": "llvmpipe (LLVM 15.0.7, 256 bits)",
//   "type": "gpu", "backend": "Vulkan", "memory_total": 8589934592, "memory_free": ...}, ...]}
// type: cpu, gpu, igpu (integrated: shares the machine's memory), accel, other. RPC devices (a
// gang's other machines) are not this machine's and never listed.
Json ListDevices();

// This machine's own accelerators (Metal, CUDA...): GPU devices of every backend but RPC. An
// RPC-enabled llama.cpp registers the RPC backend, and each gang member's rpc-server once added,
// as GPU devices; they are other machines, not this one's.
std::vector<ggml_backend_dev_t> LocalAccelerators();

// Where llama.cpp put a model's weights, as it says while loading ("load_tensors: offloaded 3/3
// layers to GPU", "load_tensors: Vulkan0 model buffer size = 1.25 MiB"): the `loaded` message's
// offload facts, so a test sees the layers on the device, not a request for them. The log
// callback passes every info line to NoteLoadLine; TakeLoadFacts returns what the lines since
// the last call said ({"offloaded_layers", "layers", "model_buffers": {name: bytes}}; null if
// nothing) and forgets it.
void NoteLoadLine(const char* text);
Json TakeLoadFacts();

}  // namespace minions::llama_runner
