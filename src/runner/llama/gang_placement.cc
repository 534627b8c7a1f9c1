#include "runner/llama/gang_placement.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "gguf.h"
#include "llama.h"
#include "runner/llama/devices.h"

namespace minions::llama_runner {
namespace {

// Connects to host:port and hangs up, within `timeout`: llama.cpp's RPC client aborts the process
// when a server cannot be reached, so the runner asks first and answers with an error instead.
absl::Status CheckReachable(const std::string& endpoint, std::chrono::milliseconds timeout) {
  std::string host;
  int port = 0;
  if (auto status = SplitHostPort(endpoint, &host, &port); !status.ok()) return status;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("gang member ", endpoint, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = poll(&p, 1, static_cast<int>(timeout.count())) == 1 ? 0 : -1;
      int error = rc == 0 ? 0 : ETIMEDOUT;
      socklen_t len = sizeof(error);
      if (rc == 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      errno = error;
      rc = error == 0 ? 0 : -1;
    }
    if (rc == 0) {
      close(fd);
      return absl::OkStatus();
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  return absl::UnavailableError(absl::StrCat("gang member ", endpoint, " is unreachable: ", last_error));
}

// The model's number of layers, from its GGUF metadata (<architecture>.block_count).
absl::StatusOr<int> BlockCount(const std::string& model_path) {
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  std::unique_ptr<gguf_context, decltype(&gguf_free)> gguf(gguf_init_from_file(model_path.c_str(), params), &gguf_free);
  if (!gguf) return absl::InvalidArgumentError(absl::StrCat("cannot read the metadata of '", model_path, "'"));
  int64_t arch = gguf_find_key(gguf.get(), "general.architecture");
  if (arch < 0 || gguf_get_kv_type(gguf.get(), arch) != GGUF_TYPE_STRING) {
    return absl::InvalidArgumentError(absl::StrCat("'", model_path, "' names no architecture"));
  }
  const std::string key = absl::StrCat(gguf_get_val_str(gguf.get(), arch), ".block_count");
  int64_t id = gguf_find_key(gguf.get(), key.c_str());
  if (id < 0 || gguf_get_kv_type(gguf.get(), id) != GGUF_TYPE_UINT32 || gguf_get_val_u32(gguf.get(), id) == 0 ||
      gguf_get_val_u32(gguf.get(), id) > 100000) {
    return absl::InvalidArgumentError(absl::StrCat("'", model_path, "' has no usable ", key));
  }
  return static_cast<int>(gguf_get_val_u32(gguf.get(), id));
}

}  // namespace

absl::StatusOr<GangPlacement> PlaceGang(const std::string& model_path, const runner_protocol::Gang& gang,
                                        int n_gpu_layers_option) {
  for (const auto& server : gang.servers) {
    if (auto status = CheckReachable(server.endpoint, std::chrono::seconds(10)); !status.ok()) return status;
  }
  ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
  auto add_server = rpc == nullptr ? nullptr
                                   : reinterpret_cast<ggml_backend_reg_t (*)(const char*)>(
                                         ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server"));
  if (add_server == nullptr) {
    return absl::FailedPreconditionError(
        "this runner's llama.cpp has no RPC backend (build it with GGML_RPC=ON, as scripts/setup does); it cannot "
        "lead a gang");
  }
  auto free_bytes = [](ggml_backend_dev_t dev) {
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    return static_cast<double>(free);
  };
  GangPlacement placement;
  std::vector<double> weights;
  // The leader's own accelerators (Metal, CUDA), if any, come first.
  // (Not the RPC devices of a gang this runner loaded before: those stay registered.)
  const std::vector<ggml_backend_dev_t> local = LocalAccelerators();
  double leader_free = 0;
  for (ggml_backend_dev_t dev : local) leader_free += free_bytes(dev);
  if (local.empty()) {
    if (ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) leader_free = free_bytes(cpu);
  }
  const double leader = gang.leader_bytes > 0 ? static_cast<double>(gang.leader_bytes) : leader_free;
  for (ggml_backend_dev_t dev : local) {
    placement.devices.push_back(dev);
    weights.push_back(leader_free > 0 ? leader * free_bytes(dev) / leader_free : leader / local.size());
  }
  double remote = 0;
  Json servers = Json::array();
  for (const auto& server : gang.servers) {
    ggml_backend_reg_t reg = add_server(server.endpoint.c_str());
    if (reg == nullptr || ggml_backend_reg_dev_count(reg) == 0) {
      return absl::UnavailableError(absl::StrCat("gang member ", server.endpoint, " offers no device"));
    }
    std::vector<ggml_backend_dev_t> devs;
    double server_free = 0;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
      devs.push_back(ggml_backend_reg_dev_get(reg, i));
      server_free += free_bytes(devs.back());
    }
    const double offered = server.bytes > 0 ? static_cast<double>(server.bytes) : server_free;
    for (ggml_backend_dev_t dev : devs) {
      placement.devices.push_back(dev);
      weights.push_back(server_free > 0 ? offered * free_bytes(dev) / server_free : offered / devs.size());
    }
    remote += offered;
    servers.push_back({{"endpoint", server.endpoint}, {"devices", devs.size()}, {"bytes", offered}});
  }
  if (placement.devices.size() > llama_max_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("a gang of ", placement.devices.size(),
                                                   " devices is more than llama.cpp takes (", llama_max_devices(), ")"));
  }
  if (remote <= 0) return absl::FailedPreconditionError("the gang's members offer no memory");

  placement.n_gpu_layers = n_gpu_layers_option < 0 ? 999 : n_gpu_layers_option;
  int leader_layers = 0;
  if (local.empty()) {
    // Layers are offloaded from the last one down, and the output layer counts as one more: the
    // leader keeps its share of the first layers on its CPU.
    ASSIGN_OR_RETURN(const int n_layer, BlockCount(model_path));
    const int slots = n_layer + 1;
    leader_layers = static_cast<int>(std::lround(slots * leader / (leader + remote)));
    leader_layers = std::clamp(leader_layers, 0, slots - 1);  // the members get at least one
    placement.n_gpu_layers = slots - leader_layers;
  } else if (std::any_of(local.begin(), local.end(), [](ggml_backend_dev_t dev) {
               ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
               return reg != nullptr && std::strcmp(ggml_backend_reg_name(reg), "Vulkan") == 0;
             })) {
    // A Vulkan leader keeps the output layer on its CPU. With every layer offloaded over several
    // devices llama.cpp pipelines the batches (its scheduler's copies), and on the Vulkan backend
    // of this release that gave other greedy text than the same model on one device, even with
    // no layer on the members (measured on lavapipe; tests/gang, the mixed gang). With the
    // output layer on the CPU llama.cpp does not pipeline, and the text is the device's.
    ASSIGN_OR_RETURN(const int n_layer, BlockCount(model_path));
    placement.n_gpu_layers = std::min(placement.n_gpu_layers, n_layer);
  }
  placement.split.assign(llama_max_devices(), 0.0f);
  for (size_t i = 0; i < weights.size(); ++i) placement.split[i] = static_cast<float>(std::max(weights[i], 1.0));
  placement.devices.push_back(nullptr);
  placement.info = {{"servers", servers}, {"leader_bytes", leader}, {"leader_cpu_layers", leader_layers},
                    {"offloaded_layers", placement.n_gpu_layers}};
  return placement;
}

}  // namespace minions::llama_runner
