#pragma once
// ExecutorService: the Executors gRPC service — enrol, register, heartbeat, lease, complete,
// fail. Every report about a task is fenced by its attempt in the store. Leases carry URLs for
// exactly the task's objects, so executors hold no object-store credentials.
//
// Who an executor is comes from its credential, never from the request: Enrol trades a join
// token for a server-named executor and its own credential; every other call is made as the
// executor that credential is bound to (an executor_id in the request must be that one, or the
// call is refused with PermissionDenied). A revoked executor is refused by the store itself, on
// every server, at once.
//
// The typed methods (taking an executor id) are the calls without gRPC, for a caller already
// authenticated as that executor (an in-process control plane in tests).
// Threads: called on gRPC's threads; thread-safe. A long-polling Lease waits on the Clock.

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "blob/blob_store.h"
#include "common/clock.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "minions/v1/minions.grpc.pb.h"
#include "server/server_metrics.h"
#include "server/chunk_check.h"
#include "server/server_options.h"
#include "store/metadata_store.h"

namespace minions {

class ExecutorService final : public v1::Executors::Service {
 public:
  // `job_ready` is called when a completion leaves a job ready to finalise. `metrics` (may be null)
  // observes leases and attempts.
  ExecutorService(MetadataStore* store, BlobStore* blobs, Clock* clock, Authenticator* auth,
                  IdentityAdmin* identities, const ServerOptions& options,
                  std::function<void(const std::string& job_id)> job_ready, ServerMetrics* metrics = nullptr)
      : store_(store),
        blobs_(blobs),
        clock_(clock),
        auth_(auth),
        identities_(identities),
        options_(options),
        job_ready_(std::move(job_ready)),
        metrics_(metrics),
        chunks_(store, blobs, {options.max_chunk_bytes}) {}

  grpc::Status Enrol(grpc::ServerContext* context, const v1::EnrolRequest* request, v1::EnrolResponse* reply) override;
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* reply) override;
  grpc::Status Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                     v1::LeaseResponse* reply) override;
  grpc::Status Complete(grpc::ServerContext* context, const v1::CompleteRequest* request,
                        v1::CompleteResponse* reply) override;
  grpc::Status CompleteBatch(grpc::ServerContext* context, const v1::CompleteBatchRequest* request,
                             v1::CompleteBatchResponse* reply) override;
  grpc::Status Fail(grpc::ServerContext* context, const v1::FailRequest* request, v1::FailResponse* reply) override;

  // New work may be leasable (a job was submitted, a task requeued): wakes long-polling leases.
  void NotifyWork() ABSL_LOCKS_EXCLUDED(work_mu_);
  // The server is stopping: long-polling leases answer at once, and later ones do not wait.
  void Shutdown() ABSL_LOCKS_EXCLUDED(work_mu_);

  // The calls for an executor already authenticated as `executor_id` (the request's own
  // executor_id field is not consulted). Register with an empty id registers a new executor under
  // a fresh id (an in-process control plane; over gRPC a credential always names one).
  absl::Status Register(const std::string& executor_id, const v1::RegisterRequest& request,
                        v1::RegisterResponse* reply);
  absl::Status Heartbeat(const std::string& executor_id, const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* reply);
  absl::Status Lease(const std::string& executor_id, const grpc::ServerContext* context,
                     const v1::LeaseRequest& request, v1::LeaseResponse* reply);
  absl::Status Complete(const std::string& executor_id, const v1::CompleteRequest& request);
  absl::Status CompleteBatch(const std::string& executor_id, const v1::CompleteBatchRequest& request,
                             v1::CompleteBatchResponse* reply);
  absl::Status Fail(const std::string& executor_id, const v1::FailRequest& request);

 private:
  // The executor the call's credential is bound to; PermissionDenied when the request names
  // another (`claimed` non-empty and different).
  absl::StatusOr<std::string> AuthorizeExecutor(const grpc::ServerContext* context, const std::string& claimed);

  // The lease's input URL and one write URL pair per chunk the attempt may upload.
  absl::Status FillObjectUrls(const minions::Lease& lease, v1::TaskLease& out);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
  Authenticator* auth_;
  IdentityAdmin* identities_;
  ServerOptions options_;
  std::function<void(const std::string&)> job_ready_;
  ServerMetrics* metrics_;
  // Every call that commits chunks goes through it: an upload becomes part of a job's results only
  // once checked against the task's input (server/chunk_check.h).
  ChunkChecker chunks_;
  absl::Mutex work_mu_;
  uint64_t work_generation_ ABSL_GUARDED_BY(work_mu_) = 0;  // bumped by NotifyWork
  bool stopping_ ABSL_GUARDED_BY(work_mu_) = false;
};

}  // namespace minions
