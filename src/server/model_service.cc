#include "server/model_service.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "model/gguf_header.h"
#include "model/model_ref.h"
#include "server/authorize_or_return.h"
#include "server/call_auth.h"
#include "server/keys.h"
#include "server/model_registry.h"
#include "server/proto_convert.h"

namespace minions {
namespace {

// The most header bytes read looking for the end of a GGUF header (a tokenizer's vocabulary is a
// few MB; nothing real comes near this).
constexpr int64_t kMaxHeaderBytes = int64_t{256} << 20;

}  // namespace

absl::StatusOr<std::string> ModelService::TeamOf(const Caller& caller, const std::string& requested,
                                                 bool all_allowed) {
  if (caller.IsAdmin()) {
    if (requested.empty()) return all_allowed ? std::string() : std::string(kDefaultTeam);
    return requested;
  }
  if (!requested.empty() && requested != caller.team) {
    return absl::PermissionDeniedError(
        absl::StrCat("your token belongs to team ", caller.team, "; it cannot use team ", requested, "'s models"));
  }
  if (caller.team.empty()) return absl::PermissionDeniedError("this credential belongs to no team");
  return caller.team;
}

int64_t ModelService::PartBytes() const {
  return std::max<int64_t>(1 << 20, std::min(options_.model_part_bytes, options_.max_message_bytes - (64 << 10)));
}

int ModelService::PartCount(int64_t size) const { return static_cast<int>((size + PartBytes() - 1) / PartBytes()); }

absl::Status ModelService::CheckPush(const std::string& digest, int64_t size) const {
  RETURN_IF_ERROR(ValidateModelDigest(digest));
  if (size <= 0) return absl::InvalidArgumentError("a model has a size (its file's bytes)");
  if (size > options_.max_model_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model is ", size, " bytes; this server stores models of ", options_.max_model_bytes, " at most"));
  }
  return absl::OkStatus();
}

absl::Status ModelService::CheckModelRoom(const std::string& team, const std::string& digest, int64_t size) {
  ASSIGN_OR_RETURN(Team limits, store_->GetTeam(team));
  if (limits.max_model_bytes <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<ModelRecord> models, store_->ListModels(team));
  for (const ModelRecord& model : models) {
    if (model.digest == digest) return absl::OkStatus();  // kept already: a new name costs nothing
  }
  const int64_t used = ModelBytesByTeam(models)[team];
  if (size <= limits.max_model_bytes - used) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "team ", team, " keeps ", used, " bytes of models; this one (", size, " bytes) would pass its limit of ",
      limits.max_model_bytes, " (an admin raises it with `minions admin team set ", team,
      " --max-model-bytes N`); remove models it no longer needs (`minions models rm NAME`)"));
}

absl::StatusOr<ModelFacts> ModelService::ReadFacts(const std::string& key, int64_t size) {
  int64_t want = std::min<int64_t>(size, 16 << 20);
  while (true) {
    ASSIGN_OR_RETURN(std::string head, blobs_->GetRange(key, 0, want));
    absl::StatusOr<ModelFacts> facts = ReadGgufFacts(head, size);
    if (!absl::IsOutOfRange(facts.status())) return facts;
    if (want >= size || want >= kMaxHeaderBytes) {
      return absl::InvalidArgumentError("not a GGUF model: its header does not end inside the file");
    }
    want = std::min({size, kMaxHeaderBytes, want * 4});
  }
}

absl::StatusOr<v1::StartModelPushResponse> ModelService::StartPush(const Caller& caller,
                                                                   const v1::StartModelPushRequest& request) {
  ASSIGN_OR_RETURN(std::string team, TeamOf(caller, request.team()));
  RETURN_IF_ERROR(ValidateModelName(request.name()));
  RETURN_IF_ERROR(CheckPush(request.digest(), request.size_bytes()));
  const std::string hex(DigestHex(request.digest()));
  v1::StartModelPushResponse reply;
  reply.set_part_size(PartBytes());

  // The team has these bytes (under any name): record the name, nothing to send.
  const std::string blob = keys::ModelBlob(team, hex);
  absl::StatusOr<int64_t> stored = blobs_->Size(blob);
  if (stored.ok() && *stored == request.size_bytes()) {
    ModelRecord model;
    absl::StatusOr<ModelRecord> known = store_->GetModel(team, "", request.digest());
    if (known.ok()) {
      model = *known;
    } else {
      RETURN_IF_ERROR(CheckModelRoom(team, request.digest(), *stored));
      ASSIGN_OR_RETURN(model.facts, ReadFacts(blob, *stored));
    }
    model.team = team;
    model.name = request.name();
    model.digest = request.digest();
    model.size_bytes = *stored;
    model.blob_key = blob;
    model.created_by = caller.principal;
    model.created_at = clock_->Now();
    ASSIGN_OR_RETURN(ModelRecord added, store_->AddModel(model));
    reply.set_done(true);
    *reply.mutable_model() = ToProto(added);
    MINIONS_LOG(Info) << "model " << team << "/" << added.name << "@" << added.digest << " pushed again by "
                      << caller.Describe() << ": the bytes were there";
    return reply;
  }

  // Over the team's limit: refused before a byte is sent.
  RETURN_IF_ERROR(CheckModelRoom(team, request.digest(), request.size_bytes()));
  RETURN_IF_ERROR(AdmitPush(team, hex, request.size_bytes()));
  // Parts already received (a push that stopped): listed so the client sends only the rest.
  const std::string prefix = keys::ModelUploadPrefix(team, hex, request.size_bytes());
  ASSIGN_OR_RETURN(std::vector<std::string> parts, blobs_->List(prefix));
  const int n_parts = PartCount(request.size_bytes());
  for (const std::string& key : parts) {
    const std::string name = key.substr(std::min(key.size(), prefix.size()));
    int part = 0;
    if (name.rfind("part-", 0) != 0 || !absl::SimpleAtoi(absl::string_view(name).substr(5), &part) || part < 1 ||
        part > n_parts) {
      continue;
    }
    const int64_t expected = std::min(PartBytes(), request.size_bytes() - (part - 1) * PartBytes());
    absl::StatusOr<int64_t> size = blobs_->Size(key);
    if (size.ok() && *size == expected) reply.add_parts_present(part);
  }
  std::sort(reply.mutable_parts_present()->begin(), reply.mutable_parts_present()->end());
  return reply;
}

absl::Status ModelService::UploadPart(const Caller& caller, const v1::UploadModelPartRequest& request) {
  ASSIGN_OR_RETURN(std::string team, TeamOf(caller, request.team()));
  RETURN_IF_ERROR(CheckPush(request.digest(), request.size_bytes()));
  const int n_parts = PartCount(request.size_bytes());
  const int part = request.part_number();
  if (part < 1 || part > n_parts) {
    return absl::InvalidArgumentError(absl::StrCat("part ", part, " is out of range: this push has parts 1 to ", n_parts));
  }
  const int64_t expected = std::min(PartBytes(), request.size_bytes() - (part - 1) * PartBytes());
  if (static_cast<int64_t>(request.data().size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("part ", part, " has ", request.data().size(), " bytes; it must have ", expected));
  }
  const std::string hex(DigestHex(request.digest()));
  RETURN_IF_ERROR(CheckModelRoom(team, request.digest(), request.size_bytes()));  // parts sent without a start
  RETURN_IF_ERROR(AdmitPush(team, hex, request.size_bytes()));
  return blobs_->Put(keys::ModelUploadPart(team, hex, request.size_bytes(), part), request.data());
}

absl::Status ModelService::AdmitPush(const std::string& team, const std::string& hex, int64_t size) {
  const absl::Time now = clock_->Now();
  const std::string marker = keys::ModelUploadMarker(team, hex, size);
  const std::string touched = absl::StrCat(absl::ToUnixMicros(now));
  if (blobs_->Size(marker).ok()) return blobs_->Put(marker, touched);  // under way: touched
  // A new push: the team's others, by folder; stale ones go.
  const std::string uploads = keys::ModelUploadsOf(team);
  const std::string mine = keys::ModelUploadPrefix(team, hex, size);
  ASSIGN_OR_RETURN(std::vector<std::string> keys, blobs_->List(uploads));
  std::map<std::string, std::vector<std::string>> pushes;  // folder -> its objects
  for (const std::string& key : keys) {
    const size_t slash = key.find('/', uploads.size());
    if (slash == std::string::npos) continue;
    pushes[key.substr(0, slash + 1)].push_back(key);
  }
  int others = 0;
  for (const auto& [folder, objects] : pushes) {
    if (folder == mine) continue;
    const std::string folder_marker = folder + "touched";
    int64_t micros = 0;
    absl::StatusOr<std::string> last = blobs_->Get(folder_marker);
    if (!last.ok() || !absl::SimpleAtoi(*last, &micros)) {
      // Parts without a marker (a push from before markers, or one half removed): their age is
      // counted from now.
      RETURN_IF_ERROR(blobs_->Put(folder_marker, touched));
      micros = absl::ToUnixMicros(now);
    }
    if (absl::FromUnixMicros(micros) + options_.unfinished_model_push_ttl <= now) {
      for (const std::string& key : objects) (void)blobs_->Delete(key);
      (void)blobs_->Delete(folder_marker);
      MINIONS_LOG(Info) << "unfinished model push " << folder << " removed: untouched since "
                        << absl::FormatTime(absl::FromUnixMicros(micros));
      continue;
    }
    ++others;
  }
  if (others >= options_.max_unfinished_model_pushes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "team ", team, " has ", others, " unfinished model pushes (at most ", options_.max_unfinished_model_pushes,
        " at once): finish them (push the same files again; they resume) or let them expire (",
        absl::FormatDuration(options_.unfinished_model_push_ttl), " after their last part)"));
  }
  return blobs_->Put(marker, touched);
}

absl::StatusOr<ModelRecord> ModelService::FinishPush(const Caller& caller, const v1::FinishModelPushRequest& request) {
  ASSIGN_OR_RETURN(std::string team, TeamOf(caller, request.team()));
  RETURN_IF_ERROR(ValidateModelName(request.name()));
  RETURN_IF_ERROR(CheckPush(request.digest(), request.size_bytes()));
  const std::string hex(DigestHex(request.digest()));
  const int64_t size = request.size_bytes();
  const std::string blob = keys::ModelBlob(team, hex);
  const int n_parts = PartCount(size);
  std::vector<std::string> parts;
  for (int part = 1; part <= n_parts; ++part) parts.push_back(keys::ModelUploadPart(team, hex, size, part));

  // Checked again before the bytes are joined: other pushes of the team may have finished since
  // it started. A refused push keeps nothing.
  if (absl::Status room = CheckModelRoom(team, request.digest(), size); !room.ok()) {
    if (absl::IsResourceExhausted(room)) {
      for (const std::string& key : parts) (void)blobs_->Delete(key);
      (void)blobs_->Delete(keys::ModelUploadMarker(team, hex, size));
    }
    return room;
  }
  absl::StatusOr<int64_t> stored = blobs_->Size(blob);
  if (!stored.ok() || *stored != size) {
    for (int part = 1; part <= n_parts; ++part) {
      const int64_t expected = std::min(PartBytes(), size - (part - 1) * PartBytes());
      absl::StatusOr<int64_t> got = blobs_->Size(parts[part - 1]);
      if (!got.ok() || *got != expected) {
        return absl::FailedPreconditionError(
            absl::StrCat("part ", part, " of ", n_parts, " has not been received; send it, then finish again"));
      }
    }
    // The digest first, over the parts: bytes that are not what the pusher named are never stored.
    Sha256 hash;
    for (const std::string& key : parts) {
      RETURN_IF_ERROR(blobs_->Read(key, [&](std::string_view chunk) {
        hash.Update(chunk);
        return true;
      }));
    }
    const std::string actual = absl::StrCat("sha256:", hash.HexDigest());
    if (actual != request.digest()) {
      for (const std::string& key : parts) (void)blobs_->Delete(key);
      (void)blobs_->Delete(keys::ModelUploadMarker(team, hex, size));
      return absl::InvalidArgumentError(absl::StrCat("the bytes received hash to ", actual, ", not ", request.digest(),
                                                     "; nothing was stored (push again)"));
    }
    // The header next, from the first parts: only a GGUF model is stored.
    std::string head;
    for (int part = 0; part < n_parts; ++part) {
      ASSIGN_OR_RETURN(std::string bytes, blobs_->Get(parts[part]));
      head += bytes;
      absl::StatusOr<ModelFacts> facts = ReadGgufFacts(head, size);
      if (facts.ok()) break;
      if (!absl::IsOutOfRange(facts.status()) || static_cast<int64_t>(head.size()) >= kMaxHeaderBytes ||
          part == n_parts - 1) {
        for (const std::string& key : parts) (void)blobs_->Delete(key);
        (void)blobs_->Delete(keys::ModelUploadMarker(team, hex, size));
        return absl::InvalidArgumentError(absl::StrCat("not a GGUF model: ", facts.status().message()));
      }
    }
    size_t next = 0;
    RETURN_IF_ERROR(blobs_->PutStream(blob, [&]() -> absl::StatusOr<std::string> {
      if (next == parts.size()) return std::string();
      return blobs_->Get(parts[next++]);
    }));
    for (const std::string& key : parts) (void)blobs_->Delete(key);
  }
  (void)blobs_->Delete(keys::ModelUploadMarker(team, hex, size));  // no longer in progress
  ModelRecord model;
  ASSIGN_OR_RETURN(model.facts, ReadFacts(blob, size));
  model.team = team;
  model.name = request.name();
  model.digest = request.digest();
  model.size_bytes = size;
  model.blob_key = blob;
  model.created_by = caller.principal;
  model.created_at = clock_->Now();
  ASSIGN_OR_RETURN(ModelRecord added, store_->AddModel(model));
  MINIONS_LOG(Info) << "model " << team << "/" << added.name << "@" << added.digest << " (" << size
                    << " bytes) pushed by " << caller.Describe();
  return added;
}

absl::StatusOr<std::vector<ModelRecord>> ModelService::List(const Caller& caller, const std::string& team) {
  ASSIGN_OR_RETURN(std::string which, TeamOf(caller, team, /*all_allowed=*/true));
  return store_->ListModels(which);
}

absl::StatusOr<ModelRecord> ModelService::Get(const Caller& caller, const std::string& team, const std::string& model) {
  ASSIGN_OR_RETURN(std::string which, TeamOf(caller, team));
  ASSIGN_OR_RETURN(ModelRef ref, ParseModelRef(model));
  if (ref.is_path) return absl::InvalidArgumentError(absl::StrCat("'", model, "' is a path, not a registry model"));
  return store_->GetModel(which, ref.name, ref.digest);
}

absl::StatusOr<RemovedModels> ModelService::Remove(const Caller& caller, const std::string& team,
                                                   const std::string& model) {
  ASSIGN_OR_RETURN(std::string which, TeamOf(caller, team));
  ASSIGN_OR_RETURN(ModelRef ref, ParseModelRef(model));
  if (ref.is_path) return absl::InvalidArgumentError(absl::StrCat("'", model, "' is a path, not a registry model"));
  ASSIGN_OR_RETURN(RemovedModels removed, store_->RemoveModel(which, ref.name, ref.digest));
  for (const std::string& digest : removed.orphaned_digests) {
    // Executors that cached the bytes keep them until their cache evicts them.
    if (absl::Status s = blobs_->Delete(keys::ModelBlob(which, std::string(DigestHex(digest)))); !s.ok()) {
      MINIONS_LOG(Warning) << "model bytes " << which << "/" << digest << " not deleted: " << s;
    }
  }
  MINIONS_LOG(Info) << "model " << which << "/" << model << " removed by " << caller.Describe();
  return removed;
}

grpc::Status ModelService::StartModelPush(grpc::ServerContext* context, const v1::StartModelPushRequest* request,
                                          v1::StartModelPushResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  absl::StatusOr<v1::StartModelPushResponse> answer = StartPush(caller, *request);
  if (!answer.ok()) return ToGrpc(answer.status());
  *reply = std::move(*answer);
  return grpc::Status::OK;
}

grpc::Status ModelService::UploadModelPart(grpc::ServerContext* context, const v1::UploadModelPartRequest* request,
                                           v1::UploadModelPartResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  return ToGrpc(UploadPart(caller, *request));
}

grpc::Status ModelService::FinishModelPush(grpc::ServerContext* context, const v1::FinishModelPushRequest* request,
                                           v1::Model* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  absl::StatusOr<ModelRecord> model = FinishPush(caller, *request);
  if (!model.ok()) return ToGrpc(model.status());
  *reply = ToProto(*model);
  return grpc::Status::OK;
}

grpc::Status ModelService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                                      v1::ListModelsResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  absl::StatusOr<std::vector<ModelRecord>> models = List(caller, request->team());
  if (!models.ok()) return ToGrpc(models.status());
  for (const ModelRecord& model : *models) *reply->add_models() = ToProto(model);
  return grpc::Status::OK;
}

grpc::Status ModelService::GetModel(grpc::ServerContext* context, const v1::GetModelRequest* request,
                                    v1::Model* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsRead);
  absl::StatusOr<ModelRecord> model = Get(caller, request->team(), request->model());
  if (!model.ok()) return ToGrpc(model.status());
  *reply = ToProto(*model);
  return grpc::Status::OK;
}

grpc::Status ModelService::RemoveModel(grpc::ServerContext* context, const v1::RemoveModelRequest* request,
                                       v1::RemoveModelResponse* reply) {
  AUTHORIZE_OR_RETURN(context, Scope::kJobsWrite);
  absl::StatusOr<RemovedModels> removed = Remove(caller, request->team(), request->model());
  if (!removed.ok()) return ToGrpc(removed.status());
  for (const ModelRecord& model : removed->removed) *reply->add_removed() = ToProto(model);
  return grpc::Status::OK;
}

}  // namespace minions
