// minions-bench-fleet: the fleet simulator (issue 15). N simulated executors in a few worker
// processes this program starts (--procs; one per 2,500 executors by default), each executor
// speaking the real executor protocol over gRPC to one real `minions server` (SQLite, or a
// private PostgreSQL cluster this program starts): enrolment with a join token, Register, an
// Attach presence stream held open, a heartbeat (on a Beats stream; --beat-stream false: a
// Heartbeat call each) every TTL/3 while it holds a lease and, while it
// holds none, as often as the server says at registration (1.5 TTL by default; a lease brings the
// next one forward), and long-poll Leases (wait --lease-wait-ms, 30 s, as the
// executor's defaults). Like the executor, it leases a prefetch window of tasks (enough for half a
// second beyond the running one: 6 of 100 ms; at least 2) and asks for more once half of it is
// free. Each leased task is run, one at a time, by a fake runner: its input
// range is read through the lease's URL, it "runs" for --task-ms, and one output line per record
// is written to the attempt's chunk URL before the task is completed, as a real executor does
// (the server checks the chunk). Each point of the fleet size runs two phases:
//   idle   the fleet waits with no work for --idle-s seconds (after --warmup-s)
//   job    one job of --job-tasks one-record tasks is submitted; measured until it completes
// and reports, per phase: heartbeat latency p50/p99 (client side, call to reply), lease latency
// p50/p99 (Lease calls that got a task: call, or the phase's start if later, to reply; and submit
// to the first lease), tasks per
// second, the server's CPU (share of one core) and RSS, the store's CPU (PostgreSQL's processes;
// SQLite runs inside the server) and PostgreSQL's transactions per second (pg_stat_database).
// --server-arg passes an option to the server (repeatable) and --label names the run, so that
// two settings can run side by side, interleaved by the caller (docs/benchmarks.md).
//
//   minions-bench-fleet --executors 100 1000 3000 --store sqlite postgres [--ttl-ms 9000]
//                       [--channels 0] [--idle-s 18] [--job-tasks 2000] [--task-ms 200]
//
// Each simulated executor has a gRPC channel (one TCP connection) of its own unless --channels
// caps them (then executors share channels round-robin). Mind `ulimit -n`: the server and each
// worker hold one descriptor per connection.
// Threads (in each worker): gRPC's callback threads drive the calls; one timer thread fires
// heartbeats and task ends; --run-threads threads do the fake runner's file I/O. The parent
// starts the server and PostgreSQL, submits the job and merges the workers' samples.

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cmath>
#include <deque>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <libpq-fe.h>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench_util.h"
#include "cli/admin_verbs.h"
#include "cli/client_verbs.h"
#include "cli/credentials.h"
#include "executor/blob_client.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "runner/batch_record.h"
#include "testing/http_get.h"
#include "testing/process_pool.h"
#include "testing/prometheus_text.h"

namespace {

namespace fs = std::filesystem;
using minions::Subprocess;
using minions::bench::BinDir;
using minions::bench::CpuSeconds;
namespace v1 = minions::v1;

// --- measurement helpers ---

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Resident memory of a process in MiB (VmRSS), 0 when unknown.
double RssMiB(pid_t pid) {
  std::string status = minions::bench::Slurp(absl::StrCat("/proc/", pid, "/status"));
  auto at = status.find("VmRSS:");
  if (at == std::string::npos) return 0;
  return std::stod(status.substr(at + 6)) / 1024.0;
}

// The CPU seconds all cores of this machine have spent busy so far (/proc/stat: all but idle and iowait).
double MachineCpuSeconds() {
  std::string stat = minions::bench::Slurp("/proc/stat");
  unsigned long long v[10] = {};
  if (sscanf(stat.c_str(), "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
             &v[6], &v[7]) < 8) {
    return 0;
  }
  const double busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);  // not idle (3), iowait (4)
  return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The CPU seconds of a process and all its children (PostgreSQL's postmaster and backends), per
// pid, so that a delta counts backends that started in between.
std::map<pid_t, double> TreeCpu(pid_t root) {
  std::map<pid_t, double> cpu;
  if (root <= 0) return cpu;
  cpu[root] = CpuSeconds(root);
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return cpu;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::string stat = minions::bench::Slurp(absl::StrCat("/proc/", pid, "/stat"));
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (sscanf(stat.c_str() + close + 2, "%c %ld", &state, &ppid) == 2 && ppid == root) {
      cpu[static_cast<pid_t>(pid)] = CpuSeconds(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  return cpu;
}

double CpuDelta(const std::map<pid_t, double>& before, const std::map<pid_t, double>& after) {
  double total = 0;
  for (const auto& [pid, seconds] : after) {
    auto it = before.find(pid);
    total += seconds - (it == before.end() ? 0 : it->second);
  }
  return total;
}

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

// --- the server and its store ---

struct Flags {
  std::vector<int> executors = {100, 1000};
  std::vector<std::string> stores = {"sqlite", "postgres"};
  int64_t ttl_ms = 9000;
  int64_t lease_wait_ms = 30000;
  bool idle_polls = true;
  bool beat_stream = true;
  int channels = 0;
  double warmup_s = 0;  // 0: one TTL
  double idle_s = 18;
  double window_s = 10;  // the heartbeat tail of a long phase, by window of this many seconds
  int job_tasks = 2000;
  int64_t task_ms = 200;
  double task_spread = 0;
  int run_threads = 4;
  int enrol_threads = 8;
  int procs = 0;  // processes of simulated executors; 0: one per kExecutorsPerProcess
  bool pg_waits = false;  // sample pg_stat_activity in the job phase (PgWaitSampler)
  std::string dir;
  std::string label = "default";
  std::vector<std::string> server_args;
  // A worker (--worker): executors [first, first + count) of the fleet, against `server`.
  bool worker = false;
  std::string server;
  int first = 0;
  int count = 0;
};

constexpr int kExecutorsPerProcess = 2500;

// --- the fleet in several processes ---
//
// RunPoint starts --procs workers (this program with --worker), each simulating a slice of the
// fleet in a Fleet of its own, and speaks to each over its stdin and stdout, a line at a time:
//   parent "token T"   worker enrols its executors with join token T, answers "enrolled" ("failed
//                      WHY" and exits when it cannot)
//   parent "start"     (once every worker has enrolled) worker registers, attaches and starts its
//                      executors, answers "ready"
//   parent "measure"   worker starts its samples (Fleet::Measure), answers "ok"
//   parent "take"      worker answers its samples (SamplesText) and "end"
//   parent "stop", or the end of its stdin: the worker ends its calls and exits.
// The samples' times are wall-clock times, which every process here shares.

std::string SamplesText(const Samples& s) {
  std::string out = absl::StrCat("counts ", s.heartbeats_failed, " ", s.beats_unsent, " ", s.leases_lost, " ",
                                 s.cancels_done, " ",
                                 s.completed, " ", s.complete_failed, "\n");
  for (size_t i = 0; i < s.heartbeat_ms.size(); ++i) {
    absl::StrAppend(&out, "h ", s.heartbeat_ms[i], " ", absl::ToUnixMicros(s.heartbeat_at[i]), "\n");
  }
  for (double ms : s.lease_ms) absl::StrAppend(&out, "l ", ms, "\n");
  for (absl::Time at : s.leased_at) absl::StrAppend(&out, "a ", absl::ToUnixMicros(at), "\n");
  return out + "end\n";
}

// Adds one line of SamplesText to `into`; false for a line it does not know.
bool AddSampleLine(const std::string& line, Samples& into) {
  long long a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
  double ms = 0;
  if (sscanf(line.c_str(), "counts %lld %lld %lld %lld %lld %lld", &a, &b, &c, &d, &e, &f) == 6) {
    into.heartbeats_failed += a;
    into.beats_unsent += b;
    into.leases_lost += c;
    into.cancels_done += d;
    into.completed += e;
    into.complete_failed += f;
  } else if (sscanf(line.c_str(), "h %lf %lld", &ms, &a) == 2) {
    into.heartbeat_ms.push_back(ms);
    into.heartbeat_at.push_back(absl::FromUnixMicros(a));
  } else if (sscanf(line.c_str(), "l %lf", &ms) == 1) {
    into.lease_ms.push_back(ms);
  } else if (sscanf(line.c_str(), "a %lld", &a) == 1) {
    into.leased_at.push_back(absl::FromUnixMicros(a));
  } else {
    return false;
  }
  return true;
}

SimOptions OptionsOf(const Flags& flags) {
  SimOptions options;
  options.ttl = absl::Milliseconds(flags.ttl_ms);
  options.lease_wait = absl::Milliseconds(flags.lease_wait_ms);
  options.idle_polls = flags.idle_polls;
  options.beat_stream = flags.beat_stream;
  options.task_time = absl::Milliseconds(flags.task_ms);
  options.task_spread = flags.task_spread;
  return options;
}

// A worker's life (main with --worker): see above. Exit status 0 after "stop".
int WorkerMain(const Flags& flags) {
  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("token ", 0) != 0) {
    printf("failed no join token on stdin\n");
    return 2;
  }
  const std::string join_token = line.substr(6);
  const int n = flags.count;
  Fleet fleet(OptionsOf(flags), flags.run_threads);
  const int channels = flags.channels > 0 ? std::min(flags.channels, n) : n;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args = minions::rpc::ChannelArgs(minions::rpc::ChannelUse::kExecutor);
    args.SetInt("minions.fleet_sim.channel", i);  // a connection of its own (no shared subchannel)
    fleet.AddStub(v1::Executors::NewStub(
        grpc::CreateCustomChannel(flags.server, grpc::InsecureChannelCredentials(), args)));
  }
  // Enrolment, on a few threads (a fleet does it once; not measured).
  std::vector<std::pair<std::string, std::string>> enrolled(static_cast<size_t>(n));
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> enrolers;
  for (int t = 0; t < flags.enrol_threads; ++t) {
    enrolers.emplace_back([&] {
      for (int i = next++; i < n; i = next++) {
        v1::EnrolRequest request;
        request.mutable_capabilities()->set_name(absl::StrCat("sim-", flags.first + i));
        v1::EnrolResponse reply;
        grpc::ClientContext context;
        minions::rpc::Prepare(context, join_token, absl::Seconds(60));
        grpc::Status s = fleet.StubFor(i)->Enrol(&context, request, &reply);
        if (!s.ok()) {
          if (++failed <= 3) fprintf(stderr, "enrol: %s\n", s.error_message().c_str());
          continue;
        }
        enrolled[static_cast<size_t>(i)] = {reply.executor_id(), reply.credential()};
      }
    });
  }
  for (auto& t : enrolers) t.join();
  if (failed > 0) {
    printf("failed %d executors could not enrol\n", failed.load());
    fflush(stdout);
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    fleet.Add(flags.first + i, enrolled[static_cast<size_t>(i)].first, enrolled[static_cast<size_t>(i)].second);
  }
  // The fleet starts once every worker has enrolled its executors: Enrol is answered by the
  // server's synchronous threads, which a fleet's Register calls, all at once, would exhaust.
  printf("enrolled\n");
  fflush(stdout);
  if (!std::getline(std::cin, line) || line != "start") return 0;
  fleet.Start();
  for (int i = 0; i < 1200 && (fleet.registered() < n || fleet.attached() < n); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (fleet.registered() < n || fleet.attached() < n) {
    fprintf(stderr, "worker of executors %d-%d: %d registered and %d attached of %d after 60 s; measuring anyway\n",
            flags.first, flags.first + n - 1, fleet.registered(), fleet.attached(), n);
  }
  printf("ready\n");
  fflush(stdout);
  while (std::getline(std::cin, line) && line != "stop") {
    if (line == "measure") {
      fleet.Measure();
      printf("ok\n");
    } else if (line == "take") {
      const std::string text = SamplesText(fleet.Take());
      fwrite(text.data(), 1, text.size(), stdout);
    } else {
      printf("failed unknown command %s\n", line.c_str());
    }
    fflush(stdout);
  }
  fleet.Stop();
  return 0;
}

// The parent's side: the workers of one point. Threads: one (RunPoint's).
class SimProcesses {
 public:
  ~SimProcesses() { Stop(); }

  // Starts `procs` workers that share `n` executors out, and waits until each is ready.
  absl::Status Start(const Flags& flags, const std::string& server, const std::string& join_token, int n, int procs) {
    for (int p = 0; p < procs; ++p) {
      const int first = n * p / procs, count = n * (p + 1) / procs - first;
      const int channels = flags.channels > 0 ? std::max(1, flags.channels * count / n) : 0;
      minions::Subprocess::Options sp;
      sp.argv = {minions::CurrentExecutablePath(), "--worker", "--server", server, "--first", absl::StrCat(first),
                 "--count", absl::StrCat(count), "--ttl-ms", absl::StrCat(flags.ttl_ms), "--lease-wait-ms",
                 absl::StrCat(flags.lease_wait_ms), "--idle-polls", flags.idle_polls ? "true" : "false",
                 "--beat-stream", flags.beat_stream ? "true" : "false", "--task-ms", absl::StrCat(flags.task_ms),
                 "--task-spread", absl::StrCat(flags.task_spread),
                 "--run-threads", absl::StrCat(flags.run_threads), "--channels", absl::StrCat(channels),
                 "--enrol-threads", absl::StrCat(std::max(2, flags.enrol_threads / procs))};
      auto started = minions::Subprocess::Start(sp);
      if (!started.ok()) return started.status();
      workers_.push_back(std::move(*started));
      if (auto s = workers_.back()->Write(absl::StrCat("token ", join_token, "\n")); !s.ok()) return s;
    }
    for (const char* step : {"enrolled", "ready"}) {
      for (auto& w : workers_) {
        auto line = w->ReadLine(absl::Minutes(5));
        if (!line.ok()) return absl::UnavailableError(absl::StrCat("a worker did not start: ", line.status().message()));
        if (*line != step) return absl::InternalError(absl::StrCat("a worker: ", *line));
      }
      if (std::string(step) == "enrolled") {
        for (auto& w : workers_) {
          if (auto s = w->Write("start\n"); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // Every worker starts its samples.
  bool Measure() { return Ask("measure", [](const std::string& line) { return line == "ok"; }); }

  // Every worker's samples since Measure, merged into `into`.
  bool Take(Samples& into) {
    into = Samples{};
    return Ask("take", [&into](const std::string& line) {
      if (line == "end") return true;
      if (!AddSampleLine(line, into)) fprintf(stderr, "a worker's samples: cannot read \"%s\"\n", line.c_str());
      return false;
    });
  }

  // CPU seconds of this process and its workers so far.
  double CpuSeconds() const {
    double total = minions::bench::CpuSeconds(getpid());
    for (const auto& w : workers_) total += minions::bench::CpuSeconds(w->pid());
    return total;
  }

  void Stop() {
    for (auto& w : workers_) (void)w->Write("stop\n");
    for (auto& w : workers_) {
      if (!w->Wait(absl::Seconds(60)).ok()) w->Signal(SIGKILL);
    }
    workers_.clear();
  }

 private:
  // Sends `command` to every worker (all first, so they answer at once), then reads each one's
  // lines until `last` says its answer is over.
  bool Ask(const std::string& command, const std::function<bool(const std::string&)>& last) {
    for (auto& w : workers_) {
      if (!w->Write(command + "\n").ok()) {
        fprintf(stderr, "a worker is gone (%s)\n", command.c_str());
        return false;
      }
    }
    for (auto& w : workers_) {
      for (;;) {
        auto line = w->ReadLine(absl::Minutes(2));
        if (!line.ok()) {
          fprintf(stderr, "a worker did not answer %s: %s\n", command.c_str(), std::string(line.status().message()).c_str());
          return false;
        }
        if (line->rfind("failed ", 0) == 0) {
          fprintf(stderr, "a worker: %s\n", line->c_str());
          return false;
        }
        if (last(*line)) break;
      }
    }
    return true;
  }

  std::vector<std::unique_ptr<minions::Subprocess>> workers_;
};

// PostgreSQL: a private cluster (tests/services/postgres.sh) in DIR/pg, one database per point.
class Postgres {
 public:
  explicit Postgres(std::string dir) : dir_(std::move(dir)), port_(minions::testing::PickFreePort()) {}
  ~Postgres() {
    std::string out;
    (void)minions::bench::RunProgram({Script(), "stop", dir_}, dir_ + "-stop.log", out);
  }
  absl::Status Start() {
    std::string out;
    return minions::bench::RunProgram({Script(), "start", dir_, absl::StrCat(port_)}, dir_ + "-start.log", out);
  }
  std::string Url(const std::string& db) const { return absl::StrCat("postgresql://postgres@127.0.0.1:", port_, "/", db); }
  absl::Status Exec(const std::string& db, const std::string& sql, std::string* value = nullptr) {
    PGconn* c = PQconnectdb(Url(db).c_str());
    absl::Status status;
    if (PQstatus(c) != CONNECTION_OK) {
      status = absl::UnavailableError(PQerrorMessage(c));
    } else {
      PGresult* r = PQexec(c, sql.c_str());
      if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        status = absl::InternalError(PQresultErrorMessage(r));
      } else if (value != nullptr && PQntuples(r) > 0) {
        *value = PQgetvalue(r, 0, 0);
      }
      PQclear(r);
    }
    PQfinish(c);
    return status;
  }
  // Transactions committed or rolled back in `db` so far (pg_stat_database; flushed about once a second).
  double Transactions(const std::string& db) {
    std::string value;
    if (!Exec(db, absl::StrCat("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '", db, "'"),
              &value)
             .ok() ||
        value.empty()) {
      return -1;
    }
    return std::stod(value);
  }
  pid_t postmaster() const {
    std::string pidfile = minions::bench::Slurp(dir_ + "/data/postmaster.pid");
    return pidfile.empty() ? 0 : static_cast<pid_t>(std::stol(pidfile));
  }

 private:
  static std::string Script() { return std::string(MINIONS_SOURCE_DIR) + "/tests/services/postgres.sh"; }
  std::string dir_;
  int port_;
};

// What PostgreSQL's backends are doing, sampled every 20 ms from pg_stat_activity while a phase
// runs (--pg-waits): each sample is the active statements of `db` with what each waits for
// ("CPU" when it waits for nothing), so a heartbeat tail can be told apart as a lock wait
// (Lock:transactionid, Lock:tuple), the disk (IO, LWLock:WALWrite) or the CPU. A tool for
// finding out, not a figure the issue asks for.
class PgWaitSampler {
 public:
  // `cpu` reads the CPU seconds so far of: the whole machine, the server, the simulator.
  using CpuReader = std::function<std::array<double, 3>()>;
  PgWaitSampler(const std::string& url, const std::string& db, CpuReader cpu) : db_(db), cpu_(std::move(cpu)) {
    conn_ = PQconnectdb(url.c_str());
    if (PQstatus(conn_) != CONNECTION_OK) {
      fprintf(stderr, "--pg-waits: %s", PQerrorMessage(conn_));
      return;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~PgWaitSampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
  }
  // Prints the tally of the samples in [from, to), most frequent first, as the mean number of
  // backends in each state at a sample.
  void Print(const std::string& prefix, absl::Time from, absl::Time to) const {
    std::map<std::string, int64_t> tally;
    int64_t samples = 0;
    const Sample* first = nullptr;
    const Sample* last = nullptr;
    for (const Sample& sample : samples_) {
      if (sample.at < from || sample.at >= to) continue;
      ++samples;
      if (first == nullptr) first = &sample;
      last = &sample;
      for (const std::string& what : sample.active) ++tally[what];
    }
    if (first != nullptr && last != first) {
      const double s = absl::ToDoubleSeconds(last->at - first->at);
      const auto d = [&](int i) { return (last->cpu[i] - first->cpu[i]) / s; };
      printf("%s cores busy: the machine %.2f of %u; the server %.2f; the simulator %.2f; the rest (PostgreSQL, the "
             "kernel, steal) %.2f\n",
             prefix.c_str(), d(0), std::thread::hardware_concurrency(), d(1), d(2), d(0) - d(1) - d(2));
    }
    std::vector<std::pair<int64_t, std::string>> sorted;
    for (const auto& [what, count] : tally) sorted.emplace_back(count, what);
    std::sort(sorted.rbegin(), sorted.rend());
    printf("%s %lld samples of PostgreSQL's active backends (mean per sample):\n", prefix.c_str(),
           static_cast<long long>(samples));
    for (size_t i = 0; i < sorted.size() && i < 12; ++i) {
      printf("%s   %5.2f  %s\n", prefix.c_str(), samples > 0 ? static_cast<double>(sorted[i].first) / samples : 0.0,
             sorted[i].second.c_str());
    }
  }

 private:
  struct Sample {
    absl::Time at;
    std::array<double, 3> cpu;  // CpuReader's
    std::vector<std::string> active;
  };
  void Loop() {
    const std::string sql = absl::StrCat(
        "SELECT CASE WHEN state = 'active' THEN '' ELSE 'in transaction, ' END || "
        "coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') || '  ' || "
        "left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity "
        "WHERE state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid() AND datname = '", db_, "'");
    while (!stop_.load()) {
      Sample sample{absl::Now(), cpu_(), {}};
      PGresult* r = PQexec(conn_, sql.c_str());
      if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        for (int i = 0; i < PQntuples(r); ++i) sample.active.emplace_back(PQgetvalue(r, i, 0));
      } else if (!warned_) {
        warned_ = true;
        fprintf(stderr, "--pg-waits: %s", PQresultErrorMessage(r));
      }
      PQclear(r);
      samples_.push_back(std::move(sample));
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::string db_;
  CpuReader cpu_;
  PGconn* conn_ = nullptr;
  bool warned_ = false;  // the sampler thread's
  std::atomic<bool> stop_{false};
  std::vector<Sample> samples_;  // the sampler thread's until Stop
  std::thread thread_;
};

// The server's own heartbeat times (minions_heartbeat_seconds, scraped from its /metrics): the
// cumulative count of each bucket, by upper bound in seconds (+Inf last).
struct ServerHeartbeats {
  std::vector<std::pair<double, double>> buckets;
  bool ok() const { return !buckets.empty(); }
};

ServerHeartbeats ScrapeServerHeartbeats(const std::string& http, const std::string& token) {
  ServerHeartbeats out;
  minions::testing::HttpReply reply =
      minions::testing::HttpGet(absl::StrCat("http://", http, "/metrics"), 10000, {"Authorization: Bearer " + token});
  if (reply.status != 200) return out;
  for (const auto& [name, value] : minions::testing::ParsePrometheusSamples(reply.body)) {
    const std::string prefix = "minions_heartbeat_seconds_bucket{le=\"";
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string le = name.substr(prefix.size(), name.size() - prefix.size() - 2);
    out.buckets.emplace_back(le == "+Inf" ? HUGE_VAL : std::stod(le), value);
  }
  std::sort(out.buckets.begin(), out.buckets.end());
  return out;
}

// The `q` quantile of the heartbeats answered between two scrapes, as the upper bound (ms) of the
// bucket it falls in (-1: none answered).
double ServerQuantileMs(const ServerHeartbeats& from, const ServerHeartbeats& to, double q) {
  if (!from.ok() || !to.ok() || from.buckets.size() != to.buckets.size()) return -1;
  const double total = to.buckets.back().second - from.buckets.back().second;
  if (total <= 0) return -1;
  for (size_t i = 0; i < to.buckets.size(); ++i) {
    if (to.buckets[i].second - from.buckets[i].second >= q * total) return 1000 * to.buckets[i].first;
  }
  return HUGE_VAL;
}

struct PhaseReport {
  std::string phase;
  double seconds = 0;
  Samples samples;
  double server_cpu = 0;  // cores
  double store_cpu = -1;  // cores; -1: inside the server (SQLite)
  double sim_cpu = 0;     // cores: this simulator's (its clients share the machine with the server)
  double xacts_per_s = -1;
  double server_rss = 0;
  double tasks_per_s = 0;
  double first_lease_ms = -1;
};

// A phase's heartbeat latencies (ms) by window of `window_s` from its first heartbeat's answer.
std::map<int64_t, std::vector<double>> HeartbeatWindows(const Samples& s, double window_s) {
  std::map<int64_t, std::vector<double>> windows;
  if (s.heartbeat_at.empty()) return windows;
  const absl::Time first = *std::min_element(s.heartbeat_at.begin(), s.heartbeat_at.end());
  for (size_t i = 0; i < s.heartbeat_at.size(); ++i) {
    windows[static_cast<int64_t>(absl::ToDoubleSeconds(s.heartbeat_at[i] - first) / window_s)].push_back(s.heartbeat_ms[i]);
  }
  return windows;
}

void Print(const Flags& flags, const std::string& store, int n, const PhaseReport& r) {
  const auto& s = r.samples;
  printf("%-10s %-8s %6d %-5s %6.1f | hb n=%-6zu p50 %7.2f p99 %8.2f fail %lld unsent %lld lost %lld (%lld done) | completions failed %lld | lease n=%-5zu "
         "p50 %7.2f p99 %8.2f first %7.1f | tasks/s %7.1f | server %5.1f%% %6.0f MiB | store %s | xact/s %s | sim %.0f%%\n",
         flags.label.c_str(), store.c_str(), n, r.phase.c_str(), r.seconds, s.heartbeat_ms.size(),
         Percentile(s.heartbeat_ms, 0.5), Percentile(s.heartbeat_ms, 0.99), static_cast<long long>(s.heartbeats_failed),
         static_cast<long long>(s.beats_unsent), static_cast<long long>(s.leases_lost),
         static_cast<long long>(s.cancels_done), static_cast<long long>(s.complete_failed), s.lease_ms.size(), Percentile(s.lease_ms, 0.5),
         Percentile(s.lease_ms, 0.99), r.first_lease_ms, r.tasks_per_s, 100 * r.server_cpu, r.server_rss,
         r.store_cpu < 0 ? "(in server)" : absl::StrCat(static_cast<int>(100 * r.store_cpu + 0.5), "%").c_str(),
         r.xacts_per_s < 0 ? "-" : absl::StrCat(static_cast<int64_t>(r.xacts_per_s + 0.5)).c_str(), 100 * r.sim_cpu);
  // A long phase: where its heartbeat tail is (a storm of leases or completions, or throughout).
  if (r.seconds >= 20 && !s.heartbeat_at.empty()) {
    const auto windows = HeartbeatWindows(s, flags.window_s);
    printf("%-10s %-8s %6d %-5s heartbeats by %g s from the first: n / p50 / p99 ms:", flags.label.c_str(),
           store.c_str(), n, r.phase.c_str(), flags.window_s);
    for (const auto& [w, ms] : windows) printf("  %zu / %.0f / %.0f", ms.size(), Percentile(ms, 0.5), Percentile(ms, 0.99));
    printf("\n");
  }
  fflush(stdout);
}

// The window of Print's (by `window_s` from the first heartbeat) whose heartbeat p99 is highest.
std::optional<std::pair<absl::Time, absl::Time>> WorstWindow(const Samples& s, double window_s) {
  if (s.heartbeat_at.empty()) return std::nullopt;
  const absl::Time first = *std::min_element(s.heartbeat_at.begin(), s.heartbeat_at.end());
  auto windows = HeartbeatWindows(s, window_s);
  int64_t worst = windows.begin()->first;
  for (const auto& [w, ms] : windows) {
    if (Percentile(ms, 0.99) > Percentile(windows[worst], 0.99)) worst = w;
  }
  const absl::Time from = first + absl::Seconds(window_s * static_cast<double>(worst));
  return std::make_pair(from, from + absl::Seconds(window_s));
}

std::string LoadAverage() {
  std::string load = minions::bench::Slurp("/proc/loadavg");
  return load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1));
}

// One point: a fresh server on `store` with `n` simulated executors; prints its phases.
bool RunPoint(const Flags& flags, const std::string& store, int n, Postgres* pg, int point) {
  const std::string dir = absl::StrCat(flags.dir, "/", flags.label, "-", store, "-", n);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string db = absl::StrCat("fleet_", getpid(), "_", point);
  // /metrics on its own port: the server's side of the heartbeat times (ScrapeServerHeartbeats).
  const std::string http = absl::StrCat("127.0.0.1:", minions::testing::PickFreePort());
  std::vector<std::string> argv = {BinDir() + "/minions", "server", "--listen", "", "--http-listen", http,
                                   "--data-dir", dir + "/server", "--lease-ttl-ms", absl::StrCat(flags.ttl_ms)};
  minions::cli::Connection connection;
  connection.server = absl::StrCat("127.0.0.1:", minions::testing::PickFreePort());
  argv[3] = connection.server;
  if (store == "postgres") {
    if (auto s = pg->Exec("postgres", "CREATE DATABASE " + db); !s.ok()) {
      fprintf(stderr, "create database: %s\n", std::string(s.message()).c_str());
      return false;
    }
    argv.insert(argv.end(), {"--database", pg->Url(db)});
  }
  argv.insert(argv.end(), flags.server_args.begin(), flags.server_args.end());
  auto server = minions::bench::SpawnLogged(argv, dir + "/server.log");
  if (!server) return false;
  for (int i = 0; i < 600; ++i) {
    if (connection.token.empty()) {
      auto token = minions::cli::ReadTokenFile(dir + "/server/admin-token");
      if (token.ok()) connection.token = *token;
    }
    if (!connection.token.empty() && minions::cli::JobsClient(connection).List("", 1).ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  v1::IssueTokenRequest join;
  join.set_role("join");
  join.set_principal("fleet-sim");
  join.set_uses(n);
  auto issued = minions::cli::RemoteAdmin(connection)->IssueToken(join);
  if (!issued.ok()) {
    fprintf(stderr, "join token: %s (see %s/server.log)\n", std::string(issued.status().message()).c_str(), dir.c_str());
    return false;
  }

  // The fleet, in --procs processes of its own (a few thousand executors each), more as a fleet's
  // machines are: each has its own gRPC completion queue, timers and threads (a precaution: one
  // process and four measured the same, docs/benchmarks.md "Thirteenth round").
  const int procs =
      std::clamp(flags.procs > 0 ? flags.procs : (n + kExecutorsPerProcess - 1) / kExecutorsPerProcess, 1, std::max(n, 1));
  SimProcesses fleet;
  const absl::Time enrol_start = absl::Now();
  if (auto s = fleet.Start(flags, connection.server, issued->token(), n, procs); !s.ok()) {
    fprintf(stderr, "the simulated fleet: %s (see %s/server.log)\n", std::string(s.message()).c_str(), dir.c_str());
    return false;
  }
  fprintf(stderr, "%s %s %d: %d processes enrolled, registered and attached their executors in %.1f s\n",
          flags.label.c_str(), store.c_str(), n, procs, absl::ToDoubleSeconds(absl::Now() - enrol_start));
  absl::SleepFor(absl::Seconds(flags.warmup_s > 0 ? flags.warmup_s : flags.ttl_ms / 1000.0));

  const pid_t postmaster = pg != nullptr && store == "postgres" ? pg->postmaster() : 0;
  auto snapshot = [&](PhaseReport& r, absl::Time start, double cpu0, double sim0,
                      const std::map<pid_t, double>& store0, double x0) {
    r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    r.server_cpu = (CpuSeconds(server->pid()) - cpu0) / r.seconds;
    r.sim_cpu = (fleet.CpuSeconds() - sim0) / r.seconds;
    r.server_rss = RssMiB(server->pid());
    if (postmaster > 0) {
      r.store_cpu = CpuDelta(store0, TreeCpu(postmaster)) / r.seconds;
      r.xacts_per_s = (pg->Transactions(db) - x0) / r.seconds;
    }
  };

  bool measured = true;
  // Idle.
  {
    PhaseReport r;
    r.phase = "idle";
    if (!fleet.Measure()) return false;
    const double cpu0 = CpuSeconds(server->pid()), sim0 = fleet.CpuSeconds();
    const auto store0 = TreeCpu(postmaster);
    const double x0 = postmaster > 0 ? pg->Transactions(db) : 0;
    const absl::Time start = absl::Now();
    absl::SleepFor(absl::Seconds(flags.idle_s));
    if (!fleet.Take(r.samples)) return false;
    snapshot(r, start, cpu0, sim0, store0, x0);
    Print(flags, store, n, r);
  }
  // A job of one-record tasks.
  if (flags.job_tasks > 0) {
    PhaseReport r;
    r.phase = "job";
    std::string input;
    for (int i = 0; i < flags.job_tasks; ++i) absl::StrAppend(&input, R"({"custom_id":"t)", i, R"(","prompt":"x"})", "\n");
    v1::SubmitJobRequest request;
    request.set_input(input);
    request.set_model(BinDir() + "/minions");  // any file: the fake runner loads nothing
    request.set_shard_size(1);
    minions::cli::JobsClient client(connection);
    // The server's heartbeat times: at the start, just before the first tasks end (the job's end
    // is its heaviest part), and at the end. Three scrapes, so as not to weigh on what they measure.
    ServerHeartbeats at_start = ScrapeServerHeartbeats(http, connection.token), before_end, at_end;
    std::unique_ptr<PgWaitSampler> waits;
    if (flags.pg_waits && pg != nullptr) {
      waits = std::make_unique<PgWaitSampler>(pg->Url(db), db, [&] {
        return std::array<double, 3>{MachineCpuSeconds(), CpuSeconds(server->pid()), fleet.CpuSeconds()};
      });
    }
    if (!fleet.Measure()) return false;
    const double cpu0 = CpuSeconds(server->pid()), sim0 = fleet.CpuSeconds();
    const auto store0 = TreeCpu(postmaster);
    const double x0 = postmaster > 0 ? pg->Transactions(db) : 0;
    const absl::Time start = absl::Now();
    const absl::Time end_part = start + absl::Milliseconds(static_cast<int64_t>(
                                            static_cast<double>(flags.task_ms) * (1 - flags.task_spread) * 0.95));
    absl::Notification job_over;  // the scrape before the end is not waited for once the job is over
    std::thread scrape_before_end([&] {
      if (!job_over.WaitForNotificationWithTimeout(end_part - absl::Now())) {
        before_end = ScrapeServerHeartbeats(http, connection.token);
      }
    });
    auto job = client.Submit(request);
    if (!job.ok()) {
      fprintf(stderr, "submit: %s\n", std::string(job.status().message()).c_str());
      job_over.Notify();
      scrape_before_end.join();
      return false;
    }
    bool done = false;
    for (absl::Time deadline = start + absl::Minutes(5); absl::Now() < deadline;) {
      auto now = client.Get(job->id());
      if (now.ok() && now->state() != "queued" && now->state() != "running" && now->state() != "finalizing") {
        done = now->state() == "completed";
        if (!done) fprintf(stderr, "the job ended %s\n", now->state().c_str());
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    const absl::Time job_end = absl::Now();
    if (waits != nullptr) waits->Stop();
    job_over.Notify();
    scrape_before_end.join();
    at_end = ScrapeServerHeartbeats(http, connection.token);
    if (!fleet.Take(r.samples)) return false;
    snapshot(r, start, cpu0, sim0, store0, x0);
    r.tasks_per_s = static_cast<double>(r.samples.completed) / r.seconds;
    if (!r.samples.leased_at.empty()) {
      r.first_lease_ms = absl::ToDoubleMilliseconds(*std::min_element(r.samples.leased_at.begin(), r.samples.leased_at.end()) - start);
    }
    if (!done) r.phase = "job!";  // did not complete in time
    // A job that did not complete, or no task completed: nothing measured (bench-smoke fails).
    measured = done && r.samples.completed > 0;
    Print(flags, store, n, r);
    {
      // The same heartbeats seen by the simulated executors and by the server, before the first
      // tasks end and after.
      std::vector<double> client_before, client_after;
      for (size_t i = 0; i < r.samples.heartbeat_at.size(); ++i) {
        (r.samples.heartbeat_at[i] < end_part ? client_before : client_after).push_back(r.samples.heartbeat_ms[i]);
      }
      printf("%-10s %-8s %6d %-5s heartbeats before the first tasks end (%.0f s), executors' p50 / p99 ms: %.1f / %.1f; "
             "the server's (bucket bounds): %.0f / %.0f | after: %.1f / %.1f; the server's %.0f / %.0f\n",
             flags.label.c_str(), store.c_str(), n, r.phase.c_str(), absl::ToDoubleSeconds(end_part - start),
             Percentile(client_before, 0.5), Percentile(client_before, 0.99), ServerQuantileMs(at_start, before_end, 0.5),
             ServerQuantileMs(at_start, before_end, 0.99), Percentile(client_after, 0.5), Percentile(client_after, 0.99),
             ServerQuantileMs(before_end, at_end, 0.5), ServerQuantileMs(before_end, at_end, 0.99));
    }
    if (waits != nullptr) {
      const std::string prefix = absl::StrCat(flags.label, " waits");
      waits->Print(absl::StrCat(prefix, " whole job:"), start, job_end);
      if (auto worst = WorstWindow(r.samples, flags.window_s)) {
        waits->Print(absl::StrCat(prefix, " worst heartbeat window:"), worst->first, worst->second);
      }
    }
  }
  server->Signal(SIGKILL);
  (void)server->Wait(absl::Seconds(10));
  fleet.Stop();
  return measured;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as `minions` (apps/minions_main.cc)
  CLI::App app{"minions-bench-fleet: simulated executors against one real server"};
  Flags flags;
  app.add_option("--executors", flags.executors, "fleet sizes, one point each")->capture_default_str();
  app.add_option("--store", flags.stores, "sqlite and/or postgres")->capture_default_str();
  app.add_option("--ttl-ms", flags.ttl_ms, "the server's lease TTL (heartbeats every third; idle ones as the server says, 1.5 TTL by default)")
      ->capture_default_str();
  app.add_option("--idle-polls", flags.idle_polls,
                 "idle polls stand for idle heartbeats where the server says so (as the executor); false: beat anyway")
      ->capture_default_str();
  app.add_option("--beat-stream", flags.beat_stream,
                 "heartbeats on one Beats stream per executor (as the executor); false: a Heartbeat call each")
      ->capture_default_str();
  app.add_option("--lease-wait-ms", flags.lease_wait_ms, "an idle executor's long poll (the executor's: 30000)")
      ->capture_default_str();
  app.add_option("--channels", flags.channels, "gRPC connections (0: one per executor)")->capture_default_str();
  app.add_option("--warmup-s", flags.warmup_s, "seconds after the fleet is up before measuring (0: one TTL)");
  app.add_option("--idle-s", flags.idle_s, "seconds of the idle phase")->capture_default_str();
  app.add_option("--window-s", flags.window_s, "a long phase's heartbeats are also shown by window of this many seconds")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--job-tasks", flags.job_tasks, "one-record tasks of the job phase (0: none)")->capture_default_str();
  app.add_option("--task-ms", flags.task_ms, "the fake runner's time per task")->capture_default_str();
  app.add_option("--task-spread", flags.task_spread,
                 "each task runs --task-ms x (1 +- up to this); 0: all alike, so that tasks begun together end together")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--run-threads", flags.run_threads, "threads of the fake runner's file I/O")->capture_default_str();
  app.add_option("--enrol-threads", flags.enrol_threads, "threads that enrol the executors (not measured)")
      ->capture_default_str();
  app.add_flag("--pg-waits", flags.pg_waits,
               "PostgreSQL: sample what its backends wait for during the job, printed for the whole job and "
               "for its worst heartbeat window");
  app.add_option("--procs", flags.procs,
                 "processes that share the simulated executors out (0: one per 2,500 executors)")
      ->capture_default_str();
  // A worker's options (SimProcesses starts it): not for people.
  app.add_flag("--worker", flags.worker)->group("");
  app.add_option("--server", flags.server)->group("");
  app.add_option("--first", flags.first)->group("");
  app.add_option("--count", flags.count)->group("");
  app.add_option("--dir", flags.dir, "work folder (default: a fresh one under /tmp)");
  app.add_option("--label", flags.label, "names this run's rows")->capture_default_str();
  app.add_option("--server-arg", flags.server_args, "an option for the server (repeat)")->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);
  if (flags.worker) return WorkerMain(flags);
  if (flags.dir.empty()) flags.dir = absl::StrCat("/tmp/minions-fleet-", getpid());
  fs::create_directories(flags.dir);

  printf("# minions-bench-fleet: load average at start %s; %u cores; TTL %lld ms; long poll %lld ms; job %d tasks of %lld ms (+- %g %%)\n",
         LoadAverage().c_str(), std::thread::hardware_concurrency(), static_cast<long long>(flags.ttl_ms),
         static_cast<long long>(flags.lease_wait_ms), flags.job_tasks, static_cast<long long>(flags.task_ms),
         100 * flags.task_spread);
  printf("%-10s %-8s %6s %-5s %6s | heartbeat latency (ms) | Lease calls that got a task (ms), submit to first lease "
         "| tasks/s | server CPU (of one core), RSS | store CPU | store transactions/s | simulator CPU\n",
         "label", "store", "execs", "phase", "secs");
  std::unique_ptr<Postgres> pg;
  if (std::find(flags.stores.begin(), flags.stores.end(), "postgres") != flags.stores.end()) {
    pg = std::make_unique<Postgres>(flags.dir + "/pg");
    if (auto s = pg->Start(); !s.ok()) {
      fprintf(stderr, "PostgreSQL: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  int point = 0;
  bool ok = true;
  for (int n : flags.executors) {
    for (const std::string& store : flags.stores) {
      if (store != "sqlite" && store != "postgres") {
        fprintf(stderr, "--store: sqlite or postgres, not %s\n", store.c_str());
        return 2;
      }
      ok &= RunPoint(flags, store, n, store == "postgres" ? pg.get() : nullptr, point++);
    }
  }
  printf("# load average at end %s\n", LoadAverage().c_str());
  return ok ? 0 : 1;
}
