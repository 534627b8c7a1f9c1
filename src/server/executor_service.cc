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
  {
    absl::MutexLock lock(&work_mu_);
    poll_notices_.erase(executor->id);  // registered again: what it was told before is moot
    if (options_.idle_polls_renew) {  // registering renewed it
      renewals_.Written(executor->id, clock_->Now(), [this](const std::string& id) {
        work_mu_.AssertHeld();
        return PollingLocked(id);
      });
    }
  }
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
  // Wall time, for minions_heartbeat_seconds (the clock may be a test's): from here, so that a wait
  // for work_mu_ below counts (the lease threads hold it).
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
  {
    absl::MutexLock lock(&work_mu_);
    // Its liveness is written now: an idle poll of it renews nothing until an idle beat has passed
    // (so a fleet whose tasks all end at once, each executor then polling, adds no renewals to
    // the heartbeats' batches: each beat a moment ago).
    if (options_.idle_polls_renew) {
      renewals_.Written(executor_id, clock_->Now(), [this](const std::string& id) {
        work_mu_.AssertHeld();
        return PollingLocked(id);
      });
    }
    // An executor whose state changed (its owner left) may be offered what it was not before.
    if (auto it = idle_.find(executor_id); it != idle_.end()) {
      if (it->second.reported && *it->second.reported != *state) {
        idle_.erase(it);
      } else {
        it->second.reported = *state;
      }
    }
  }
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

// A Lease call held by the callback API: no thread waits for it. Its state moves under work_mu_;
// whoever moves it to kFinished calls Finish (outside the lock), after which only gRPC touches it
// (OnDone deletes it).
class ExecutorService::HeldLease : public grpc::ServerUnaryReactor {
 public:
  enum class State { kReady, kServing, kParked, kFinished };
  HeldLease(ExecutorService* service, std::string executor_id, const v1::LeaseRequest* request,
            v1::LeaseResponse* reply, absl::Time deadline, bool idle, bool spreads)
      : service(service),
        executor_id(std::move(executor_id)),
        request(request),
        reply(reply),
        deadline(deadline),
        idle(idle),
        spreads(spreads) {}
  void OnCancel() override { service->Cancelled(this); }
  void OnDone() override { delete this; }

  ExecutorService* const service;
  const std::string executor_id;
  const v1::LeaseRequest* const request;
  v1::LeaseResponse* const reply;
  const absl::Time deadline;
  const bool idle;  // stands for its executor's idle heartbeat while held (LeaseRequest.idle)
  // Its executor holds nothing and runs long tasks (or has not measured yet): counted in
  // idle_unserved_ while ready or being served (spread before stacking).
  const bool spreads;
  // Guarded by service->work_mu_ (the analysis cannot name another object's mutex here).
  State state = State::kReady;
  bool cancelled = false;
  absl::Time wake_at;  // while parked
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
  {
    absl::MutexLock lock(&work_mu_);
    stopping_ = true;
    exiting_ = true;
    WakeParkedLocked();
  }
  clock_->Wake();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&work_mu_);
    threads.swap(lease_threads_);
  }
  for (std::thread& t : threads) t.join();
  // Renewals and heartbeats still queued are answered into this object's maps: wait for them (the
  // batcher, a member destroyed after these, answers what it holds before it goes).
  while (heartbeats_in_flight_.load() > 0) absl::SleepFor(absl::Milliseconds(1));
  renewals_.AwaitAnswered();
  // The last answer counted itself answered inside work_mu_: once this holds it, that one is done.
  absl::MutexLock lock(&work_mu_);
}

void ExecutorService::StartLeaseThreads() {
  absl::MutexLock lock(&work_mu_);
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
  bool renew = false;
  {
    absl::MutexLock lock(&work_mu_);
    if (call->idle) {
      idle_polls_[call->executor_id] = call;  // the latest: an older one still held no longer renews
      renew = renewals_.Due(call->executor_id, now);
      if (next_renewal_scan_ == absl::InfiniteFuture()) next_renewal_scan_ = now + RenewalScanPeriod();
    }
    MakeReadyLocked(call);
  }
  if (renew) RenewIdle({*executor_id});
  return call;
}

void ExecutorService::LeaseThreadLoop() {
  while (true) {
    HeldLease* call = nullptr;
    std::vector<std::string> renew;
    {
      absl::MutexLock lock(&work_mu_);
      while (call == nullptr && renew.empty()) {
        const absl::Time now = clock_->Now();
        while (!parked_.empty() && parked_.begin()->first <= now) {
          HeldLease* due = parked_.begin()->second;
          parked_.erase(parked_.begin());
          MakeReadyLocked(due);
        }
        if (next_renewal_scan_ <= now) {
          renew = DueRenewalsLocked(now);
          next_renewal_scan_ = idle_polls_.empty() ? absl::InfiniteFuture() : now + RenewalScanPeriod();
          if (!renew.empty()) break;
        }
        if (!ready_.empty()) {
          call = ready_.front();
          ready_.pop_front();
          call->state = HeldLease::State::kServing;
          break;
        }
        if (exiting_) return;
        auto runnable = [this] {
          work_mu_.AssertHeld();
          return !ready_.empty() || exiting_;
        };
        absl::Time due = next_renewal_scan_;
        if (!parked_.empty()) due = std::min(due, parked_.begin()->first);
        if (due == absl::InfiniteFuture()) {
          work_mu_.Await(absl::Condition(&runnable));  // nothing due on the clock: no clock waiter
        } else {
          clock_->AwaitWithDeadline(work_mu_, absl::Condition(&runnable), due);
        }
      }
    }
    if (!renew.empty()) {
      RenewIdle(renew);
      continue;
    }
    const bool spreads = call->spreads;  // (the call may be gone once served)
    Serve(call);
    if (spreads) {
      absl::MutexLock lock(&work_mu_);
      --idle_unserved_;
    }
  }
}

void ExecutorService::MakeReadyLocked(HeldLease* call) {
  call->state = HeldLease::State::kReady;
  if (call->spreads) ++idle_unserved_;  // until its serving ends (LeaseThreadLoop)
  ready_.push_back(call);
}

bool ExecutorService::Spreads(const v1::LeaseRequest& request) {
  return request.wait_ms() > 0 && request.max_tasks() <= kSpreadWindow;
}

int ExecutorService::SpreadShare(const v1::LeaseRequest& request, int64_t others_waiting) {
  const int asked = std::clamp(request.max_tasks(), 1, 64);
  return others_waiting > 0 && Spreads(request) ? 1 : asked;
}

void ExecutorService::Serve(HeldLease* call) {
  int max_tasks;
  const absl::Time now = clock_->Now();
  uint64_t generation = 0;
  absl::StatusOr<std::vector<minions::Lease>> leases;
  bool cancelled;
  bool noticed = false;
  {
    absl::MutexLock lock(&work_mu_);
    // Spread before stacking (see the top of the header): while other idle executors of long
    // tasks wait here, one task for this one.
    max_tasks = SpreadShare(*call->request, idle_unserved_ - (call->spreads ? 1 : 0));
    cancelled = call->cancelled;
    if (!cancelled && TakePollNoticeLocked(call->executor_id, call->reply)) {
      // A renewal found it drained or unknown: it hears that now, instead of work.
      call->state = HeldLease::State::kFinished;
      EndIdlePollLocked(call);
      noticed = true;
    }
  }
  if (noticed) {
    call->reply->set_idle_renewed(true);
    call->Finish(grpc::Status::OK);
    return;
  }
  if (!cancelled) {
    leases = ReclaimedLeases(*store_, call->executor_id, *call->request, now);
    if (leases.ok() && leases->empty()) leases = LookForWork(call->executor_id, max_tasks, now, &generation);
  }
  grpc::Status answer = grpc::Status::OK;
  {
    absl::MutexLock lock(&work_mu_);
    if (call->cancelled) {
      answer = grpc::Status::CANCELLED;
    } else if (!leases.ok()) {
      answer = ToGrpc(leases.status());
    } else if (leases->empty() && now < call->deadline && !stopping_ && !gangs_.HasDuties(call->executor_id)) {
      if (generation != work_generation_ || poll_notices_.contains(call->executor_id)) {
        // Work was announced while this looked (look again), or a renewal found something the
        // executor must hear (answered at the next look).
        MakeReadyLocked(call);
        return;
      }
      absl::Time wake = call->deadline;
      if (auto it = idle_.find(call->executor_id); it != idle_.end()) wake = std::min(wake, it->second.recheck_at);
      call->state = HeldLease::State::kParked;
      call->wake_at = wake;
      parked_.emplace(wake, call);
      return;
    }
    call->state = HeldLease::State::kFinished;
    EndIdlePollLocked(call);
  }
  if (answer.ok()) answer = ToGrpc(AnswerLease(call->executor_id, *leases, now, call->reply));
  if (answer.ok() && call->idle) call->reply->set_idle_renewed(true);
  call->Finish(answer);
}

void ExecutorService::Cancelled(HeldLease* call) {
  {
    absl::MutexLock lock(&work_mu_);
    call->cancelled = true;
    if (call->state != HeldLease::State::kParked) return;  // whoever holds it finishes it
    parked_.erase({call->wake_at, call});
    call->state = HeldLease::State::kFinished;
    EndIdlePollLocked(call);
  }
  call->Finish(grpc::Status::CANCELLED);
}

void ExecutorService::WakeParkedLocked() {
  for (const auto& [wake, call] : parked_) MakeReadyLocked(call);
  parked_.clear();
}

absl::StatusOr<std::vector<minions::Lease>> ExecutorService::LookForWork(const std::string& executor_id,
                                                                         int max_tasks, absl::Time now,
                                                                         uint64_t* generation) {
  {
    absl::MutexLock lock(&work_mu_);
    *generation = work_generation_;
  }
  // Gangs first (server/gang_leasing.h): a gang formed for it, or a reservation holding it.
  if (absl::StatusOr<GangLeasing::CheckInAnswer> gang = gangs_.CheckIn(executor_id, now); gang.ok()) {
    if (gang->formed) NotifyWork();  // the gang's other executors take their part at once
    if (!gang->leases.empty()) return std::move(gang->leases);
    if (gang->held) return std::vector<minions::Lease>{};
  }
  {
    absl::MutexLock lock(&work_mu_);
    auto it = idle_.find(executor_id);
    if (it != idle_.end() && it->second.generation == work_generation_ && now < it->second.recheck_at) {
      return std::vector<minions::Lease>{};
    }
    if (none_pending_ && none_pending_->generation == work_generation_ && now < none_pending_->recheck_at) {
      ++lookups_spared_;
      IdleMark& mark = idle_[executor_id];
      mark.generation = work_generation_;
      mark.recheck_at = none_pending_->recheck_at;
      return std::vector<minions::Lease>{};
    }
    ++lease_lookups_;
  }
  absl::StatusOr<std::vector<minions::Lease>> leases =
      options_.lease_batch > 1 ? lease_batches_.Wait(LeaseCall{LeaseAsk{executor_id, max_tasks}, now})
                               : store_->LeaseTasks(executor_id, max_tasks, options_.lease_ttl, now);
  if (!leases.ok()) return leases;
  bool none_pending = false;
  bool asked = false;
  if (leases->empty()) {
    {
      absl::MutexLock lock(&work_mu_);
      // Another look of this generation may have asked already; an answer whose recheck has
      // passed is asked again (kept for ever, every later look of the generation went to the
      // store: a 40 s job's 5,000 task ends were 5,000 lease lookups).
      // One look asks at a time (the others' answers, found nothing too, add nothing to its): a
      // batch of empty answers would wake up to one asking lease thread each.
      asked = *generation == work_generation_ && !pending_check_running_ &&
              !(none_pending_ && none_pending_->generation == *generation && now < none_pending_->recheck_at);
      if (asked) {
        pending_check_running_ = true;
        ++pending_checks_;
      }
    }
    // Nothing for this one; for anyone? (Asked after the lookup: work committed before the answer
    // is seen, work committed after it is announced with a new generation.)
    if (asked) {
      absl::StatusOr<bool> any = store_->AnyTaskPending();
      none_pending = any.ok() && !*any;
    }
  }
  absl::MutexLock lock(&work_mu_);
  if (leases->empty()) {
    IdleMark& mark = idle_[executor_id];
    mark.generation = *generation;
    mark.recheck_at = NextRecheckLocked(now);
    if (none_pending) none_pending_ = IdleMark{*generation, mark.recheck_at, std::nullopt};
    if (asked) pending_check_running_ = false;  // with its answer in place: no gap for another to ask
  } else {
    idle_.erase(executor_id);
  }
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

absl::Time ExecutorService::NextRecheckLocked(absl::Time now) {
  while (!warm_wait_ends_.empty() && *warm_wait_ends_.begin() <= now) warm_wait_ends_.erase(warm_wait_ends_.begin());
  const absl::Time recheck = now + options_.idle_recheck;
  return warm_wait_ends_.empty() ? recheck : std::min(recheck, *warm_wait_ends_.begin());
}

void ExecutorService::ForgetIdle(const std::string& executor_id) {
  absl::MutexLock lock(&work_mu_);
  idle_.erase(executor_id);
}

int64_t ExecutorService::lease_lookups() const {
  absl::MutexLock lock(&work_mu_);
  return lease_lookups_;
}

int64_t ExecutorService::lookups_spared() const {
  absl::MutexLock lock(&work_mu_);
  return lookups_spared_;
}

int64_t ExecutorService::pending_checks() const {
  absl::MutexLock lock(&work_mu_);
  return pending_checks_;
}

int64_t ExecutorService::idle_renewals() const { return renewals_.count(); }

absl::Duration ExecutorService::RenewalScanPeriod() const {
  return std::max(std::min(options_.lease_ttl, options_.IdleHeartbeat()) / 3, absl::Milliseconds(100));
}

std::vector<std::string> ExecutorService::DueRenewalsLocked(absl::Time now) {
  std::vector<std::string> due;
  for (const auto& [executor_id, call] : idle_polls_) {
    if (renewals_.Due(executor_id, now)) due.push_back(executor_id);
  }
  renewals_.ForgetSilent(now, [this](const std::string& id) {
    work_mu_.AssertHeld();
    return PollingLocked(id);
  });
  return due;
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
      absl::MutexLock lock(&work_mu_);
      // Answered under work_mu_: the service's destructor, once every renewal is answered, finds
      // no answer still inside its maps.
      renewals_.Answered();
      if (!reply.ok()) {
        // Not renewed: the next scan (or the executor's own beat, if its poll ends) tries again.
        MINIONS_LOG(Debug) << "executor=" << executor_id << " idle renewal failed: " << reply.status().message();
        renewals_.NotWritten(executor_id);
        return;
      }
      if (!reply->drain && !reply->unknown_executor) return;
      // Kept only while an idle poll of the executor is held here (a later renewal tells a later
      // poll again): never answered to a poll made after the executor has moved on.
      auto it = idle_polls_.find(executor_id);
      if (it == idle_polls_.end()) return;
      PollNotice& notice = poll_notices_[executor_id];
      notice.drain = notice.drain || reply->drain;
      notice.reregister = notice.reregister || reply->unknown_executor;
      if (it->second->state != HeldLease::State::kParked) return;  // heard at its next look
      HeldLease* call = it->second;
      parked_.erase({call->wake_at, call});
      MakeReadyLocked(call);
    };
    // Deferred: a renewal is due well before the executor's last beat expires, and thousands may
    // fall due together; executors waiting for their heartbeats' answers go first.
    heartbeats_.SubmitDeferred(IdleRenewal(executor_id), options_.lease_ttl, std::move(answer));
  }
}

void ExecutorService::WakeAVerifier(const std::string& producer, const std::vector<std::string>& jobs) {
  auto anyone = [&] {
    absl::MutexLock lock(&work_mu_);
    for (const auto& [executor_id, call] : idle_polls_) {
      if (executor_id != producer && call->state == HeldLease::State::kParked) return true;
    }
    return false;
  };
  if (jobs.empty() || !anyone()) return;  // the common case: nobody idle to wake, no store read
  bool open = false;
  for (const std::string& job : jobs) {
    absl::StatusOr<int64_t> checks = store_->CountOpenVerifications(job);
    open = open || (checks.ok() && *checks > 0);
  }
  if (!open) return;  // spot checks off, or none drawn
  absl::MutexLock lock(&work_mu_);
  for (auto& [executor_id, call] : idle_polls_) {
    if (executor_id == producer || call->state != HeldLease::State::kParked) continue;
    poll_notices_[executor_id];  // an empty notice: answered at once, with no work
    parked_.erase({call->wake_at, call});
    MakeReadyLocked(call);
    return;
  }
}

void ExecutorService::EndIdlePollLocked(HeldLease* call) {
  if (!call->idle) return;
  auto it = idle_polls_.find(call->executor_id);
  if (it == idle_polls_.end() || it->second != call) return;
  idle_polls_.erase(it);
  poll_notices_.erase(call->executor_id);  // not heard: a later poll's renewal tells it again
}

bool ExecutorService::TakePollNoticeLocked(const std::string& executor_id, v1::LeaseResponse* reply) {
  auto it = poll_notices_.find(executor_id);
  if (it == poll_notices_.end()) return false;
  reply->set_drain(it->second.drain);
  reply->set_reregister(it->second.reregister);
  reply->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  poll_notices_.erase(it);
  return true;
}

int64_t ExecutorService::leases_waiting() const {
  absl::MutexLock lock(&work_mu_);
  return static_cast<int64_t>(parked_.size());
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
    bool renew;
    renew = renewals_.Due(executor_id, now);
    if (renew) renewals_.Counted(1, /*in_flight=*/false);
    if (renew) {
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
    absl::MutexLock lock(&work_mu_);
    auto notified = [&] {
      work_mu_.AssertHeld();
      return work_generation_ != generation || stopping_;
    };
    absl::Time wake = deadline;
    if (auto it = idle_.find(executor_id); it != idle_.end()) wake = std::min(wake, it->second.recheck_at);
    clock_->AwaitWithDeadline(work_mu_, absl::Condition(&notified), wake);
    if (stopping_) break;
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
  const absl::Duration warm_wait = store_->WarmWait();
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&work_mu_);
    ++work_generation_;
    if (warm_wait > absl::ZeroDuration()) {
      // Rounded up to 100 ms (never early): a busy server keeps a few dozen of them at most.
      while (!warm_wait_ends_.empty() && *warm_wait_ends_.begin() <= now) warm_wait_ends_.erase(warm_wait_ends_.begin());
      const absl::Duration step = absl::Milliseconds(100);
      warm_wait_ends_.insert(absl::UnixEpoch() + absl::Ceil(now + warm_wait - absl::UnixEpoch(), step));
    }
    WakeParkedLocked();
  }
}

void ExecutorService::Shutdown() {
  presence_.Stop();
  absl::MutexLock lock(&work_mu_);
  stopping_ = true;
  WakeParkedLocked();
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
