#include "runner/protocol.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"

namespace minions::runner_protocol {
namespace {

std::string Line(const Json& json) { return DumpJson(json) + "\n"; }

absl::Status ReadInt(const Json& json, const char* name, int min, int max, int* out) {
  auto it = json.find(name);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("load option ", name, " must be an integer in [", min, ", ", max, "]"));
  }
  *out = it->get<int>();
  return absl::OkStatus();
}

absl::StatusOr<Gang> GangFromJson(const Json& json) {
  Gang gang;
  if (json.is_null()) return gang;
  if (!json.is_object()) return absl::InvalidArgumentError("load's \"gang\" must be an object");
  if (auto it = json.find("leader_bytes"); it != json.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return absl::InvalidArgumentError("gang leader_bytes must be a non-negative integer");
    }
    gang.leader_bytes = it->get<int64_t>();
  }
  auto servers = json.find("servers");
  if (servers == json.end() || !servers->is_array()) {
    return absl::InvalidArgumentError("gang needs \"servers\": an array of {endpoint, bytes}");
  }
  if (servers->empty() || servers->size() > kMaxRpcServers) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gang has 1 to ", kMaxRpcServers, " rpc servers besides its leader, not ", servers->size()));
  }
  for (const Json& entry : *servers) {
    if (!entry.is_object()) return absl::InvalidArgumentError("each gang server must be an object");
    RpcServer server;
    server.endpoint = JsonString(entry, "endpoint");
    RETURN_IF_ERROR(ValidateRpcEndpoint(server.endpoint));
    if (auto it = entry.find("bytes"); it != entry.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0) {
        return absl::InvalidArgumentError("gang server bytes must be a non-negative integer");
      }
      server.bytes = it->get<int64_t>();
    }
    for (const RpcServer& seen : gang.servers) {
      if (seen.endpoint == server.endpoint) {
        return absl::InvalidArgumentError(absl::StrCat("gang server ", server.endpoint, " is named twice"));
      }
    }
    gang.servers.push_back(std::move(server));
  }
  return gang;
}

}  // namespace

absl::Status ValidateRpcEndpoint(std::string_view endpoint) {
  std::string host;
  int port = 0;
  const std::string text(endpoint.substr(0, 256));
  bool ok = endpoint.size() <= 255 && !endpoint.empty() && endpoint.front() != ':' &&
            SplitHostPort(text, &host, &port).ok() && port >= 1;
  for (char c : host) {
    // A name or an address: letters, digits, '.', '-', and ':' inside IPv6 brackets.
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpc endpoint '", Excerpt(endpoint, 80), "' must be host:port with a port in [1, 65535]"));
  }
  return absl::OkStatus();
}

Json LoadOptions::ToJson() const {
  return {{"n_parallel", n_parallel}, {"n_ctx_per_seq", n_ctx_per_seq},
          {"n_batch", n_batch},       {"n_threads", n_threads},
          {"n_gpu_layers", n_gpu_layers}, {"default_max_tokens", default_max_tokens},
          {"flash_attn", flash_attn}, {"share_prefixes", share_prefixes}};
}

absl::StatusOr<LoadOptions> LoadOptions::FromJson(const Json& json) {
  LoadOptions options;
  if (json.is_null()) return options;
  if (!json.is_object()) return absl::InvalidArgumentError("load options must be an object");
  absl::Status s;
  if (!(s = ReadInt(json, "n_parallel", 1, kMaxParallel, &options.n_parallel)).ok()) return s;
  if (!(s = ReadInt(json, "n_ctx_per_seq", 0, kMaxCtxPerSeq, &options.n_ctx_per_seq)).ok()) return s;
  if (!(s = ReadInt(json, "n_batch", 1, kMaxBatch, &options.n_batch)).ok()) return s;
  if (!(s = ReadInt(json, "n_threads", 0, 1024, &options.n_threads)).ok()) return s;
  if (!(s = ReadInt(json, "n_gpu_layers", -1, 100000, &options.n_gpu_layers)).ok()) return s;
  if (!(s = ReadInt(json, "default_max_tokens", 1, kMaxDefaultMaxTokens, &options.default_max_tokens)).ok()) {
    return s;
  }
  const int64_t total = int64_t{options.n_parallel} * (options.n_ctx_per_seq == 0 ? 4096 : options.n_ctx_per_seq);
  if (total > kMaxTotalContext) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load options n_parallel x n_ctx_per_seq is ", total, " tokens of context; at most ", kMaxTotalContext,
        " (an n_ctx_per_seq of 0 counts as 4096)"));
  }
  if (auto it = json.find("flash_attn"); it != json.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "auto" && *it != "on" && *it != "off")) {
      return absl::InvalidArgumentError("load option flash_attn must be \"auto\", \"on\" or \"off\"");
    }
    options.flash_attn = it->get<std::string>();
  }
  if (auto it = json.find("share_prefixes"); it != json.end() && !it->is_null()) {
    if (!it->is_boolean()) return absl::InvalidArgumentError("load option share_prefixes must be true or false");
    options.share_prefixes = it->get<bool>();
  }
  return options;
}

std::string EncodeLoad(const LoadRequest& request) {
  Json json = {{"op", "load"}, {"model", request.model}, {"options", request.options.ToJson()}};
  if (!request.gang.servers.empty()) {
    Json servers = Json::array();
    for (const RpcServer& server : request.gang.servers) {
      servers.push_back({{"endpoint", server.endpoint}, {"bytes", server.bytes}});
    }
    json["gang"] = {{"leader_bytes", request.gang.leader_bytes}, {"servers", std::move(servers)}};
  }
  return Line(json);
}

std::string EncodeRun(const RunRequest& request) {
  return Line({{"op", "run"}, {"batch", request.batch}, {"records", request.records}});
}

std::string EncodeCancel(const std::string& batch) { return Line({{"op", "cancel"}, {"batch", batch}}); }
std::string EncodePing(const std::string& id) { return Line({{"op", "ping"}, {"id", id}}); }
std::string EncodeShutdown() { return Line({{"op", "shutdown"}}); }

absl::StatusOr<Command> DecodeCommand(std::string_view line) {
  auto parsed = ParseJson(line);
  if (!parsed.ok()) return parsed.status();
  const Json& json = *parsed;
  if (!json.is_object() || !json.contains("op") || !json["op"].is_string()) {
    return absl::InvalidArgumentError("a command must be a JSON object with a string \"op\"");
  }
  std::string op = json["op"].get<std::string>();
  Command command;
  if (op == "load") {
    command.op = Command::Op::kLoad;
    if (!json.contains("model") || !json["model"].is_string() ||
        json["model"].get<std::string>().empty()) {
      return absl::InvalidArgumentError("load needs \"model\": the path of a GGUF file");
    }
    command.load.model = json["model"].get<std::string>();
    auto options = LoadOptions::FromJson(JsonField(json, "options"));
    if (!options.ok()) return options.status();
    command.load.options = *options;
    ASSIGN_OR_RETURN(command.load.gang, GangFromJson(JsonField(json, "gang")));
  } else if (op == "run") {
    command.op = Command::Op::kRun;
    if (!json.contains("batch") || !json["batch"].is_string()) {
      return absl::InvalidArgumentError("run needs a string \"batch\" id");
    }
    command.run.batch = json["batch"].get<std::string>();
    if (!json.contains("records") || !json["records"].is_array()) {
      return absl::InvalidArgumentError("run needs \"records\": an array of input lines");
    }
    for (const auto& record : json["records"]) {
      // A record given as an object instead of a string is accepted and re-serialised.
      command.run.records.push_back(record.is_string() ? record.get<std::string>() : DumpJson(record));
    }
  } else if (op == "rescore") {
    command.op = Command::Op::kRescore;
    ASSIGN_OR_RETURN(command.rescore, rescore::RequestFromJson(json));
  } else if (op == "cancel") {
    command.op = Command::Op::kCancel;
    command.id = JsonString(json, "batch");
  } else if (op == "ping") {
    command.op = Command::Op::kPing;
    command.id = json.contains("id") && json["id"].is_string() ? json["id"].get<std::string>() : "";
  } else if (op == "shutdown") {
    command.op = Command::Op::kShutdown;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown op '", Excerpt(op, 40), "'; expected load, run, rescore, cancel, ping or shutdown"));
  }
  return command;
}

absl::StatusOr<Event> DecodeEvent(std::string_view line) {
  auto parsed = ParseJson(line);
  if (!parsed.ok()) return parsed.status();
  Json& json = *parsed;
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("runner sent a line without a \"type\": ", Excerpt(line)));
  }
  std::string type = json["type"].get<std::string>();
  Event event;
  if (type == "ready") {
    event.type = Event::Type::kReady;
  } else if (type == "loaded") {
    event.type = Event::Type::kLoaded;
  } else if (type == "result") {
    event.type = Event::Type::kResult;
    if (!json.contains("output") || !json["output"].is_object() || !json.contains("index") ||
        !json["index"].is_number_unsigned()) {
      return absl::InvalidArgumentError("result needs \"index\" and an \"output\" object");
    }
    event.index = json["index"].get<size_t>();
  } else if (type == "verdict") {
    event.type = Event::Type::kVerdict;
    if (!json.contains("index") || !json["index"].is_number_unsigned() ||
        !(JsonField(json, "verdict").is_object() || JsonField(json, "error").is_string())) {
      return absl::InvalidArgumentError("verdict needs \"index\" and a \"verdict\" object or an \"error\"");
    }
    event.index = json["index"].get<size_t>();
  } else if (type == "batch_done") {
    event.type = Event::Type::kBatchDone;
  } else if (type == "error") {
    event.type = Event::Type::kError;
    event.message = JsonString(json, "message", "unspecified runner error");
  } else if (type == "pong") {
    event.type = Event::Type::kPong;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown runner message type '", type, "'"));
  }
  if (json.contains("batch") && json["batch"].is_string()) event.batch = json["batch"].get<std::string>();
  event.body = std::move(json);
  return event;
}

std::string EncodeReady(const std::string& runner_name, const std::string& version) {
  return Line({{"type", "ready"},
               {"protocol", kProtocolVersion},
               {"runner", runner_name},
               {"version", version},
               {"endpoints", {"/v1/completions", "/v1/chat/completions", "/v1/embeddings"}}});
}

std::string EncodeLoaded(const std::string& model, const Json& info) {
  return Line({{"type", "loaded"}, {"model", model}, {"info", info}});
}

std::string EncodeResult(const std::string& batch, size_t index, const Json& output) {
  return Line({{"type", "result"}, {"batch", batch}, {"index", index}, {"output", output}});
}

std::string EncodeBatchDone(const std::string& batch, const BatchStats& stats) {
  return Line({{"type", "batch_done"},
               {"batch", batch},
               {"records", stats.records},
               {"errors", stats.errors},
               {"cancelled", stats.cancelled},
               {"usage", {{"prompt_tokens", stats.prompt_tokens},
                          {"completion_tokens", stats.completion_tokens},
                          {"cached_prompt_tokens", stats.cached_prompt_tokens}}},
               {"seconds", stats.seconds}});
}

std::string EncodeError(const std::string& op, const std::string& batch, const std::string& message) {
  Json json = {{"type", "error"}, {"op", op}, {"message", message}};
  if (!batch.empty()) json["batch"] = batch;
  return Line(json);
}

std::string EncodePong(const std::string& id) { return Line({{"type", "pong"}, {"id", id}}); }

}  // namespace minions::runner_protocol
