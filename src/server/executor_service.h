#pragma once
// ExecutorService: the Executors gRPC service — register, heartbeat, lease, complete, fail.
// Every report about a task is fenced by its attempt in the store. Leases carry URLs for exactly
// the task's objects, so executors hold no object-store credentials.
// Threads: called on gRPC's threads; thread-safe. A long-polling Lease waits on the Clock.

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "blob/blob_store.h"
#include "common/clock.h"
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
  ExecutorService(MetadataStore* store, BlobStore* blobs, Clock* clock, const ServerOptions& options,
                  std::function<void(const std::string& job_id)> job_ready, ServerMetrics* metrics = nullptr)
      : store_(store),
        blobs_(blobs),
        clock_(clock),
        options_(options),
        job_ready_(std::move(job_ready)),
        metrics_(metrics),
        chunks_(store, blobs, {options.max_chunk_bytes}) {}

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

 private:
  // The lease's input URL and one write URL pair per chunk the attempt may upload.
  absl::Status FillObjectUrls(const minions::Lease& lease, v1::TaskLease& out);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
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
