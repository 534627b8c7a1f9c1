#pragma once
// The fleet simulator's simulated executors (minions-bench-fleet, fleet_sim.cc): a Fleet of
// executors that speak the real executor protocol over gRPC (Register, an Attach presence stream,
// heartbeats, long-poll Leases, Complete) and run each leased task with a fake runner, with the
// timer thread and the small work queue they run on.
//
// Threads: gRPC's callback threads drive the calls; one timer thread fires heartbeats and task
// ends; Workers' threads do the fake runner's file I/O. Add/Start/Stop come from one thread.

#include <atomic>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "executor/blob_client.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "runner/batch_record.h"

namespace minions::bench::fleet_sim {

namespace v1 = minions::v1;

// --- a timer thread: runs callbacks at their time ---

class Timer {
 public:
  Timer() : thread_([this] { Loop(); }) {}
  ~Timer() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  void At(absl::Time when, std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push(Entry{when, seq_++, std::move(fn)});
  }

 private:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return done_ || (!queue_.empty() && queue_.top().when <= absl::Now());
        };
        const absl::Time wake = queue_.empty() ? absl::Now() + absl::Milliseconds(50) : queue_.top().when;
        mu_.AwaitWithDeadline(absl::Condition(&due), std::min(wake, absl::Now() + absl::Milliseconds(50)));
        if (done_) return;
        if (queue_.empty() || queue_.top().when > absl::Now()) continue;
        fn = std::move(const_cast<Entry&>(queue_.top()).fn);
        queue_.pop();
      }
      fn();
    }
  }
  absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// --- a small work queue for the fake runner's file I/O ---

class Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Workers() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  void Post(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// --- the fleet ---

struct SimOptions {
  absl::Duration ttl = absl::Seconds(9);
  absl::Duration lease_wait = absl::Seconds(30);
  absl::Duration task_time = absl::Milliseconds(200);
  // Each task runs task_time x (1 +- up to this): 0, every task alike (a job's tasks that start
  // together end together); real tasks' times vary with their records and their machines.
  double task_spread = 0;
  // Idle polls stand for idle beats when the server says they do (as the executor); false: the
  // simulated executors beat at the idle pace whatever the server says (the older protocol).
  bool idle_polls = true;
  // Heartbeats on a Beats stream (as the executor); false: a Heartbeat call each (older executors).
  bool beat_stream = true;
};

// What the simulated executors measured, for one phase.
struct Samples {
  std::vector<double> heartbeat_ms;
  std::vector<absl::Time> heartbeat_at;  // when each of them was answered
  std::vector<double> lease_ms;       // Lease calls that got a task: call to reply
  std::vector<absl::Time> leased_at;  // when each task lease arrived
  int64_t heartbeats_failed = 0;
  int64_t beats_unsent = 0;           // idle beats left unsent: an idle poll spoke for them
  int64_t leases_lost = 0;            // heartbeats answering "cancel" for a lease still held
  int64_t cancels_done = 0;           // ... for a lease the executor completed since it sent the beat
                                      // (no loss, unless its completion failed: complete_failed)
  int64_t completed = 0;
  int64_t complete_failed = 0;
};

class Fleet {
 public:
  Fleet(SimOptions options, int run_threads) : options_(options), workers_(run_threads) {}
  ~Fleet() { Stop(); }

  class BeatStreamer;
  struct Executor {
    int index = 0;
    std::string id;
    std::string credential;
    v1::Executors::Stub* stub = nullptr;
    absl::Mutex mu;
    std::vector<v1::LeaseRef> held ABSL_GUARDED_BY(mu);  // leased, not yet completed (heartbeats report them)
    std::deque<v1::TaskLease> queued ABSL_GUARDED_BY(mu);  // leased, not yet started
    bool running ABSL_GUARDED_BY(mu) = false;             // the fake runner has a task
    bool leasing ABSL_GUARDED_BY(mu) = false;             // a Lease call is in flight
    bool idle_poll ABSL_GUARDED_BY(mu) = false;           // ... and it is an idle poll (LeaseRequest.idle)
    absl::Time idle_poll_answered ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    absl::Time next_beat ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();  // the beat scheduled next
    int beat_generation ABSL_GUARDED_BY(mu) = 0;          // a scheduled beat of an older one is dropped
    std::unique_ptr<grpc::ClientContext> attach_context;
    BeatStreamer* beats ABSL_GUARDED_BY(mu) = nullptr;  // its Beats stream, while one is open
    std::mt19937 random ABSL_GUARDED_BY(mu);              // its tasks' times (SimOptions::task_spread)
  };

  void AddStub(std::unique_ptr<v1::Executors::Stub> stub) { stubs_.push_back(std::move(stub)); }
  v1::Executors::Stub* StubFor(int i) { return stubs_[static_cast<size_t>(i) % stubs_.size()].get(); }

  Executor& Add(int index, std::string id, std::string credential) {
    executors_.push_back(std::make_unique<Executor>());
    Executor& e = *executors_.back();
    e.index = index;
    e.id = std::move(id);
    e.credential = std::move(credential);
    e.stub = StubFor(index);
    absl::MutexLock lock(&e.mu);
    e.random.seed(static_cast<uint32_t>(index));
    return e;
  }

  // Register, attach, lease and heartbeat every executor (heartbeats spread over one period).
  void Start() {
    // Seeded by the worker's first executor: workers' beats spread apart, not in step.
    std::mt19937 random(42 + static_cast<uint32_t>(executors_.empty() ? 0 : executors_.front()->index));
    for (auto& owned : executors_) {
      Executor* e = owned.get();
      Register(e, [this, e, phase = std::uniform_real_distribution<double>(0, 1)(random)] {
        Attach(e);
        Lease(e);
        ScheduleBeat(e, absl::Now() + IdleBeat() * phase);
      });
    }
  }

  void Stop() {
    stopping_ = true;
    for (auto& e : executors_) {
      if (e->attach_context) e->attach_context->TryCancel();
      absl::MutexLock lock(&e->mu);
      if (e->beats != nullptr) e->beats->Cancel();
    }
    // Every call in flight ends (the server is gone or the call was cancelled) before the fleet goes.
    for (int i = 0; i < 600 && in_flight_.load() > 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  }

  // Starts a phase's samples; Take ends it.
  // Lease latency counts from the phase's start at the earliest: a long poll begun while the
  // fleet was idle waited for the work, not for the server.
  void Measure() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    samples_ = Samples{};
    measured_from_ = absl::Now();
  }
  Samples Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Samples out = std::move(samples_);
    samples_ = Samples{};
    return out;
  }
  int registered() const { return registered_.load(); }
  int attached() const { return attached_.load(); }

 private:
  template <typename Reply>
  struct Call {
    grpc::ClientContext context;
    Reply reply;
    absl::Time start = absl::Now();
  };

  void Register(Executor* e, std::function<void()> then) {
    auto* call = new Call<v1::RegisterResponse>;
    auto* request = new v1::RegisterRequest;
    request->set_executor_id(e->id);
    FillCapabilities(e->index, request->mutable_capabilities());
    minions::rpc::Prepare(call->context, e->credential);
    ++in_flight_;
    e->stub->async()->Register(&call->context, request, &call->reply,
                               [this, e, call, request, then = std::move(then)](grpc::Status s) {
                                 const int64_t idle_beat_ms = call->reply.idle_heartbeat_ms();
                                 const bool polls_renew = call->reply.idle_polls_renew();
                                 delete request;
                                 delete call;
                                 if (s.ok()) {
                                   ++registered_;
                                   idle_beat_ms_ = idle_beat_ms;
                                   polls_renew_ = polls_renew && options_.idle_polls;
                                   then();
                                 } else if (!stopping_) {
                                   timer_.At(absl::Now() + absl::Seconds(1),
                                             [this, e, then] { Register(e, then); });
                                 }
                                 --in_flight_;
                               });
  }

  // The presence stream: held open for as long as the executor runs.
  class AttachReader : public grpc::ClientReadReactor<v1::AttachEvent> {
   public:
    AttachReader(Fleet* fleet, Executor* e) : fleet_(fleet) {
      request_.set_executor_id(e->id);
      minions::rpc::Prepare(*e->attach_context, e->credential, absl::InfiniteDuration());
      e->stub->async()->Attach(e->attach_context.get(), &request_, this);
      StartRead(&event_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      if (!counted_) {
        counted_ = true;
        ++fleet_->attached_;
      }
      StartRead(&event_);
    }
    void OnDone(const grpc::Status&) override {
      if (counted_) --fleet_->attached_;
      Fleet* fleet = fleet_;
      delete this;
      --fleet->in_flight_;
    }

   private:
    Fleet* fleet_;
    v1::AttachRequest request_;
    v1::AttachEvent event_;
    bool counted_ = false;
  };

  void Attach(Executor* e) {
    e->attach_context = std::make_unique<grpc::ClientContext>();
    ++in_flight_;
    new AttachReader(this, e);
  }

  // As the executor: every third of the TTL while it holds leases; while it holds none, as often
  // as the server said at registration (two thirds of the TTL if it said nothing).
  absl::Duration IdleBeat() const {
    const int64_t ms = idle_beat_ms_.load();
    return ms > 0 ? std::max(absl::Milliseconds(ms), options_.ttl / 3) : options_.ttl * 2 / 3;
  }
  absl::Duration BeatPeriod(Executor* e) {
    absl::MutexLock lock(&e->mu);
    return e->held.empty() ? IdleBeat() : options_.ttl / 3;
  }

  // The next beat at `at`, replacing the one scheduled.
  void ScheduleBeat(Executor* e, absl::Time at) {
    int generation;
    {
      absl::MutexLock lock(&e->mu);
      e->next_beat = at;
      generation = ++e->beat_generation;
    }
    timer_.At(at, [this, e, generation] {
      {
        absl::MutexLock lock(&e->mu);
        if (generation != e->beat_generation) return;  // replaced by a sooner one
      }
      Heartbeat(e);
    });
  }

  // As the executor: an idle beat stays unsent while the server renews it from its idle poll (one
  // stands, or was answered a moment ago); it says nothing new (always "available", no holdings).
  bool PollSpeaksFor(Executor* e, absl::Time now) {
    if (!polls_renew_) return false;
    absl::MutexLock lock(&e->mu);
    return e->held.empty() && (e->idle_poll || now - e->idle_poll_answered < IdleBeat() / 2);
  }

  // (public: Executor names it)
 public:
  // As the executor: heartbeats on a Beats stream, one at a time (one due while another is in
  // flight is sent once that one is answered). A stream that ends fails the beats it had and is
  // opened again at the next beat. It deletes itself when gRPC is done with it, having taken
  // itself from its executor first.
  class BeatStreamer : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
   public:
    using Answer = std::function<void(const grpc::Status&, const v1::HeartbeatResponse&)>;
    BeatStreamer(Fleet* fleet, Executor* e) : fleet_(fleet), e_(e) {
      minions::rpc::Prepare(context_, e->credential, absl::InfiniteDuration());
      e->stub->async()->Beats(&context_, this);
      StartCall();
    }
    // Sends `request` when the beats before it are answered.
    void Send(v1::HeartbeatRequest request, Answer answer) {
      absl::MutexLock lock(&mu_);
      queue_.push_back({std::move(request), std::move(answer)});
      StartNextLocked();
    }
    void Cancel() { context_.TryCancel(); }

    void OnReadDone(bool ok) override {
      Pending answered;
      v1::HeartbeatResponse reply;
      {
        absl::MutexLock lock(&mu_);
        if (!ok) {
          broken_ = true;  // OnDone fails what waits
          return;
        }
        answered = std::move(queue_.front());
        queue_.pop_front();
        reply = std::move(reply_);  // before the next read refills it
        reading_ = false;
        StartNextLocked();
      }
      answered.answer(grpc::Status::OK, reply);
    }
    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        broken_ = true;  // OnDone fails what waits
        return;
      }
      StartNextLocked();
    }
    void OnDone(const grpc::Status& status) override {
      {
        absl::MutexLock lock(&e_->mu);
        if (e_->beats == this) e_->beats = nullptr;
      }
      std::deque<Pending> failed;
      {
        absl::MutexLock lock(&mu_);
        failed.swap(queue_);
      }
      const grpc::Status why = status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended") : status;
      for (Pending& p : failed) p.answer(why, v1::HeartbeatResponse());
      Fleet* fleet = fleet_;
      delete this;
      --fleet->in_flight_;
    }

   private:
    struct Pending {
      v1::HeartbeatRequest request;
      Answer answer;
    };
    // The front beat, once the one before it is answered and its write done (one write at a time).
    void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (broken_ || reading_ || writing_ || queue_.empty()) return;
      reading_ = writing_ = true;
      request_ = queue_.front().request;
      StartRead(&reply_);
      StartWrite(&request_);
    }
    Fleet* const fleet_;
    Executor* const e_;
    grpc::ClientContext context_;
    v1::HeartbeatRequest request_;
    v1::HeartbeatResponse reply_;
    absl::Mutex mu_;
    std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);  // front: written, waiting for its answer
    bool broken_ ABSL_GUARDED_BY(mu_) = false;
    bool reading_ ABSL_GUARDED_BY(mu_) = false;  // the front beat's answer is awaited
    bool writing_ ABSL_GUARDED_BY(mu_) = false;  // a write is outstanding
  };

 private:
  void Heartbeat(Executor* e) {
    if (stopping_) return;
    const absl::Time due = absl::Now();
    if (PollSpeaksFor(e, due)) {
      {
        absl::MutexLock lock(&mu_);
        ++samples_.beats_unsent;
      }
      ScheduleBeat(e, due + BeatPeriod(e));
      return;
    }
    auto* call = new Call<v1::HeartbeatResponse>;
    auto* request = new v1::HeartbeatRequest;
    request->set_executor_id(e->id);
    {
      absl::MutexLock lock(&e->mu);
      request->set_state(e->held.empty() ? "available" : "busy");
      for (const auto& ref : e->held) *request->add_leases() = ref;
    }
    if (options_.beat_stream) {
      const absl::Time start = absl::Now();
      ++in_flight_;
      absl::MutexLock lock(&e->mu);
      if (stopping_) {  // Stop may have passed this executor already: no stream it would not cancel
        --in_flight_;
        delete request;
        delete call;
        return;
      }
      if (e->beats == nullptr) {
        ++in_flight_;  // the stream's own, until its OnDone
        e->beats = new BeatStreamer(this, e);
      }
      e->beats->Send(std::move(*request), [this, e, start, due](const grpc::Status& s, const v1::HeartbeatResponse& reply) {
        Answered(e, s, reply, absl::ToDoubleMilliseconds(absl::Now() - start), due);
        --in_flight_;
      });
      delete request;
      delete call;
      return;
    }
    minions::rpc::Prepare(call->context, e->credential, absl::Seconds(30));
    ++in_flight_;
    e->stub->async()->Heartbeat(&call->context, request, &call->reply, [this, e, call, request, due](grpc::Status s) {
      Answered(e, s, call->reply, absl::ToDoubleMilliseconds(absl::Now() - call->start), due);
      delete request;
      delete call;
      --in_flight_;
    });
  }

  // A heartbeat's answer (`ms` after it was sent): sampled; the next one scheduled.
  void Answered(Executor* e, const grpc::Status& s, const v1::HeartbeatResponse& reply, double ms, absl::Time due) {
    // A cancel for a lease the executor completed while the beat was on its way (the server saw
    // the completion first) loses nothing; one for a lease it still holds is a lease lost.
    int64_t lost = 0;
    if (s.ok() && reply.cancel_size() > 0) {
      absl::MutexLock lock(&e->mu);
      for (const v1::LeaseRef& cancel : reply.cancel()) {
        lost += std::any_of(e->held.begin(), e->held.end(), [&](const v1::LeaseRef& held) {
          return held.job_id() == cancel.job_id() && held.task_index() == cancel.task_index() &&
                 held.attempt() == cancel.attempt();
        });
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (s.ok()) {
        samples_.heartbeat_ms.push_back(ms);
        samples_.heartbeat_at.push_back(absl::Now());
        samples_.leases_lost += lost;
        samples_.cancels_done += reply.cancel_size() - lost;
      } else {
        ++samples_.heartbeats_failed;
      }
    }
    if (s.ok() && reply.reregister()) Register(e, [] {});
    if (!stopping_) ScheduleBeat(e, due + BeatPeriod(e));
  }

  // The executor's prefetch window (ExecutorAgent::PrefetchWindow): enough tasks to cover half a
  // second beyond the one running, at least 2, at most 32.
  int Window() const {
    const double want = 1 + 0.5 / std::max(absl::ToDoubleSeconds(options_.task_time), 1e-3);
    return std::clamp(static_cast<int>(std::ceil(want)), 2, 32);
  }

  // As the executor: asks for what its window has free once half of it is, long-polling only when
  // it holds nothing. One Lease call at a time.
  void Lease(Executor* e) {
    if (stopping_) return;
    int want = 0;
    bool idle = false;
    {
      absl::MutexLock lock(&e->mu);
      const int held = static_cast<int>(e->held.size());
      if (e->leasing || held > Window() / 2) return;
      e->leasing = true;
      want = Window() - held;
      idle = held == 0;
    }
    auto* call = new Call<v1::LeaseResponse>;
    auto* request = new v1::LeaseRequest;
    request->set_executor_id(e->id);
    request->set_max_tasks(want);
    if (idle) request->set_wait_ms(absl::ToInt64Milliseconds(options_.lease_wait));
    request->set_idle(idle && polls_renew_);
    {
      absl::MutexLock lock(&e->mu);
      e->idle_poll = request->idle();
    }
    minions::rpc::Prepare(call->context, e->credential, options_.lease_wait + absl::Seconds(30));
    ++in_flight_;
    e->stub->async()->Lease(&call->context, request, &call->reply, [this, e, call, request, idle](grpc::Status s) {
      const absl::Time now = absl::Now();
      {
        absl::MutexLock lock(&e->mu);
        e->leasing = false;
        if (e->idle_poll && s.ok()) e->idle_poll_answered = now;
        e->idle_poll = false;
      }
      if (s.ok() && call->reply.reregister()) {
        Register(e, [this, e] { Lease(e); });
      } else if (!s.ok()) {
        if (!stopping_) timer_.At(now + absl::Seconds(1), [this, e] { Lease(e); });
      } else if (call->reply.leases_size() == 0) {
        if (idle) Lease(e);  // the long poll ended empty; a busy one asks again after its next task
      } else {
        {
          absl::MutexLock lock(&mu_);
          samples_.lease_ms.push_back(absl::ToDoubleMilliseconds(now - std::max(call->start, measured_from_)));
          for (int i = 0; i < call->reply.leases_size(); ++i) samples_.leased_at.push_back(now);
        }
        {
          absl::MutexLock lock(&e->mu);
          for (const v1::TaskLease& lease : call->reply.leases()) {
            e->held.push_back(lease.ref());
            e->queued.push_back(lease);
          }
        }
        // As the executor: an idle executor's next beat may be an idle period away; renew within 1/3.
        bool sooner;
        {
          absl::MutexLock lock(&e->mu);
          sooner = e->next_beat > now + options_.ttl / 3;
        }
        if (sooner) ScheduleBeat(e, now + options_.ttl / 3);
        RunNext(e);
      }
      delete request;
      delete call;
      --in_flight_;
    });
  }

  // The fake runner, one task at a time: reads the records, waits the task time, writes one output
  // line per record to chunk 0 and completes; then the next queued task.
  void RunNext(Executor* e) {
    v1::TaskLease lease;
    absl::Duration task_time = options_.task_time;
    {
      absl::MutexLock lock(&e->mu);
      if (e->running || e->queued.empty()) return;
      e->running = true;
      lease = std::move(e->queued.front());
      e->queued.pop_front();
      if (options_.task_spread > 0) {
        task_time *= 1 + std::uniform_real_distribution<double>(-options_.task_spread, options_.task_spread)(e->random);
      }
    }
    ++in_flight_;
    timer_.At(absl::Now() + task_time, [this, e, lease] {
      workers_.Post([this, e, lease] {
        absl::Status written = WriteOutput(lease);
        if (!written.ok()) fprintf(stderr, "fake runner: %s\n", std::string(written.message()).c_str());
        {
          absl::MutexLock lock(&e->mu);
          e->running = false;
        }
        Complete(e, lease.ref(), lease.n_records());
        RunNext(e);
        --in_flight_;
      });
    });
  }

  absl::Status WriteOutput(const v1::TaskLease& lease) {
    if (lease.chunk_urls_size() == 0) return absl::FailedPreconditionError("the lease has no chunk URLs");
    auto input = blobs_.GetRange(lease.input_url(), lease.byte_begin(), lease.byte_end());
    if (!input.ok()) return input.status();
    std::string output;
    std::vector<std::string> records = minions::SplitRecordLines(*input);
    for (int64_t i = lease.resume_from(); i < static_cast<int64_t>(records.size()); ++i) {
      auto parsed = minions::ParseRecordLine(records[static_cast<size_t>(i)]);
      absl::StrAppend(&output, minions::MakeResponseLine(parsed.custom_id, minions::Json::object()).dump(), "\n");
    }
    return blobs_.Put(lease.chunk_urls(0).output_url(), output);
  }

  void Complete(Executor* e, v1::LeaseRef ref, int64_t n_records) {
    // Done: no longer reported in heartbeats (as the executor does once it completes).
    {
      absl::MutexLock lock(&e->mu);
      auto& held = e->held;
      held.erase(std::remove_if(held.begin(), held.end(),
                                [&](const v1::LeaseRef& r) {
                                  return r.job_id() == ref.job_id() && r.task_index() == ref.task_index();
                                }),
                 held.end());
    }
    auto* call = new Call<v1::CompleteResponse>;
    auto* request = new v1::CompleteRequest;
    request->set_executor_id(e->id);
    ref.set_records_done(n_records);
    *request->mutable_ref() = ref;
    minions::rpc::Prepare(call->context, e->credential);
    ++in_flight_;
    e->stub->async()->Complete(&call->context, request, &call->reply, [this, e, call, request](grpc::Status s) {
      {
        absl::MutexLock lock(&mu_);
        if (s.ok()) {
          ++samples_.completed;
        } else {
          ++samples_.complete_failed;
          if (samples_.complete_failed <= 3) fprintf(stderr, "complete: %s\n", s.error_message().c_str());
        }
      }
      delete request;
      delete call;
      Lease(e);  // its window may have room now
      --in_flight_;
    });
  }

  static void FillCapabilities(int index, v1::Capabilities* caps) {
    caps->set_name(absl::StrCat("sim-", index));
    caps->set_os("linux");
    caps->set_memory_bytes(int64_t{64} << 30);
    caps->add_runners("llama");
    caps->set_max_tasks(32);  // as the executor: its most tasks held at once (max_prefetch)
    caps->set_accelerator("cpu");
  }

  SimOptions options_;
  std::vector<std::unique_ptr<v1::Executors::Stub>> stubs_;
  std::vector<std::unique_ptr<Executor>> executors_;
  minions::UrlBlobClient blobs_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int> registered_{0};
  std::atomic<int64_t> idle_beat_ms_{0};  // the server's idle heartbeat, from a Register answer
  std::atomic<bool> polls_renew_{false};   // ... and whether its idle polls stand for idle beats
  std::atomic<int> attached_{0};
  absl::Mutex mu_;
  Samples samples_ ABSL_GUARDED_BY(mu_);
  absl::Time measured_from_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Workers workers_;  // after the timer goes (its callbacks post here)
  Timer timer_;
};

}  // namespace minions::bench::fleet_sim
