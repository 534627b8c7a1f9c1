#pragma once
// LeaseHolder: an executor of the test's own, talking to a real server over gRPC, that holds one
// task and runs nothing, so that the job cannot end before the test lets it: a fault plan that
// must land while a job runs (tests/chaos), a dashboard that must see a job part-way, a deadline
// that must find a job unfinished. Progress-driven tests use it instead of racing the wall clock.
//
// It heartbeats its task every 250 ms on a thread of its own (through server restarts: it
// registers again when told to); should the watchdog take the task away all the same (a store
// restart can outlast a lease), it leases another if there is one. Release hands the task back as
// preempted (not a failure of the task; a real executor runs it), or finds it taken away already
// (the cancel not yet heard); the holder goes on heartbeating, idle, until it is destroyed, so it
// counts as a live executor as long as the test holds it.
// It enrols as executors do: with a join token of one use it issues itself through the Admin
// service (the connection must carry an admin token, as a ProcessPool's does), then makes every
// call with the credential it was given.
// Threads: Hold and Release from the test's thread; the heartbeats run on their own.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "rpc/tls.h"

namespace minions::testing {

class LeaseHolder {
 public:
  explicit LeaseHolder(const cli::Connection& connection) : connection_(connection) {
    auto channel = rpc::OpenChannel(connection.server, connection.tls, rpc::ChannelUse::kExecutor);
    if (channel.ok()) {
      stub_ = v1::Executors::NewStub(*channel);
    } else {
      channel_error_ = channel.status();
    }
  }
  ~LeaseHolder() { Stop(); }

  // Registers and leases one task; then heartbeats it until Release.
  absl::Status Hold() {
    v1::RegisterRequest request;
    v1::Capabilities* caps = request.mutable_capabilities();
    caps->set_name("lease-holder");
    caps->set_os("linux");
    caps->set_memory_bytes(int64_t{64} << 30);
    caps->add_runners("llama");
    caps->set_max_tasks(1);
    register_ = request;
    if (!channel_error_.ok()) return channel_error_;
    // A join token of one use, then enrolment: the credential names this executor.
    v1::IssueTokenRequest join;
    join.set_role("join");
    join.set_principal("lease-holder");
    join.set_uses(1);
    auto issued = cli::RemoteAdmin(connection_)->IssueToken(join);
    if (!issued.ok()) return issued.status();
    v1::EnrolRequest enrol;
    *enrol.mutable_capabilities() = *caps;
    v1::EnrolResponse enrolled;
    grpc::ClientContext context;
    rpc::Prepare(context, issued->token());
    if (auto s = rpc::FromGrpc(stub_->Enrol(&context, enrol, &enrolled)); !s.ok()) return s;
    credential_ = enrolled.credential();
    register_.set_executor_id(enrolled.executor_id());
    if (!LeaseOne()) return absl::FailedPreconditionError("the lease holder got no task");
    heartbeats_ = std::thread([this] { Heartbeats(); });
    return absl::OkStatus();
  }

  int64_t held_records() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return held_records_;
  }

  // Hands the task back (preempted); no task is leased after that.
  absl::Status Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
    if (!held_) return absl::OkStatus();
    v1::FailRequest request;
    request.set_executor_id(register_.executor_id());
    *request.mutable_ref() = *held_;
    request.set_failure_class("preempted");
    request.set_message("the test's hold ends");
    absl::Status last;
    bool maybe_reached = false;  // an earlier try may have been done, its answer lost
    for (int i = 0; i < 50; ++i) {  // the server may be restarting
      maybe_reached = maybe_reached || absl::IsUnavailable(last);
      v1::FailResponse reply;
      grpc::ClientContext context;
      rpc::Prepare(context, credential_);
      last = rpc::FromGrpc(stub_->Fail(&context, request, &reply));
      if (last.ok() || !absl::IsUnavailable(last)) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    held_.reset();
    // The server refuses a stale attempt: the watchdog took the task away (a fault outlasted its
    // lease) and the cancel had not reached the heartbeats yet. The hold is over all the same.
    if (absl::IsFailedPrecondition(last)) {
      if (!maybe_reached) ++taken_away_;  // else it may be our own earlier Fail the server refuses
      return absl::OkStatus();
    }
    return last;
  }

  int taken_away() const { return taken_away_.load(); }

 private:
  bool LeaseOne() ABSL_LOCKS_EXCLUDED(mu_) {
    v1::LeaseRequest request;
    request.set_executor_id(register_.executor_id());
    request.set_max_tasks(1);
    v1::LeaseResponse reply;
    grpc::ClientContext context;
    rpc::Prepare(context, credential_);
    if (!stub_->Lease(&context, request, &reply).ok() || reply.leases_size() == 0) return false;
    absl::MutexLock lock(&mu_);
    if (released_) {  // too late: hand it straight back
      v1::FailRequest back;
      back.set_executor_id(register_.executor_id());
      *back.mutable_ref() = reply.leases(0).ref();
      back.set_failure_class("preempted");
      v1::FailResponse answer;
      grpc::ClientContext again;
      rpc::Prepare(again, credential_);
      (void)stub_->Fail(&again, back, &answer);
      return false;
    }
    held_ = reply.leases(0).ref();
    held_records_ = reply.leases(0).n_records();
    return true;
  }

  void Heartbeats() {
    while (!stop_.load()) {
      absl::SleepFor(absl::Milliseconds(250));
      v1::HeartbeatRequest request;
      {
        absl::MutexLock lock(&mu_);
        request.set_executor_id(register_.executor_id());
        request.set_state(held_ ? "busy" : "available");
        if (held_) *request.add_leases() = *held_;
      }
      v1::HeartbeatResponse reply;
      grpc::ClientContext context;
      rpc::Prepare(context, credential_, absl::Seconds(5));
      if (!stub_->Heartbeat(&context, request, &reply).ok()) continue;  // the server is restarting
      if (reply.reregister()) {
        v1::RegisterResponse registered;
        grpc::ClientContext again;
        rpc::Prepare(again, credential_);
        (void)stub_->Register(&again, register_, &registered);
      }
      if (reply.cancel_size() > 0) {
        ++taken_away_;
        {
          absl::MutexLock lock(&mu_);
          held_.reset();
        }
        LeaseOne();
      }
    }
  }

  void Stop() {
    stop_ = true;
    if (heartbeats_.joinable()) heartbeats_.join();
  }

  const cli::Connection connection_;
  std::unique_ptr<v1::Executors::Stub> stub_;
  absl::Status channel_error_;     // why there is no stub (a CA that cannot be read)
  std::string credential_;        // this executor's, from its enrolment (set before the heartbeats start)
  v1::RegisterRequest register_;  // with the id the server gave
  mutable absl::Mutex mu_;
  std::optional<v1::LeaseRef> held_ ABSL_GUARDED_BY(mu_);
  int64_t held_records_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stop_{false};
  std::atomic<int> taken_away_{0};
  std::thread heartbeats_;
};

}  // namespace minions::testing
