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
// An idle fleet costs (almost) nothing: a Lease that finds no work is held without a thread
// (gRPC's callback API) until work is announced (WorkArrived on this server; NotifyWork from the
// store's WorkSignal for the others) or its wait ends, and an executor that found nothing is not
// looked up in the store again until something was announced (or options.idle_recheck passed).
// Work announced now may be refused to cold executors for the store's warm-executor wait (delay
// scheduling, model/placement.h): an executor that found nothing looks again when such a wait ends,
// not only at its idle recheck, so a cold executor waits no longer than the warm wait.
//
// Spread before stacking (SpreadShare): while executors that hold nothing and run long tasks
// wait here to be served (their long polls, queued or being served: new ones, and those woken by
// any announcement of work, a recheck or a renewal), each of them is granted one task at most. A
// task queued behind another on one machine while another machine sits idle is time lost to the
// job: with 5,000 tasks of 40 s on 10,000 executors, a window of two each left three quarters of
// the fleet idle and the job twice as long. Calls are served in order, so the prefetch an executor
// sends once it holds its task queues behind the idle executors already waiting. Executors of
// short tasks (a window of more than kSpreadWindow) are not capped: there a lease's round trip
// weighs more than a task's wait in a queue. Each server counts the executors waiting on it alone.
//
// Its parts, each with one job and its own lock: LeaseWaitRoom (the held Lease calls, and the
// announcements of work that wake them), IdleLooks (which executors found nothing, and when they
// look in the store again), CompletionPipeline (the ends of attempts on their way to the store,
// and what follows them), Presence (Attach streams, and backups for the tasks of an executor whose
// last one closed) and IdleRenewals (when each executor was last renewed here, so its idle polls
// renew it once an idle beat). Its own state is what it was built with: it holds no lock of its
// own beyond the lease threads' list.
//
// The typed methods (taking an executor id) are the calls without gRPC, for a caller already
// authenticated as that executor (an in-process control plane in tests).
// Threads: called on gRPC's threads; thread-safe. Held Lease calls are served by
// options.lease_threads threads of its own, which wait on the Clock (in the room); a typed
// long-polling Lease waits on the Clock on its caller's thread. Their looks in the store are written in batches by
// the lease batcher's thread (lease_batches_): a lease thread waits for its batch.

#include <atomic>
#include <functional>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

#include "blob/blob_store.h"
#include "common/clock.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "minions/v1/minions.grpc.pb.h"
#include "server/server_metrics.h"
#include "server/chunk_check.h"
#include "server/completion_pipeline.h"
#include "server/confinement_gate.h"
#include "server/gang_leasing.h"
#include "server/group_commit.h"
#include "server/heartbeat_batcher.h"
#include "server/idle_looks.h"
#include "server/idle_renewals.h"
#include "server/lease_wait_room.h"
#include "server/presence.h"
#include "server/task_sizer.h"
#include "server/server_options.h"
#include "store/metadata_store.h"
#include "store/work_signal.h"

namespace minions {

// The generated service with Lease, Attach, Heartbeat, Beats, Complete and CompleteBatch on gRPC's
// callback API (held without a thread: a held lease, a presence or heartbeat stream, a heartbeat
// or a completion waiting for its group-commit batch).
using ExecutorServiceBase = v1::Executors::WithCallbackMethod_Lease<v1::Executors::WithCallbackMethod_Attach<
    v1::Executors::WithCallbackMethod_Heartbeat<v1::Executors::WithCallbackMethod_Beats<
        v1::Executors::WithCallbackMethod_Complete<v1::Executors::WithCallbackMethod_CompleteBatch<
            v1::Executors::Service>>>>>>;

class ExecutorService final : public ExecutorServiceBase {
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
        metrics_(metrics),
        job_ready_(job_ready),
        heartbeats_(store, clock, options.heartbeat_batch, options.heartbeat_linger),
        chunks_(store, blobs, {options.max_chunk_bytes}, &heartbeats_, metrics),
        gangs_(store, clock, GangLeasingOptions{options.lease_ttl, options.gang_reservation_timeout, absl::Seconds(1),
                                                    SilentAfterFor(options.IdleHeartbeat(), options.lease_ttl)}),
        confinement_(store, options.require_confined_executors),
        completions_(store, clock, &chunks_, metrics, options.completion_batch,
                     {[this] { WorkArrived(); }, std::move(job_ready)}),
        renewals_(options.IdleHeartbeat(), RenewalScanPeriod()) {}
  ~ExecutorService() override;

  grpc::Status Enrol(grpc::ServerContext* context, const v1::EnrolRequest* request, v1::EnrolResponse* reply) override;
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* reply) override;
  // Exchanges the caller's credential for a new one (executor_credentials.cc; proto:
  // RotateCredential).
  grpc::Status RotateCredential(grpc::ServerContext* context, const v1::RotateCredentialRequest* request,
                                v1::RotateCredentialResponse* reply) override;
  // Answered when the heartbeat's group-commit batch commits (server/heartbeat_batcher.h).
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* reply) override;
  // A stream of heartbeats, each answered as Heartbeat answers it (proto: Beats).
  grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* Beats(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Lease(grpc::CallbackServerContext* context, const v1::LeaseRequest* request,
                                  v1::LeaseResponse* reply) override;
  // Answered when the completion's group-commit batch commits: the completions of every executor
  // that arrive while one batch commits are checked against one read of their tasks and written in
  // one store transaction (MetadataStore::CompleteMany), each answered with its own outcomes.
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context, const v1::CompleteRequest* request,
                                     v1::CompleteResponse* reply) override;
  grpc::ServerUnaryReactor* CompleteBatch(grpc::CallbackServerContext* context, const v1::CompleteBatchRequest* request,
                                          v1::CompleteBatchResponse* reply) override;
  grpc::Status Fail(grpc::ServerContext* context, const v1::FailRequest* request, v1::FailResponse* reply) override;
  // Spot checks (executor_verification.cc): verification tasks of other producers' chunks, and a
  // verifier's verdicts on one it holds.
  grpc::Status LeaseVerifications(grpc::ServerContext* context, const v1::LeaseVerificationsRequest* request,
                                  v1::LeaseVerificationsResponse* reply) override;
  grpc::Status ReportVerifications(grpc::ServerContext* context, const v1::ReportVerificationsRequest* request,
                                   v1::ReportVerificationsResponse* reply) override;
  // Presence (proto: Attach): open for as long as the executor runs; when its last stream here
  // closes while the server is not stopping, its tasks get backup attempts (server/presence.h).
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(grpc::CallbackServerContext* context,
                                                    const v1::AttachRequest* request) override;

  // Where announcements of work reach the other servers on the store (may be null: this server
  // alone). Call before serving.
  void SetWorkSignal(WorkSignal* signal) { signal_ = signal; }
  // New work may be leasable (a job was submitted, a task requeued) through this server: wakes
  // the long-polling leases here, and announces it to the other servers.
  void WorkArrived();
  // New work may be leasable (announced by another server): wakes the long-polling leases here.
  void NotifyWork();
  // The server is stopping: long-polling leases answer at once, and later ones do not wait.
  void Shutdown();
  // How many times a lease looked the store up (tests: an idle fleet makes none), and how many
  // lease calls are held waiting now.
  int64_t lease_lookups() const;
  // Looks answered "nothing" without a lookup because no task of any job was pending.
  int64_t lookups_spared() const;
  // Times a look that found nothing asked the store whether any task is pending (tests).
  int64_t pending_checks() const;
  int64_t leases_waiting() const;
  // Lease calls queued for the lease batcher and not yet taken into a batch (tests).
  int64_t lease_calls_queued() const { return lease_batches_.waiting(); }
  // Tests: called with the number of calls of each lease batch before it looks in the store, on
  // the batcher's thread. Set before any Lease call.
  void SetBeforeLeaseBatchForTesting(std::function<void(size_t calls)> hook) { before_lease_batch_ = std::move(hook); }

  // The most tasks an executor's prefetch window asks for when its tasks take half a second or
  // more, or it has not measured them yet (ExecutorAgent::PrefetchWindow): one running, one queued.
  static constexpr int kSpreadWindow = 2;
  // Spread before stacking (see the top): how many tasks a held Lease may be granted now, when
  // `others_waiting` other executors that hold nothing and run long tasks wait here to be served.
  static int SpreadShare(const v1::LeaseRequest& request, int64_t others_waiting);
  // Whether a Lease call is one that spreads: a long poll (its executor holds nothing) with a
  // window of at most kSpreadWindow (long tasks, or none measured yet).
  static bool Spreads(const v1::LeaseRequest& request);
  // Liveness renewals this server has made for executors from their idle long polls (not counting
  // the executors' own heartbeats).
  int64_t idle_renewals() const;
  // Heartbeats answered on Beats streams so far (tests: an executor beats on its stream).
  int64_t beats_streamed() const { return beats_streamed_.load(std::memory_order_relaxed); }
  // Attach streams open here now; executors whose tasks got backups because their stream closed.
  int64_t executors_attached() const { return presence_.attached(); }
  int64_t executors_detached_abruptly() const { return presence_.detached_abruptly(); }

  // The calls for an executor already authenticated as `executor_id` (the request's own
  // executor_id field is not consulted). Register with an empty id registers a new executor under
  // a fresh id (an in-process control plane; over gRPC a credential always names one).
  // `may_join_gangs`: its credential holds the gang scope (else its gang address is dropped).
  absl::Status Register(const std::string& executor_id, const v1::RegisterRequest& request,
                        v1::RegisterResponse* reply, bool may_join_gangs = false);
  absl::Status Heartbeat(const std::string& executor_id, const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* reply);
  // In-process callers: an idle poll (request.idle) renews the executor's liveness when it arrives
  // (if due), not while it waits; the callback Lease renews it for as long as it holds the call.
  absl::Status Lease(const std::string& executor_id, const grpc::ServerContext* context,
                     const v1::LeaseRequest& request, v1::LeaseResponse* reply);
  absl::Status Complete(const std::string& executor_id, const v1::CompleteRequest& request);
  absl::Status CompleteBatch(const std::string& executor_id, const v1::CompleteBatchRequest& request,
                             v1::CompleteBatchResponse* reply);
  absl::Status Fail(const std::string& executor_id, const v1::FailRequest& request);
  absl::Status LeaseVerifications(const std::string& executor_id, const v1::LeaseVerificationsRequest& request,
                                  v1::LeaseVerificationsResponse* reply);
  // PermissionDenied unless `executor_id` holds the task's lease; the verdicts are the store's to
  // record (MetadataStore::ReportVerifications), each naming the custom_id the job's input gives.
  absl::Status ReportVerifications(const std::string& executor_id, const v1::ReportVerificationsRequest& request);

 private:
  // A verification task's records as its verifier gets them (server/spot_checks.h); `job_lease`
  // (may be null) gets the task and its job as a Lease, for the model and runner.
  absl::StatusOr<std::vector<v1::VerificationItem>> VerificationItems(const VerificationTask& check,
                                                                      minions::Lease* job_lease);
  // The synchronous Lease of the generated base, replaced by the callback one (it is never called).
  using ExecutorServiceBase::Lease;
  using ExecutorServiceBase::Attach;
  using ExecutorServiceBase::Heartbeat;
  using ExecutorServiceBase::Complete;
  using ExecutorServiceBase::CompleteBatch;

  // Heartbeat without waiting: `reply` is filled and `done` called (with the call's outcome) when
  // the heartbeat's batch commits, on the batcher's thread (or on this one, before it returns,
  // when the heartbeat is refused before reaching the store). `reply` must live until then.
  void HeartbeatAsync(const std::string& executor_id, const v1::HeartbeatRequest& request,
                      v1::HeartbeatResponse* reply, absl::AnyInvocable<void(absl::Status) &&> done);

  // The executor the call's credential is bound to; PermissionDenied when the request names
  // another (`claimed` non-empty and different). `authorized`, when given, gets the caller.
  absl::StatusOr<std::string> AuthorizeExecutor(const grpc::ServerContextBase* context, const std::string& claimed,
                                                Caller* authorized = nullptr);
  // How long from now `caller`'s credential should be exchanged; none: never.
  std::optional<absl::Duration> RotateIn(const Caller& caller) const;

  // One look for work for `executor_id`: the store's, unless it found none since the last
  // announcement and its recheck is not due (then none, without a store round trip).
  // `generation` is the announcement count the answer is as of.
  absl::StatusOr<std::vector<minions::Lease>> LookForWork(const std::string& executor_id, int max_tasks,
                                                          absl::Time now, uint64_t* generation)
;
  // One Lease call's look in the store, as the lease batcher takes it (lease_batches_).
  struct LeaseCall {
    LeaseAsk ask;
    absl::Time now;  // when the call looked: a batch leases as of its latest call's
  };
  // Leases `calls` in one store transaction (MetadataStore::LeaseMany). One answer per call; an
  // error when the batch as a whole failed (the batcher then leases each call alone).
  absl::StatusOr<std::vector<absl::StatusOr<std::vector<minions::Lease>>>> CommitLeases(
      const std::vector<LeaseCall>& calls);
  // The executor's circumstances changed (it registered, finished or gave up a task): it looks in
  // the store on its next lease.
  void ForgetIdle(const std::string& executor_id);
  // Fills `reply` with `leases` (their URLs); on failure hands every one of them back.
  absl::Status AnswerLease(const std::string& executor_id, const std::vector<minions::Lease>& leases, absl::Time now,
                           v1::LeaseResponse* reply);

  // A Lease call held by the callback API, an Attach stream and a Beats stream (defined in the .cc).
  class HeldLease;
  class AttachStream;
  class BeatStream;
  void StartLeaseThreads() ABSL_LOCKS_EXCLUDED(threads_mu_);
  // A lease thread: takes the room's turns (a held call to serve, or a renewal scan) until it closes.
  void LeaseThreadLoop();
  // One look for work for a held call: answers it, or leaves it in the room until work is
  // announced or its wait (or the executor's recheck) is due.
  void Serve(HeldLease* call);
  void Cancelled(HeldLease* call);

  // Idle polls stand for idle heartbeats (ServerOptions::idle_polls_renew; when each executor was
  // last renewed is renewals_'s, which polls are held the room's). A renewal scan: renews those of
  // `idle_polls` due a renewal at `now`, and forgets renewals long past.
  void ScanRenewals(const std::vector<std::string>& idle_polls, absl::Time now);
  // Renews them, as idle heartbeats, in the heartbeats' group commit, without waiting. What the
  // store answers that an executor must hear (drain, register again) is told to the room, for its
  // held idle poll (none held: dropped; a parked one is answered at once).
  void RenewIdle(const std::vector<std::string>& executor_ids);
  // A renewal: an idle heartbeat (state available, nothing held, holdings unchanged).
  HeartbeatCall IdleRenewal(const std::string& executor_id) const;
  // How often the lease threads look for held idle polls due a renewal (a renewal is due this much
  // before an idle beat has passed, so they come at most an idle beat apart, as the executor's own
  // beats would).
  absl::Duration RenewalScanPeriod() const;
  // Its liveness was written now (it registered, or its heartbeat was): renewals_ counts it.
  void LivenessWritten(const std::string& executor_id);
  // `producer` committed chunks, which may have drawn spot checks (docs/verification.md): one
  // idle executor other than it whose long poll is held here is answered at once, with nothing,
  // so that it asks for spot checks now rather than when its poll ends (up to 30 s). One per
  // commit: a busy fleet's commits wake at most as many polls as it commits chunks.
  // `jobs`: the jobs of the committed chunks; only one with spot checks open wakes anyone.
  void WakeAVerifier(const std::string& producer, const std::vector<std::string>& jobs) ABSL_LOCKS_EXCLUDED(work_mu_);

  MetadataStore* store_;
  BlobStore* blobs_;
  Clock* clock_;
  Authenticator* auth_;
  IdentityAdmin* identities_;
  ServerOptions options_;
  ServerMetrics* metrics_;
  // A job may be ready to finalise (its last spot check reported); a copy of what completions_ calls.
  std::function<void(const std::string& job_id)> job_ready_;
  // Heartbeats reach the store in batches (group commit) through it.
  HeartbeatBatcher heartbeats_;
  // Every call that commits chunks goes through it: an upload becomes part of a job's results only
  // once checked against the task's input (server/chunk_check.h).
  ChunkChecker chunks_;
  // Gang jobs' tasks go to whole gangs (server/gang_leasing.h); each look for work checks in there.
  GangLeasing gangs_;
  ConfinementGate confinement_;  // who may be leased work (ServerOptions::require_confined_executors)
  WorkSignal* signal_ = nullptr;
  // The held Lease calls and the announcements of work (server/lease_wait_room.h).
  LeaseWaitRoom room_{clock_, RenewalScanPeriod()};
  // Which executors found nothing, and when they look in the store again (server/idle_looks.h).
  IdleLooks idle_looks_{options_.idle_recheck};
  std::atomic<int64_t> beats_streamed_{0};
  std::atomic<int64_t> heartbeats_in_flight_{0};  // submitted to the batcher, not answered yet
  absl::Mutex threads_mu_;
  std::vector<std::thread> lease_threads_ ABSL_GUARDED_BY(threads_mu_);
  // Attach streams, and backups for executors that went without a word. After what its thread
  // calls back into (the gangs, WorkArrived): ended before them.
  Presence presence_{store_, clock_, Presence::Hooks{[this](const std::string& executor_id, absl::Time now) {
                                                       gangs_.Lost(executor_id, now);
                                                     },
                                                     [this] { WorkArrived(); }}};
  // Lease calls that look in the store while another batch of them is being written look
  // together, in one transaction (group commit, as completions): when thousands of executors want
  // work at once (a job's start, a fleet woken), a transaction per call would be most of the
  // store's work. Its committer thread runs CommitLeases; the lease threads wait on it.
  std::function<void(size_t)> before_lease_batch_;  // tests (SetBeforeLeaseBatchForTesting)
  GroupCommitter<LeaseCall, std::vector<minions::Lease>> lease_batches_{
      [this](const std::vector<LeaseCall>& calls) { return CommitLeases(calls); }, options_.lease_batch,
      absl::ZeroDuration(), "lease-commit"};
  // Completions and failures reach the store through it (completions in group-commit batches),
  // and it does what follows them. Last: built after, and ended (its queue committed) before,
  // what it calls back into.
  CompletionPipeline completions_;
  // When each executor was last renewed here, and the renewals made (server/idle_renewals.h): its
  // own lock. Its polling callback calls into the room (never the other way round).
  IdleRenewals renewals_;
};

}  // namespace minions
