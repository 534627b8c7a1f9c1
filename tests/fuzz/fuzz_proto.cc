// What callers send as bytes: protobuf messages from executors and clients (their conversion into
// the domain), runner protocol lines, and the JSON the stores keep. The first byte picks which.
// Never a crash, whatever the bytes.
#include <cstdint>
#include <string>

#include "minions/v1/minions.pb.h"
#include "model/json_codec.h"
#include "runner/protocol.h"
#include "server/proto_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace minions;
  if (size == 0) return 0;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const int n = static_cast<int>(size - 1);
  std::string text(bytes, static_cast<size_t>(n));
  switch (data[0] % 8) {
    case 0: {
      v1::RegisterRequest request;
      if (!request.ParseFromArray(bytes, n)) break;
      Executor executor;
      executor.info = FromProto(request.capabilities());
      (void)ToProto(executor).SerializeAsString();
      break;
    }
    case 1: {
      v1::SubmitJobRequest request;
      if (!request.ParseFromArray(bytes, n)) break;
      if (auto options = ParseJson(request.runner_options_json()); options.ok()) {
        (void)runner_protocol::LoadOptions::FromJson(*options);
      }
      break;
    }
    case 2: {
      v1::HeartbeatRequest request;
      if (!request.ParseFromArray(bytes, n)) break;
      for (const auto& ref : request.leases()) (void)ref.chunks_size();
      break;
    }
    case 3:
      (void)runner_protocol::DecodeCommand(text);
      break;
    case 4:
      (void)runner_protocol::DecodeEvent(text);
      break;
    case 5:
      if (auto json = ParseJson(text); json.ok()) (void)JobSpecFromJson(*json);
      break;
    case 6:
      if (auto json = ParseJson(text); json.ok()) {
        auto chunks = ChunksFromJson(*json);
        if (chunks.ok()) (void)ChunksToJson(*chunks).dump();
      }
      break;
    case 7: {
      Task task;
      task.job_id = text.substr(0, 16);
      task.n_records = n;
      (void)ToProto(task).SerializeAsString();
      break;
    }
  }
  return 0;
}
