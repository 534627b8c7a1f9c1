#include "server/executor_service.h"

#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "model/model_ref.h"
#include "model/placement.h"
#include "server/call_auth.h"
#include "server/keys.h"
#include "server/lease_answer.h"
#include "server/proto_convert.h"
#include "server/task_sizer.h"

namespace minions {
namespace {

// Authorises the call as an executor and declares `executor_id`, the one its credential names.
#define EXECUTOR_OR_RETURN(context, claimed)                                        \
  absl::StatusOr<std::string> executor_or = AuthorizeExecutor(context, claimed);    \
  if (!executor_or.ok()) return ToGrpc(executor_or.status());                       \
  const std::string& executor_id = *executor_or

LeaseProgress FromProto(const v1::LeaseRef& ref) {
  LeaseProgress progress{ref.job_id(), ref.task_index(), ref.attempt(), ref.records_done(), ref.records_failed(), {}};
  for (const auto& c : ref.chunks()) {
    // A chunk in a report belongs to the report's attempt, whatever it says.
    progress.chunks.push_back({ref.attempt(), c.seq(), c.begin(), c.end(), c.records_failed()});
  }
  return progress;
}

void ToProto(const LeaseProgress& p, v1::LeaseRef* ref) {
  ref->set_job_id(p.job_id);
  ref->set_task_index(p.task_index);
  ref->set_attempt(p.attempt);
  ref->set_records_done(p.records_done);
  ref->set_records_failed(p.records_failed);
}

}  // namespace

absl::StatusOr<std::string> ExecutorService::AuthorizeExecutor(const grpc::ServerContextBase* context,
                                                                const std::string& claimed, Caller* authorized) {
  absl::StatusOr<Caller> caller = AuthorizeCall(context, *auth_, Scope::kExecutor);
  if (!caller.ok()) return caller.status();
  if (authorized != nullptr) *authorized = *caller;
  const std::string id = caller->executor_id();
  if (id.empty()) return absl::PermissionDeniedError("this credential is bound to no executor");
  if (!claimed.empty() && claimed != id) {
    MINIONS_LOG(Warning) << "executor=" << id << " (" << context->peer() << ") called as executor " << claimed
                         << ": refused";
    return absl::PermissionDeniedError(absl::StrCat("this credential belongs to executor ", id, ", not ", claimed));
  }
  return id;
}

grpc::Status ExecutorService::Enrol(grpc::ServerContext* context, const v1::EnrolRequest* request,
                                    v1::EnrolResponse* reply) {
  const ExecutorInfo info = minions::FromProto(request->capabilities());
  absl::Status claimed = CheckClaimedCapabilities(info, options_.runner_allowlist);
  absl::StatusOr<Enrolment> enrolment = claimed.ok() ? identities_->Enrol(BearerToken(context), info)
                                                     : absl::StatusOr<Enrolment>(claimed);
  if (!enrolment.ok()) {
    MINIONS_LOG(Info) << "refused an enrolment from " << context->peer() << ": " << enrolment.status().message();
    return ToGrpc(enrolment.status());
  }
  MINIONS_LOG(Info) << "executor=" << enrolment->executor.id << " enrolled (" << enrolment->executor.info.name
                    << ", " << context->peer() << ") with join token " << enrolment->credential.record.created_by;
  reply->set_executor_id(enrolment->executor.id);
  reply->set_credential(enrolment->credential.text);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  if (enrolment->credential.record.expires_at) {
    reply->set_credential_expires_at_ms(absl::ToUnixMillis(*enrolment->credential.record.expires_at));
  }
  return grpc::Status::OK;
}

grpc::Status ExecutorService::Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                                       v1::RegisterResponse* reply) {
  Caller caller;
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id(), &caller);
  if (!executor_id.ok()) return ToGrpc(executor_id.status());
  // Gangs only for an executor an admin enrolled for them (its credential's gang scope).
  absl::Status registered = Register(*executor_id, *request, reply, caller.Has(Scope::kGang));
  if (std::optional<absl::Duration> in = RotateIn(caller); registered.ok() && in) {
    reply->set_credential_rotates(true);
    reply->set_credential_rotate_in_ms(absl::ToInt64Milliseconds(*in));
  }
  return ToGrpc(registered);
}

absl::Status ExecutorService::Register(const std::string& executor_id, const v1::RegisterRequest& request,
                                       v1::RegisterResponse* reply, bool may_join_gangs) {
  if (auto s = ValidateExecutorName(request.capabilities().name()); !s.ok()) return s;
  ExecutorInfo info = minions::FromProto(request.capabilities());
  if (auto s = CheckClaimedCapabilities(info, options_.runner_allowlist); !s.ok()) return s;
  if (!may_join_gangs && !info.gang_address.empty()) {
    // Not refused (it still runs single-machine work), but it joins no gang: no admin approved it.
    MINIONS_LOG(Warning) << "executor=" << executor_id << " names a gang address but its credential holds no gang "
                         << "scope (enrol it with `minions admin join-token --gang`): it joins no gang";
    info.gang_address.clear();
  }
  auto executor = store_->RegisterExecutor(executor_id, info, clock_->Now());
  if (!executor.ok()) return executor.status();
  if (executor->state == ExecutorState::kRevoked) {
    return absl::PermissionDeniedError(absl::StrCat("executor ", executor_id, " was revoked by an admin"));
  }
  ForgetIdle(executor->id);
  confinement_.Registered(executor->id, executor->info.confinement);
  room_.ForgetNotice(executor->id);  // registered again: what it was told before is moot
  LivenessWritten(executor->id);      // registering renewed it
  MINIONS_LOG(Info) << "executor=" << executor->id << " registered (" << executor->info.name << ", "
                    << executor->info.os << ", " << executor->info.chip << ")";
  reply->set_executor_id(executor->id);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  reply->set_idle_heartbeat_ms(absl::ToInt64Milliseconds(options_.IdleHeartbeat()));
  reply->set_idle_polls_renew(options_.idle_polls_renew);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ExecutorService::Heartbeat(grpc::CallbackServerContext* context,
                                                     const v1::HeartbeatRequest* request,
                                                     v1::HeartbeatResponse* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) {
    reactor->Finish(ToGrpc(executor_id.status()));
    return reactor;
  }
  HeartbeatAsync(*executor_id, *request, reply, [reactor](absl::Status status) { reactor->Finish(ToGrpc(status)); });
  return reactor;
}

absl::Status ExecutorService::Heartbeat(const std::string& executor_id, const v1::HeartbeatRequest& request,
                                        v1::HeartbeatResponse* reply) {
  absl::Status outcome;
  absl::Notification answered;
  HeartbeatAsync(executor_id, request, reply, [&outcome, &answered](absl::Status status) {
    outcome = std::move(status);
    answered.Notify();
  });
  answered.WaitForNotification();
  return outcome;
}

void ExecutorService::HeartbeatAsync(const std::string& executor_id, const v1::HeartbeatRequest& request,
                                     v1::HeartbeatResponse* reply, absl::AnyInvocable<void(absl::Status) &&> done) {
  // Wall time, for minions_heartbeat_seconds (the clock may be a test's): from here, so that the
  // checks below count.
  const absl::Time arrived = absl::Now();
  auto state = ParseExecutorState(request.state().empty() ? "available" : request.state());
  if (!state || *state == ExecutorState::kLost || *state == ExecutorState::kRevoked ||
      *state == ExecutorState::kQuarantined || *state == ExecutorState::kPending) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("unknown executor state '", request.state(), "'")));
    return;
  }
  // What it holds replaces what it registered (IdentityStore), so it is bounded as registration is.
  std::optional<ModelHoldings> holdings;
  if (request.has_holdings()) holdings = minions::FromProto(request.holdings());
  if (absl::Status s = holdings ? CheckClaimedModels(holdings->cached, holdings->loaded) : absl::OkStatus(); !s.ok()) {
    std::move(done)(std::move(s));
    return;
  }
  // Its liveness is written now: an idle poll of it renews nothing until an idle beat has passed
  // (so a fleet whose tasks all end at once, each executor then polling, adds no renewals to the
  // heartbeats' batches: each beat a moment ago).
  LivenessWritten(executor_id);
  // An executor whose state changed (its owner left) may be offered what it was not before.
  idle_looks_.Reported(executor_id, *state);
  if (*state == ExecutorState::kOwnerActive || *state == ExecutorState::kDraining) gangs_.Withdraw(executor_id);
  if (request.gang_duties_size() > 0) {
    // A gang member: the duties whose attempt has ended are stopped (their seats freed). Looked up
    // here, on the caller's thread: the batcher's thread only answers.
    std::vector<AttemptRef> duties;
    for (const auto& ref : request.gang_duties()) duties.push_back({ref.job_id(), ref.task_index(), ref.attempt()});
    for (const AttemptRef& ended : gangs_.EndedDuties(executor_id, duties)) {
      v1::LeaseRef* cancel = reply->add_cancel();
      cancel->set_job_id(ended.job_id);
      cancel->set_task_index(ended.task_index);
      cancel->set_attempt(ended.attempt);
    }
  }
  std::vector<LeaseProgress> held;
  std::vector<std::string> committed;  // jobs of a checkpoint's chunks (spot checks may be drawn)
  for (const auto& ref : request.leases()) {
    held.push_back(FromProto(ref));
    if (!held.back().chunks.empty()) committed.push_back(held.back().job_id);
  }
  // The executor's reason is not kept: why its owner is present never leaves the machine.
  const int64_t ttl_ms = absl::ToInt64Milliseconds(options_.lease_ttl);
  heartbeats_in_flight_.fetch_add(1);  // its answer touches this object: the destructor waits for it
  chunks_.HeartbeatAsync(
      executor_id, *state, "", held, options_.lease_ttl, clock_->Now(), holdings,
      [this, executor_id, reply, ttl_ms, arrived, committed = std::move(committed),
       done = std::move(done)](absl::StatusOr<HeartbeatReply> answer) mutable {
        if (metrics_) metrics_->HeartbeatAnswered(absl::Now() - arrived);
        if (!answer.ok()) {
          if (options_.idle_polls_renew) renewals_.NotWritten(executor_id);  // a poll renews it at once
          std::move(done)(answer.status());
          heartbeats_in_flight_.fetch_sub(1);
          return;
        }
        for (const auto& c : answer->cancel) ToProto(c, reply->add_cancel());
        for (const auto& r : answer->renewed) ToProto(r, reply->add_renewed());
        if (!committed.empty()) WakeAVerifier(executor_id, committed);
        reply->set_drain(answer->drain);
        reply->set_reregister(answer->unknown_executor);
        reply->set_lease_ttl_ms(ttl_ms);
        std::move(done)(absl::OkStatus());
        heartbeats_in_flight_.fetch_sub(1);
      });
}

// A Beats stream: heartbeats one after another on one call. Each is read, its credential checked
// again (a revoked one ends the stream), written into the heartbeats' group commit exactly as a
// Heartbeat call's would be, and answered; the next is read only once that answer is written. At
// most one operation is outstanding at any time, so the reactor needs no lock; whatever ends the
// stream (the executor closing its side, a refusal, a failed write) calls Finish once, and OnDone
// deletes it. An answer that comes after the call was cancelled is written and fails, which ends
// it the same way.
class ExecutorService::BeatStream : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  BeatStream(ExecutorService* service, grpc::CallbackServerContext* context) : service_(service), context_(context) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the executor closed its side (it stops), or the call ended
      Finish(grpc::Status::OK);
      return;
    }
    absl::StatusOr<std::string> executor_id = service_->AuthorizeExecutor(context_, request_.executor_id());
    if (!executor_id.ok()) {
      Finish(ToGrpc(executor_id.status()));
      return;
    }
    reply_.Clear();
    service_->HeartbeatAsync(*executor_id, request_, &reply_, [this](absl::Status status) {
      if (!status.ok()) {
        Finish(ToGrpc(status));
        return;
      }
      service_->beats_streamed_.fetch_add(1, std::memory_order_relaxed);
      StartWrite(&reply_);
    });
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  ExecutorService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::HeartbeatRequest request_;
  v1::HeartbeatResponse reply_;
};

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* ExecutorService::Beats(
    grpc::CallbackServerContext* context) {
  // Checked when it opens too: a caller without an executor's credential holds no stream, even
  // one that never sends a beat.
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, "");
  if (!executor_id.ok()) {
    class Refused : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
     public:
      explicit Refused(const absl::Status& why) { Finish(ToGrpc(why)); }
      void OnDone() override { delete this; }
    };
    return new Refused(executor_id.status());
  }
  return new BeatStream(this, context);
}

// A Lease call held by the callback API: no thread waits for it. Where it stands is the room's
// (server/lease_wait_room.h); whoever the room lets finish it calls Finish (outside the room's
// lock), after which only gRPC touches it (OnDone deletes it).
class ExecutorService::HeldLease : public grpc::ServerUnaryReactor, public LeaseWaitRoom::Call {
 public:
  HeldLease(ExecutorService* service, std::string executor_id, const v1::LeaseRequest* request,
            v1::LeaseResponse* reply, absl::Time deadline, bool idle, bool spreads)
      : LeaseWaitRoom::Call(std::move(executor_id), deadline, idle, spreads),
        service(service),
        request(request),
        reply(reply) {}
  void OnCancel() override { service->Cancelled(this); }
  void OnDone() override { delete this; }

  ExecutorService* const service;
  const v1::LeaseRequest* const request;
  v1::LeaseResponse* const reply;
};

// An Attach stream: one event when it opens, then nothing until it ends (Presence keeps the
// count). Its own mutex orders the first write against the end (Finish waits for the write to be
// done).
class ExecutorService::AttachStream : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  AttachStream(ExecutorService* service, std::string executor_id, absl::Duration lease_ttl)
      : service_(service), executor_id_(std::move(executor_id)) {
    hello_.set_lease_ttl_ms(absl::ToInt64Milliseconds(lease_ttl));
    StartWrite(&hello_);
  }
  void OnWriteDone(bool) override {
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      finish = cancelled_;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }
  void OnCancel() override {
    service_->presence_.Detached(executor_id_);
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      finish = !writing_;
    }
    if (finish) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  ExecutorService* const service_;
  const std::string executor_id_;
  v1::AttachEvent hello_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = true;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerWriteReactor<v1::AttachEvent>* ExecutorService::Attach(grpc::CallbackServerContext* context,
                                                                   const v1::AttachRequest* request) {
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) {
    class Refused : public grpc::ServerWriteReactor<v1::AttachEvent> {
     public:
      explicit Refused(const absl::Status& why) { Finish(ToGrpc(why)); }
      void OnDone() override { delete this; }
    };
    return new Refused(executor_id.status());
  }
  presence_.Attached(*executor_id);
  return new AttachStream(this, *executor_id, options_.lease_ttl);
}

ExecutorService::~ExecutorService() {
  presence_.Stop();
  room_.Close();
  clock_->Wake();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&threads_mu_);
    threads.swap(lease_threads_);
  }
  for (std::thread& t : threads) t.join();
  // Renewals and heartbeats still queued are answered into this object's parts: wait for them (the
  // batcher, a member destroyed after these, answers what it holds before it goes). A renewal's
  // answer counts itself answered last, touching nothing of this object after.
  while (heartbeats_in_flight_.load() > 0) absl::SleepFor(absl::Milliseconds(1));
  renewals_.AwaitAnswered();
}

void ExecutorService::StartLeaseThreads() {
  absl::MutexLock lock(&threads_mu_);
  if (!lease_threads_.empty()) return;
  for (int i = 0; i < std::max(options_.lease_threads, 1); ++i) {
    lease_threads_.emplace_back([this] {
      NameThisThread("lease");
      LeaseThreadLoop();
    });
  }
}

grpc::ServerUnaryReactor* ExecutorService::Lease(grpc::CallbackServerContext* context, const v1::LeaseRequest* request,
                                                 v1::LeaseResponse* reply) {
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  // A pool that requires confined runners leases nothing to another (server/confinement_gate.h).
  if (executor_id.ok()) {
    if (absl::Status confined = confinement_.Check(*executor_id); !confined.ok()) executor_id = confined;
  }
  if (!executor_id.ok()) {
    grpc::ServerUnaryReactor* refused = context->DefaultReactor();
    refused->Finish(ToGrpc(executor_id.status()));
    return refused;
  }
  StartLeaseThreads();  // on the first call: an in-process caller of the typed methods needs none
  const absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(request->wait_ms(), 0, 30000));
  const absl::Time now = clock_->Now();
  auto* call = new HeldLease(this, *executor_id, request, reply, now + wait,
                             options_.idle_polls_renew && request->idle(),
                             Spreads(*request));
  // Whether it is due a renewal, asked before it enters (a lease thread may answer it at once).
  const bool renew = call->idle && renewals_.Due(call->executor_id, now);
  room_.Enter(call, now);
  if (renew) RenewIdle({*executor_id});
  return call;
}

void ExecutorService::LeaseThreadLoop() {
  while (true) {
    LeaseWaitRoom::Turn turn = room_.Next();
    if (turn.scan) {
      ScanRenewals(turn.idle_polls, clock_->Now());
      continue;
    }
    if (turn.call == nullptr) return;  // the room closed
    const bool spreads = turn.call->spreads;  // (the call may be gone once served)
    Serve(static_cast<HeldLease*>(turn.call));
    room_.ServingEnded(spreads);
  }
}

bool ExecutorService::Spreads(const v1::LeaseRequest& request) {
  return request.wait_ms() > 0 && request.max_tasks() <= kSpreadWindow;
}

int ExecutorService::SpreadShare(const v1::LeaseRequest& request, int64_t others_waiting) {
  const int asked = std::clamp(request.max_tasks(), 1, 64);
  return others_waiting > 0 && Spreads(request) ? 1 : asked;
}

void ExecutorService::Serve(HeldLease* call) {
  const absl::Time now = clock_->Now();
  const LeaseWaitRoom::Look look = room_.BeginLook(call);
  if (look.notice) {
    // A renewal found it drained or unknown: it hears that now, instead of work.
    call->reply->set_drain(look.notice->drain);
    call->reply->set_reregister(look.notice->reregister);
    call->reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
    call->reply->set_idle_renewed(true);
    call->Finish(grpc::Status::OK);
    return;
  }
  uint64_t generation = 0;
  absl::StatusOr<std::vector<minions::Lease>> leases;
  if (!look.cancelled) {
    // Spread before stacking (see the top of the header): while other idle executors of long
    // tasks wait here, one task for this one.
    const int max_tasks = SpreadShare(*call->request, look.others_spreading);
    leases = ReclaimedLeases(*store_, call->executor_id, *call->request, now);
    if (leases.ok() && leases->empty()) leases = LookForWork(call->executor_id, max_tasks, now, &generation);
  }
  // Found nothing: it may wait for an announcement, until its deadline or its recheck.
  std::optional<absl::Time> wait_until;
  if (leases.ok() && leases->empty() && now < call->deadline && !gangs_.HasDuties(call->executor_id)) {
    wait_until = std::min(call->deadline, idle_looks_.RecheckAt(call->executor_id).value_or(absl::InfiniteFuture()));
  }
  grpc::Status answer = grpc::Status::OK;
  switch (room_.EndLook(call, generation, wait_until)) {
    case LeaseWaitRoom::AfterLook::kWaiting:
      return;
    case LeaseWaitRoom::AfterLook::kCancelled:
      answer = grpc::Status::CANCELLED;
      break;
    case LeaseWaitRoom::AfterLook::kAnswer:
      answer = leases.ok() ? ToGrpc(AnswerLease(call->executor_id, *leases, now, call->reply))
                           : ToGrpc(leases.status());
      break;
  }
  if (answer.ok() && call->idle) call->reply->set_idle_renewed(true);
  call->Finish(answer);
}

void ExecutorService::Cancelled(HeldLease* call) {
  if (room_.Cancel(call)) call->Finish(grpc::Status::CANCELLED);
}

absl::StatusOr<std::vector<minions::Lease>> ExecutorService::LookForWork(const std::string& executor_id,
                                                                         int max_tasks, absl::Time now,
                                                                         uint64_t* generation) {
  *generation = room_.generation();
  // Gangs first (server/gang_leasing.h): a gang formed for it, or a reservation holding it.
  if (absl::StatusOr<GangLeasing::CheckInAnswer> gang = gangs_.CheckIn(executor_id, now); gang.ok()) {
    if (gang->formed) NotifyWork();  // the gang's other executors take their part at once
    if (!gang->leases.empty()) return std::move(gang->leases);
    if (gang->held) return std::vector<minions::Lease>{};
  }
  if (idle_looks_.Spared(executor_id, room_.generation(), now)) return std::vector<minions::Lease>{};
  absl::StatusOr<std::vector<minions::Lease>> leases =
      options_.lease_batch > 1 ? lease_batches_.Wait(LeaseCall{LeaseAsk{executor_id, max_tasks}, now})
                               : store_->LeaseTasks(executor_id, max_tasks, options_.lease_ttl, now);
  if (!leases.ok()) return leases;
  if (!leases->empty()) {
    idle_looks_.Forget(executor_id);
    return leases;
  }
  // Nothing for this one; for anyone? (Asked after the lookup: work committed before the answer is
  // seen, work committed after it is announced with a new generation.)
  const bool asked = idle_looks_.StartPendingCheck(*generation, room_.generation(), now);
  bool none_pending = false;
  if (asked) {
    absl::StatusOr<bool> any = store_->AnyTaskPending();
    none_pending = any.ok() && !*any;
  }
  idle_looks_.FoundNothing(executor_id, *generation, now, asked, none_pending);
  return leases;
}

absl::StatusOr<std::vector<absl::StatusOr<std::vector<minions::Lease>>>> ExecutorService::CommitLeases(
    const std::vector<LeaseCall>& calls) {
  if (before_lease_batch_) before_lease_batch_(calls.size());
  std::vector<LeaseAsk> asks;
  asks.reserve(calls.size());
  absl::Time now = absl::InfinitePast();
  for (const LeaseCall& call : calls) {
    asks.push_back(call.ask);
    now = std::max(now, call.now);
  }
  absl::StatusOr<std::vector<absl::StatusOr<std::vector<minions::Lease>>>> answers =
      store_->LeaseMany(asks, options_.lease_ttl, now);
  if (!answers.ok() && (absl::IsUnavailable(answers.status()) || absl::IsDeadlineExceeded(answers.status()))) {
    // The store is unreachable (its own retries are spent): every call hears so now, instead of
    // the batcher trying each again alone while the lease threads wait.
    return std::vector<absl::StatusOr<std::vector<minions::Lease>>>(calls.size(), answers.status());
  }
  return answers;
}

void ExecutorService::ForgetIdle(const std::string& executor_id) { idle_looks_.Forget(executor_id); }

int64_t ExecutorService::lease_lookups() const { return idle_looks_.lookups(); }

int64_t ExecutorService::lookups_spared() const { return idle_looks_.spared(); }

int64_t ExecutorService::pending_checks() const { return idle_looks_.pending_checks(); }

int64_t ExecutorService::idle_renewals() const { return renewals_.count(); }

absl::Duration ExecutorService::RenewalScanPeriod() const {
  return std::max(std::min(options_.lease_ttl, options_.IdleHeartbeat()) / 3, absl::Milliseconds(100));
}

void ExecutorService::ScanRenewals(const std::vector<std::string>& idle_polls, absl::Time now) {
  std::vector<std::string> due;
  for (const std::string& executor_id : idle_polls) {
    if (renewals_.Due(executor_id, now)) due.push_back(executor_id);
  }
  renewals_.ForgetSilent(now, [this](const std::string& id) { return room_.Polling(id); });
  RenewIdle(due);
}

void ExecutorService::LivenessWritten(const std::string& executor_id) {
  if (!options_.idle_polls_renew) return;
  renewals_.Written(executor_id, clock_->Now(), [this](const std::string& id) { return room_.Polling(id); });
}

HeartbeatCall ExecutorService::IdleRenewal(const std::string& executor_id) const {
  HeartbeatCall renewal;
  renewal.executor_id = executor_id;
  renewal.state = ExecutorState::kAvailable;
  // Deferred behind heartbeats: the executor's own beat may be written first; then it stands.
  renewal.unless_heard_since = clock_->Now();
  return renewal;
}

void ExecutorService::RenewIdle(const std::vector<std::string>& executor_ids) {
  if (executor_ids.empty()) return;
  renewals_.Counted(static_cast<int64_t>(executor_ids.size()), /*in_flight=*/true);
  for (const std::string& executor_id : executor_ids) {
    auto answer = [this, executor_id](absl::StatusOr<HeartbeatReply> reply) {
      if (!reply.ok()) {
        // Not renewed: the next scan (or the executor's own beat, if its poll ends) tries again.
        MINIONS_LOG(Debug) << "executor=" << executor_id << " idle renewal failed: " << reply.status().message();
        renewals_.NotWritten(executor_id);
      } else if (reply->drain || reply->unknown_executor) {
        room_.Tell(executor_id, {reply->drain, reply->unknown_executor});
      }
      // Last: the service's destructor, once every renewal is answered, finds no answer still in
      // its parts.
      renewals_.Answered();
    };
    // Deferred: a renewal is due well before the executor's last beat expires, and thousands may
    // fall due together; executors waiting for their heartbeats' answers go first.
    heartbeats_.SubmitDeferred(IdleRenewal(executor_id), options_.lease_ttl, std::move(answer));
  }
}

int64_t ExecutorService::leases_waiting() const { return room_.waiting(); }

void ExecutorService::WakeAVerifier(const std::string& producer, const std::vector<std::string>& jobs) {
  // The common cases: spot checks off, or nobody idle to wake: no store read.
  if (!options_.spot_checks || jobs.empty() || !room_.AnyParkedIdlePollBut(producer)) return;
  bool open = false;
  for (const std::string& job : jobs) {
    absl::StatusOr<int64_t> checks = store_->CountOpenVerifications(job);
    open = open || (checks.ok() && *checks > 0);
  }
  if (!open) return;  // none drawn
  room_.WakeOneIdlePollBut(producer);
}

absl::Status ExecutorService::Lease(const std::string& executor_id, const grpc::ServerContext* context,
                                    const v1::LeaseRequest& request, v1::LeaseResponse* reply) {
  if (absl::Status confined = confinement_.Check(executor_id); !confined.ok()) return confined;
  const int max_tasks = std::clamp(request.max_tasks(), 1, 64);
  // Long poll: look again when work is announced, or when this executor's recheck is due.
  const absl::Duration wait = absl::Milliseconds(std::clamp<int64_t>(request.wait_ms(), 0, 30000));
  const absl::Time deadline = clock_->Now() + wait;
  absl::Time now = clock_->Now();
  const bool idle = options_.idle_polls_renew && request.idle();
  if (idle) {
    reply->set_idle_renewed(true);
    if (renewals_.Due(executor_id, now)) {
      renewals_.Counted(1, /*in_flight=*/false);
      absl::StatusOr<HeartbeatReply> renewed = heartbeats_.Heartbeat(IdleRenewal(executor_id), options_.lease_ttl);
      if (!renewed.ok()) {
        renewals_.NotWritten(executor_id);  // not renewed: the next poll tries again
      } else if (renewed->drain || renewed->unknown_executor) {
        reply->set_drain(renewed->drain);
        reply->set_reregister(renewed->unknown_executor);
        reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
        return absl::OkStatus();
      }
    }
  }
  absl::StatusOr<std::vector<minions::Lease>> leases = ReclaimedLeases(*store_, executor_id, request, now);
  if (!leases.ok()) return leases.status();
  while (leases->empty()) {
    uint64_t generation;
    now = clock_->Now();
    leases = LookForWork(executor_id, max_tasks, now, &generation);
    if (!leases.ok()) return leases.status();
    if (!leases->empty() || gangs_.HasDuties(executor_id) || (context && context->IsCancelled()) || now >= deadline) {
      break;
    }
    const absl::Time wake = std::min(deadline, idle_looks_.RecheckAt(executor_id).value_or(absl::InfiniteFuture()));
    if (room_.AwaitAnnouncement(generation, wake)) break;  // the server stops
  }
  return AnswerLease(executor_id, *leases, now, reply);
}

absl::Status ExecutorService::AnswerLease(const std::string& executor_id, const std::vector<minions::Lease>& leases,
                                          absl::Time now, v1::LeaseResponse* reply) {
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  for (const minions::Lease& lease : leases) {
    const Task& t = lease.task;
    absl::Status urls = FillTaskLease(*blobs_, options_.url_ttl, lease, *reply->add_leases());
    if (!urls.ok()) {
      // An error reply carries no leases, so hand back every task granted by this call (not just
      // this one): the executor never learns of them, and letting their leases expire would count
      // a failure against each. Preempted: straight back to pending, not counted.
      for (const minions::Lease& granted : leases) {
        const Task& g = granted.task;
        (void)store_->FailTask(executor_id, g.job_id, g.index, g.attempt, FailureClass::kPreempted,
                               "the server could not produce object URLs", now);
      }
      reply->clear_leases();
      WorkArrived();
      return urls;
    }
    MINIONS_LOG(Debug) << "job=" << t.job_id << " task=" << t.index << " attempt=" << t.attempt
                       << " executor=" << executor_id << " leased";
  }
  if (metrics_) {
    for (const minions::Lease& lease : leases) metrics_->LeaseGranted(lease.task, now);
  }
  for (const GangDuty& duty : gangs_.TakeDuties(executor_id)) {
    FillGangDuty(duty, *reply->add_gang_duties());
    MINIONS_LOG(Info) << Describe(duty.ref) << " executor=" << executor_id << " serves the gang as a member";
  }
  return absl::OkStatus();
}

void ExecutorService::WorkArrived() {
  NotifyWork();
  if (signal_ == nullptr) return;
  // Best effort: a server that misses it looks again after its idle recheck.
  if (absl::Status announced = signal_->Announce(); !announced.ok()) {
    MINIONS_LOG(Warning) << "other servers not told of new work: " << announced.message();
  }
}

void ExecutorService::NotifyWork() {
  // The work may be a job's first tasks, which cold executors may take only once the warm wait
  // has passed (a job is created before its tasks are announced, so this end is never early).
  // Its wait's end is in place before the announcement counts: a look as of it sees the end.
  idle_looks_.Announced(clock_->Now(), store_->WarmWait());
  room_.Announce();
}

void ExecutorService::Shutdown() {
  presence_.Stop();
  room_.Stop();
}

grpc::ServerUnaryReactor* ExecutorService::Complete(grpc::CallbackServerContext* context,
                                                    const v1::CompleteRequest* request, v1::CompleteResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) {
    reactor->Finish(ToGrpc(executor_id.status()));
    return reactor;
  }
  ForgetIdle(*executor_id);
  completions_.Submit(*executor_id, {FromProto(request->ref())},
                [this, reactor, producer = *executor_id,
                 job = request->ref().job_id()](absl::StatusOr<std::vector<absl::Status>> outcomes) {
                  if (outcomes.ok() && outcomes->size() != 1) outcomes = absl::InternalError("no outcome");
                  if (outcomes.ok() && outcomes->front().ok()) WakeAVerifier(producer, {job});
                  reactor->Finish(ToGrpc(outcomes.ok() ? outcomes->front() : outcomes.status()));
                });
  return reactor;
}

absl::Status ExecutorService::Complete(const std::string& executor_id, const v1::CompleteRequest& request) {
  ForgetIdle(executor_id);
  ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes, completions_.Complete(executor_id, {FromProto(request.ref())}));
  if (outcomes.size() != 1) return absl::InternalError("no outcome");
  if (outcomes.front().ok()) WakeAVerifier(executor_id, {request.ref().job_id()});
  return outcomes.front();
}

namespace {

void FillOutcomes(const std::vector<absl::Status>& outcomes, v1::CompleteBatchResponse* reply) {
  for (const absl::Status& outcome : outcomes) {
    v1::Outcome* out = reply->add_outcomes();
    out->set_code(static_cast<int>(outcome.code()));
    out->set_message(std::string(outcome.message()));
  }
}

}  // namespace

grpc::ServerUnaryReactor* ExecutorService::CompleteBatch(grpc::CallbackServerContext* context,
                                                         const v1::CompleteBatchRequest* request,
                                                         v1::CompleteBatchResponse* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::string> executor_id = AuthorizeExecutor(context, request->executor_id());
  if (!executor_id.ok()) {
    reactor->Finish(ToGrpc(executor_id.status()));
    return reactor;
  }
  std::vector<LeaseProgress> reports;
  std::vector<std::string> jobs;
  for (const auto& ref : request->refs()) {
    reports.push_back(FromProto(ref));
    jobs.push_back(ref.job_id());
  }
  ForgetIdle(*executor_id);
  completions_.Submit(*executor_id, std::move(reports),
                      [this, reactor, reply, producer = *executor_id,
                       jobs = std::move(jobs)](absl::StatusOr<std::vector<absl::Status>> outcomes) {
    if (outcomes.ok()) FillOutcomes(*outcomes, reply);
    if (outcomes.ok()) WakeAVerifier(producer, jobs);
    reactor->Finish(ToGrpc(outcomes.status()));
  });
  return reactor;
}

absl::Status ExecutorService::CompleteBatch(const std::string& executor_id, const v1::CompleteBatchRequest& request,
                                            v1::CompleteBatchResponse* reply) {
  std::vector<LeaseProgress> reports;
  for (const auto& ref : request.refs()) reports.push_back(FromProto(ref));
  ForgetIdle(executor_id);
  ASSIGN_OR_RETURN(std::vector<absl::Status> outcomes, completions_.Complete(executor_id, reports));
  FillOutcomes(outcomes, reply);
  std::vector<std::string> jobs;
  for (const auto& ref : request.refs()) jobs.push_back(ref.job_id());
  WakeAVerifier(executor_id, jobs);
  return absl::OkStatus();
}

grpc::Status ExecutorService::Fail(grpc::ServerContext* context, const v1::FailRequest* request, v1::FailResponse*) {
  EXECUTOR_OR_RETURN(context, request->executor_id());
  return ToGrpc(Fail(executor_id, *request));
}

absl::Status ExecutorService::Fail(const std::string& executor_id, const v1::FailRequest& request) {
  auto failure = ParseFailureClass(request.failure_class());
  if (!failure) {
    return absl::InvalidArgumentError(absl::StrCat("failure_class must be retryable, permanent or preempted, not '",
                                                   request.failure_class(), "'"));
  }
  const auto& ref = request.ref();
  ForgetIdle(executor_id);
  auto task = completions_.Fail(executor_id, FromProto(ref), *failure, request.message());
  if (!task.ok()) return task.status();
  MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                    << " executor=" << executor_id << " " << request.failure_class() << ": " << request.message()
                    << " -> " << TaskStateName(task->state);
  return absl::OkStatus();
}

}  // namespace minions
