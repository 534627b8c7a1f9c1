#pragma once
// The runner protocol: how an executor drives a runner process over its stdin/stdout, one JSON
// object per line. Specified for people in docs/runner-protocol.md; this header is its single
// definition in code, shared by the llama.cpp runner and the executor's RunnerProcess.
//
// executor -> runner ("op"):   load, run, rescore, cancel, ping, shutdown
// runner -> executor ("type"): ready, loaded, result, verdict, batch_done, error, pong

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "runner/rescore.h"

namespace minions::runner_protocol {

inline constexpr int kProtocolVersion = 1;

// Options of `load`. Zero/negative values mean "the runner decides".
// Caps on what a job may ask a runner for: every executor is someone's machine, and the KV cache
// grows with n_parallel x n_ctx_per_seq. FromJson refuses more, so a job asking for more is refused
// at submission, and a runner refuses it again.
inline constexpr int kMaxParallel = 64;
inline constexpr int kMaxCtxPerSeq = 131072;
inline constexpr int64_t kMaxTotalContext = 262144;  // n_parallel x n_ctx_per_seq (0 counts as 4096)
inline constexpr int kMaxBatch = 8192;
inline constexpr int kMaxDefaultMaxTokens = 131072;

struct LoadOptions {
  int n_parallel = 8;         // sequences decoded together
  int n_ctx_per_seq = 0;      // context per sequence; 0: min(model's training context, 4096)
  int n_batch = 512;          // tokens per decode call
  int n_threads = 0;          // 0: all performance cores
  int n_gpu_layers = -1;      // -1: all layers on the GPU when there is one
  int default_max_tokens = 256;  // for requests without max_tokens (completions: OpenAI's 16)
  // "auto", "on" or "off". Off makes CPU attention independent of batch composition (see
  // docs/runner-protocol.md, "Determinism").
  std::string flash_attn = "auto";
  // Records whose prompts start alike reuse the KV cells of the common prefix instead of
  // computing it again (within a batch and across batches on the same runner).
  bool share_prefixes = true;
  Json ToJson() const;
  static absl::StatusOr<LoadOptions> FromJson(const Json& json);
};

// A gang (docs/architecture.md, "Gangs"): the members' rpc-servers over which the runner spreads
// the model's layers, each in proportion to the memory it offers. Set by the executor from its
// lease, never from a job's options: the runner connects to these addresses.
inline constexpr size_t kMaxRpcServers = 16;  // llama.cpp's GGML_RPC_MAX_SERVERS
struct RpcServer {
  std::string endpoint;  // host:port (an IPv6 host in brackets)
  int64_t bytes = 0;     // memory the member offers; 0: what its rpc-server reports free
  bool operator==(const RpcServer&) const = default;
};
struct Gang {
  std::vector<RpcServer> servers;  // empty: no gang, the whole model on this machine
  int64_t leader_bytes = 0;        // memory this machine offers; 0: what it has free
  bool operator==(const Gang&) const = default;
};
// Checks "host:port": a host name or address (IPv6 in brackets) and a port in [1, 65535].
absl::Status ValidateRpcEndpoint(std::string_view endpoint);

struct LoadRequest {
  std::string model;  // path of a GGUF file
  LoadOptions options;
  Gang gang;
};

struct RunRequest {
  std::string batch;                 // caller's id for this batch, echoed in every reply
  std::vector<std::string> records;  // raw input lines; the runner validates each
};

// Lines the executor sends.
std::string EncodeLoad(const LoadRequest& request);
std::string EncodeRun(const RunRequest& request);
std::string EncodeCancel(const std::string& batch);
std::string EncodePing(const std::string& id);
std::string EncodeShutdown();

// A parsed executor -> runner message.
struct Command {
  enum class Op { kLoad, kRun, kRescore, kCancel, kPing, kShutdown } op;
  LoadRequest load;  // kLoad
  RunRequest run;    // kRun
  rescore::Request rescore;  // kRescore (runner/rescore.h)
  std::string id;    // kCancel: batch; kPing: ping id
};
absl::StatusOr<Command> DecodeCommand(std::string_view line);

// A parsed runner -> executor message.
struct Event {
  enum class Type { kReady, kLoaded, kResult, kVerdict, kBatchDone, kError, kPong } type;
  std::string batch;  // kResult, kVerdict, kBatchDone (and kError when it concerns a batch)
  size_t index = 0;   // kResult, kVerdict: position of the record in its batch
  Json body;          // the whole message (kResult: body["output"] is the output line)
  std::string message;  // kError
};
absl::StatusOr<Event> DecodeEvent(std::string_view line);

// Lines the runner sends.
std::string EncodeReady(const std::string& runner_name, const std::string& version);
std::string EncodeLoaded(const std::string& model, const Json& info);
std::string EncodeResult(const std::string& batch, size_t index, const Json& output);
struct BatchStats {
  size_t records = 0;
  size_t errors = 0;
  bool cancelled = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens whose KV cells were reused, not computed
  double seconds = 0;
};
std::string EncodeBatchDone(const std::string& batch, const BatchStats& stats);
std::string EncodeError(const std::string& op, const std::string& batch, const std::string& message);
std::string EncodePong(const std::string& id);

}  // namespace minions::runner_protocol
