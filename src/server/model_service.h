#pragma once
// ModelService: the Models gRPC service — the model registry. A team's submitters push GGUF files
// (in parts, resumable: the parts wait in the object store until the push finishes), its viewers
// list and show them; removing one is refused while a job needs it. The bytes are stored once per
// team under their SHA-256 (keys::ModelBlob); the server checks the digest and reads the GGUF
// header itself before a model is recorded, trusting nothing the pusher says about them.
// Holds no state: the rows are the ModelStore's, the bytes the BlobStore's.
// Threads: called on gRPC's threads; thread-safe.

#include "blob/blob_store.h"
#include "common/clock.h"
#include "identity/authenticator.h"
#include "minions/v1/minions.grpc.pb.h"
#include "server/server_options.h"
#include "store/metadata_store.h"

namespace minions {

class ModelService final : public v1::Models::Service {
 public:
  ModelService(MetadataStore* store, BlobStore* blobs, Clock* clock, Authenticator* auth, const ServerOptions& options)
      : store_(store), blobs_(blobs), clock_(clock), auth_(auth), options_(options) {}

  grpc::Status StartModelPush(grpc::ServerContext* context, const v1::StartModelPushRequest* request,
                              v1::StartModelPushResponse* reply) override;
  grpc::Status UploadModelPart(grpc::ServerContext* context, const v1::UploadModelPartRequest* request,
                               v1::UploadModelPartResponse* reply) override;
  grpc::Status FinishModelPush(grpc::ServerContext* context, const v1::FinishModelPushRequest* request,
                               v1::Model* reply) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* reply) override;
  grpc::Status GetModel(grpc::ServerContext* context, const v1::GetModelRequest* request, v1::Model* reply) override;
  grpc::Status RemoveModel(grpc::ServerContext* context, const v1::RemoveModelRequest* request,
                           v1::RemoveModelResponse* reply) override;

  // The calls without gRPC, for an authorised caller (push and remove: jobs:write; the others
  // jobs:read).
  absl::StatusOr<v1::StartModelPushResponse> StartPush(const Caller& caller, const v1::StartModelPushRequest& request);
  absl::Status UploadPart(const Caller& caller, const v1::UploadModelPartRequest& request);
  absl::StatusOr<ModelRecord> FinishPush(const Caller& caller, const v1::FinishModelPushRequest& request);
  absl::StatusOr<std::vector<ModelRecord>> List(const Caller& caller, const std::string& team);
  absl::StatusOr<ModelRecord> Get(const Caller& caller, const std::string& team, const std::string& model);
  absl::StatusOr<RemovedModels> Remove(const Caller& caller, const std::string& team, const std::string& model);

 private:
  // The team a call acts for: the credential's (another is PermissionDenied); an admin's choice
  // ("default" when none; for listing, "" is every team).
  absl::StatusOr<std::string> TeamOf(const Caller& caller, const std::string& requested, bool all_allowed = false);
  // Checks a push's digest and size and the part size it is sent in.
  absl::Status CheckPush(const std::string& digest, int64_t size) const;
  // A push in progress of `team` (its parts under `prefix`) may go on: it is touched (its marker
  // says now). A push the team has not started yet is admitted only while the team has fewer than
  // ServerOptions::max_unfinished_model_pushes others; those untouched for
  // unfinished_model_push_ttl are removed first. ResourceExhausted, saying what to do, otherwise.
  absl::Status AdmitPush(const std::string& team, const std::string& hex, int64_t size);
  // ResourceExhausted, naming the limit and the verb that raises it, when the team keeping
  // `size` more bytes of models would pass its max_model_bytes; OK when it has `digest` already.
  absl::Status CheckModelRoom(const std::string& team, const std::string& digest, int64_t size);
  int64_t PartBytes() const;
  int PartCount(int64_t size) const;
  // The GGUF facts of a stored object (reads its head, more while the header goes on).
  absl::StatusOr<ModelFacts> ReadFacts(const std::string& key, int64_t size);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
  Authenticator* auth_;
  ServerOptions options_;
};

}  // namespace minions
