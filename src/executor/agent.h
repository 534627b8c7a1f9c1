#pragma once
// ExecutorAgent: the executor's I/O and scheduling around its core (TaskRun, one per attempt).
// It registers, leases tasks while it has room, fetches each task's input, feeds the records to
// its runner (kept between tasks, so a model loads once), uploads checkpoints and outputs, and
// completes or reports each attempt. A heartbeat renews the leases of tasks that move every
// third of the TTL and acts on the answer: cancel a task, drain, register again.
//
// Never stuck on a runner: the runner is driven asynchronously (Runner), so feeding it never
// waits for it to read, and its answers are taken as they come. A runner silent for far longer
// than its records take (RunnerWatch), or that does not load a model in load_timeout, is killed
// and its tasks are handed back as retryable failures. The heartbeat renews leases only while
// the main loop is not stuck inside one pass, so the watchdog can step in when it is.
//
// Pipelining: up to `max_prefetch` tasks are held at once, so the runner never waits for the
// control plane between tasks; long tasks keep two (one running, one queued). The server decides
// how much of the window it fills: while idle executors of long tasks wait on it, it grants them
// one task each (server/executor_service.h, SpreadShare).
//
// Server restarts: when no heartbeat gets through for a whole TTL the agent keeps running (the
// server may be restarting); the first heartbeat that gets through re-attaches the leases that are
// still its own and cancels the others. Every report is fenced by its attempt.
//
// Parts (docs/architecture.md, "The executor"): the agent wires parts that own their state —
// LeaseWindow (how much to lease and when), Heartbeater (the heartbeat and its schedule, reading
// the agent through BeatSource), RunnerSupervisor (the runner process: which runner and model,
// loads, hangs, freezes, its end) and AgentControlPlane (the server, in domain types) — and keeps
// the tasks, which of them the runner holds, and the owner's modes on its main loop.
//
// Time: every wait goes through the Clock (its alarms), so tests drive the agent with a fake one:
// Step() and Beat() are the two loops' bodies, each one pass without waiting; Run() is the
// production form that loops them on two threads.
//
// Ownership: owns its runner supervisor, its control-plane client (AgentControlPlane: domain types, a fake in
// tests), its blob client and its runner factory.
// Threads: Run() on one thread (the main loop; it starts the heartbeat thread). Or, in tests,
// Step() and Beat() from one thread, never alongside Run(). Drain(), Stop(), id(),
// tasks_completed() and the WorkTarget methods from any thread.

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "common/thread_role.h"
#include "executor/availability_controller.h"
#include "executor/blob_client.h"
#include "executor/capabilities.h"
#include "executor/agent_control_plane.h"
#include "executor/control_plane_client.h"
#include "executor/executor_metrics.h"
#include "executor/gang_link.h"
#include "executor/gang_tunnel.h"
#include "executor/heartbeater.h"
#include "executor/lease_window.h"
#include "executor/model_access.h"
#include "executor/model_cache.h"
#include "executor/runner_supervisor.h"
#include "executor/task_run.h"
#include "model/types.h"
#include "runner/runner.h"

namespace minions {

struct AgentOptions {
  std::string name;                          // shown in `minions executors`; default: host name
  std::string state_dir;                     // keeps the executor id across restarts; "" = none
  absl::Duration idle_poll = absl::Milliseconds(200);  // retry pause after a failed call
  // Long poll of an idle executor's lease: the server answers the moment work is announced, so
  // the wait costs no latency, and an idle fleet's calls are one per executor per lease_wait.
  // Drain(), Stop() and Wake() (the owner came or went) interrupt it (InterruptLease). 30 s: the
  // longest a server holds one (and its idle recheck), well under the 60 s after which proxies
  // commonly cut a quiet stream.
  absl::Duration lease_wait = absl::Seconds(30);
  // CPU threads for the runner when the job does not say; 0: the runner's default (all cores).
  // Several executors on one machine must split the cores, or their threads fight.
  int runner_threads = 0;
  int max_prefetch = 32;                     // most tasks held at once (tiny tasks)
  // How often an idle executor asks for spot checks to run (docs/verification.md); an idle one
  // asks at most this often, and between its long polls for tasks.
  absl::Duration verify_poll = absl::Seconds(5);
  // Aim to hold this much work beyond the running task.
  absl::Duration prefetch_target = absl::Milliseconds(500);
  // Checkpoints (TaskRun::Options): a task's finished records are uploaded as a chunk every
  // `checkpoint_records` records or `checkpoint_interval`, whichever comes first, and committed
  // by a heartbeat sent at once. A lost attempt costs at most one chunk of work.
  int64_t checkpoint_records = 50;
  absl::Duration checkpoint_interval = absl::Seconds(30);
  // Poison records: runner crashes one task may cause while its records are isolated, before the
  // attempt is given up as a retryable failure (the machine, not a record, is then the suspect).
  int max_crashes_per_task = 24;
  // A runner that has not loaded its model this long after it was asked is ended.
  absl::Duration load_timeout = absl::Minutes(10);
  // When a runner holding work and saying nothing is hung.
  RunnerWatch::Options hang;
  // A main loop inside one pass for this long (a call that never returns) renews no lease: the
  // watchdog then requeues its tasks.
  absl::Duration stuck_after = absl::Minutes(2);
  // How long a runner asked to exit may take before it is killed.
  absl::Duration shutdown_grace = absl::Seconds(5);
  ExecutorMetrics* metrics = nullptr;        // observability hooks; null: none (not owned)
  // Where models may be loaded from (executor/model_access.h); null: nowhere, every load refused.
  // (How the runner is started and confined is its RunnerFactory's: executor/runner_sandbox.h
  // wraps the command a ProcessRunner starts.)
  std::shared_ptr<const ModelAccess> models;
  // What it reports of that confinement (Capabilities.confinement: sandbox::Confinement); "" says
  // nothing (a server that requires confinement then leases it no work).
  std::string confinement;
  // Where registry models are kept (executor/model_cache.h): a lease naming a model by digest is
  // run from here once the cache holds it (fetched in the background while the owner is away);
  // null: such leases fail (retryable), as on an executor that cannot fetch.
  std::shared_ptr<ModelCache> model_cache;
  // What it offers (executor/capabilities.h): the runners it can start, and the owner's cap on the
  // share of memory work may take (usable memory follows it).
  std::vector<std::string> runners = {"llama"};
  double owner_memory_share = 1.0;
  // The accelerator its runner's llama.cpp reports (executor/runner_devices.h); unset: probed by
  // DetectCapabilities (Metal, NVML, else the CPU).
  std::optional<Accelerator> accelerator;
  // Runners its owner declared beside the built-in one (config [runners] NAME = command), by name;
  // a lease naming one runs there (the built-in "llama" is the factory given to the agent). Their
  // names are added to `runners` by whoever fills this.
  std::map<std::string, std::shared_ptr<RunnerFactory>> declared_runners;
  // Gangs (docs/architecture.md, "Gangs"; agent_gang.cc): set when the owner names this machine's
  // address on the gang network ([gang] address). Unset: it joins no gang.
  struct Gang {
    std::string address;     // "host:port": its member gate there (reported in its capabilities)
    std::string rpc_server;  // ggml-rpc-server; "": next to this program
    std::string rpc_log;     // the rpc-server's stderr; "": inherited
    // How the rpc-server is started (GangMemberOptions::wrap): the runner's sandbox
    // (RunnerSandbox::WrapRpcServer). Null: a plain child (tests).
    std::function<std::vector<std::string>(const std::vector<std::string>& argv, int port, const std::string& bridge)>
        rpc_wrap;
    // How long a leader waits for its members' gates to answer before it gives the attempt back.
    absl::Duration member_wait = absl::Seconds(60);
    // The gang network (executor/gang_link.h): how duties are served and members' gates asked;
    // null: the real one (NetworkGangLink). Tests put a fake here.
    std::shared_ptr<GangLink> link;
  };
  std::optional<Gang> gang;
};

class ExecutorAgent : public WorkTarget, private BeatSource {
 public:
  ExecutorAgent(AgentOptions options, std::unique_ptr<AgentControlPlane> control_plane,
                std::unique_ptr<BlobClient> blobs, std::unique_ptr<RunnerFactory> runners, Clock* clock);
  // Over the Executors service's messages (MakeAgentControlPlane(client)).
  ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client, std::unique_ptr<BlobClient> blobs,
                std::unique_ptr<RunnerFactory> runners, Clock* clock);
  ~ExecutorAgent() override;

  // Serves until drained (current tasks finished) or stopped (current tasks handed back). An
  // error only when the server refuses to register this executor (not when it is unreachable).
  absl::Status Run();
  // Finish the tasks in hand, take no more, return from Run().
  void Drain();
  // Hand the tasks back now (as preempted: not counted as failures) and return from Run().
  void Stop();

  // The loops' bodies, for tests (see Time above).
  // One pass of the main loop: register if not yet, take the runner's events, lease, feed the
  // runner, upload, complete. Returns when it wants the next pass.
  absl::Time Step();
  // One heartbeat now.
  void Beat();
  // When the heartbeat is due (InfinitePast: at once; InfiniteFuture: not before a ring).
  absl::Time NextBeat() const;
  // Run() would return now, with this status.
  bool finished() const;
  absl::Status exit_status() const;

  std::string id() const;
  int64_t tasks_completed() const { return tasks_completed_; }
  // Spot checks this executor ran and reported (whatever their verdicts).
  int64_t verifications_reported() const { return verifications_reported_; }

  // Owner first (agent_yield.cc): the agent obeys `gate`'s mode from then on; null: always run.
  // Set before Run().
  void SetWorkGate(WorkGate* gate) { gate_ = gate; }
  // Wakes the main loop (the gate's mode changed). Any thread.
  void Wake();
  // WorkTarget, for the AvailabilityController (any thread).
  bool HoldsWork() const override;
  int RunnerPid() const override;
  void KillRunner(const char* why) override;

 private:
  using TaskPtr = TaskRun*;
  enum class Phase { kRegistering, kServing, kShuttingDown, kFinished };

  // --- main loop (agent.cc) ---
  absl::Status Register();
  void Serve(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void TryRegister(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Leases more tasks when the window has room.
  void LeaseMore(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Fetches a new lease's input and queues its TaskRun; on failure reports it.
  void Stage(const LeaseGrant& lease, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The runner's batch for `task` ended (or nothing was left to run): upload, queue the completion.
  void FinishTask(TaskPtr task, TaskRun::BatchEnd end, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Uploads a chunk and records it.
  absl::Status Upload(TaskPtr task, const TaskRun::ChunkUpload& upload, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // `now_anyway`: whatever the cadence (the owner took the machine back; a stop may follow).
  void MaybeCheckpoint(TaskPtr task, absl::Time now, bool now_anyway = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Completes every uploaded task in one call; keeps them (and their leases, renewed by the
  // heartbeat) for the next try when the server cannot be reached.
  void FlushCompletions(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Reports an attempt that ended without success and forgets it.
  void GiveUp(TaskPtr task, absl::Status why, FailureClass failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void ReportFailure(const LeaseProgress& progress, const absl::Status& why, FailureClass failure);
  void Forget(TaskPtr task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The server's cancellations, taken from the heartbeat.
  void TakeCancellations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // What the heartbeat reports of each task, republished when it moved.
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void PublishTask(TaskPtr task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Drained or stopped: end the runner (a grace to exit), then finish.
  void ShutDown(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  absl::Time NextPass(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The runner holds work: a task's batch, or a spot check's rescore sent and not yet done.
  bool RunnerBusy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_) {
    return !batches_.empty() || (verifying_ && verifying_->sent && !verifying_->done);
  }

  // --- the runner (agent_runner.cc) ---
  // Sends queued tasks to the runner in order (loading the model when it changes, once the
  // runner has finished the previous model's tasks).
  void FeedRunner(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The load command for a lease's model and options (this executor's thread count unless the
  // job sets one).
  absl::StatusOr<runner_protocol::LoadRequest> LoadRequestFor(const LeaseGrant& lease) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Takes what the runner said; handles its end.
  void TakeRunnerEvents(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void OnEvent(const runner_protocol::Event& event, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Kills a runner that hangs or does not load.
  void CheckRunner(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The runner died on its own (`why`): isolate, requeue or give up the tasks it held.
  void OnRunnerDied(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // A registry model's file for `lease`: its cached path, nullopt while it is being fetched in the
  // background (the main loop is rung when it is done), or why it cannot be had.
  absl::StatusOr<std::optional<std::string>> CachedModel(const LeaseGrant& lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Whether a background fetch may go on (the owner's mode lets work run, and no stop).
  bool MayFetch() const;
  // Ends the runner (runner_.Stop()); returns the tasks it held, oldest first (no longer in it).
  std::vector<TaskPtr> DropRunner() ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);

  // What runner a lease runs on ("llama" when it names none), and what that runner must have
  // loaded for it: its model (the bytes, for a registry model) and load options.
  static std::string RunnerOf(const LeaseGrant& lease);
  static std::string ModelKey(const LeaseGrant& lease);

  // --- spot checks (agent_verify.cc) ---
  // Asks for a verification task once a lease call came back empty (MayAskForChecks: the agent
  // is idle, or has tasks in hand and none waiting on the server), loads the job's model (only
  // once the runner holds no task), sends the items to the runner's `rescore` (queued behind the
  // batches it runs: never preempting a task) and reports one verdict per item. Also ends a
  // verification whose runner went away (each item then unchecked). Asks only when `may_ask`.
  void Verify(bool may_ask, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Whether it would ask for a spot check now (at next_verify_ask_): a lease call came back empty
  // since its last ask, and nothing (a gang, a model loading) keeps the runner from a check.
  bool MayAskForChecks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_) {
    return !verifying_ && verify_due_ && !verify_unoffered_ && !InGang() && !runner_.loading();
  }
  // Whether the spot check in hand holds leasing back: while the agent holds no task (an idle
  // lease is a long poll, which would hold the check's report back; the check is small), and until
  // the check is on the runner (another model's check waits for the runner to empty). A check
  // sent to the runner beside tasks leases on: the runner takes it between them.
  bool CheckHoldsLeasing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_) {
    return verifying_ && (tasks_.empty() || !verifying_->sent);
  }
  void StartVerification(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Reports the verdicts taken (every item without one: unchecked, for `why`) and forgets it.
  void EndVerification(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // A runner event of the verification in hand: taken (true), or not its (false).
  bool TakeVerificationEvent(const runner_protocol::Event& event, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);

  // --- gangs (agent_gang.cc) ---
  // Starts serving the duties a lease answer carries (a member's rpc-server behind its gate).
  void TakeGangDuties(const std::vector<GangDuty>& duties) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Stops the duty `ref` (the server ended it), or every duty (`why`: the owner is back, exit).
  bool EndDuty(const AttemptRef& ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void EndDuties(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Whether it serves or leads a gang now: it leases nothing else meanwhile.
  bool InGang() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The TCP ports a runner for `lease` must reach (its gang's members).
  static std::vector<int> GangPorts(const LeaseGrant& lease);
  // OK when every member's gate of `lease` answers now, else which one does not (asks each once,
  // without waiting). Before a leader's runner starts, and when it dies: gates that all answer
  // mean it died of its own accord (e.g. on a poison record: a crash like any runner's, isolated
  // record by record); one that does not, that a member went away (its executor died, its owner
  // came back, its duty was withdrawn): a preemption, not counted.
  absl::Status GangMembersAnswer(const LeaseGrant& lease) const;
  // Whether the members of `task` (the queue's front, a gang's) answer, so its runner may start.
  // While they do not, asked again on later passes for up to options_.gang->member_wait on the
  // agent's clock; then the task is given up (and false returned with gang_wait_for_ cleared).
  bool MembersReady(TaskPtr task, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // A leader's runner reaches its members only through tunnels (executor/gang_tunnel.h) that
  // prove the attempt's secret: opens one per member of `lease`, points `load` at them and
  // returns their loopback ports (the runner's sandbox may reach those alone). The runner
  // supervisor keeps them: they admit the runner's process once it starts, and end with it.
  absl::StatusOr<std::vector<int>> OpenGangTunnels(const LeaseGrant& lease, runner_protocol::LoadRequest* load)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);

  // --- owner first (agent_yield.cc) ---
  // Applies the gate's mode; true when the loop must neither lease nor feed the runner.
  bool ApplyWorkMode(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Ends the runner; the tasks it held go back to the front of the queue to run again later.
  void ReleaseRunner(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // Hands every task not yet finished back to the server as preempted.
  void HandBack(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  void ObserveYield(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_);
  // The state and reason the heartbeat reports.
  std::string FleetState(bool has_tasks, std::string* reason) const override;

  // --- the heartbeat's source (agent_heartbeat.cc; the heartbeat itself is heartbeater_) ---
  // BeatSource: what the main loop last published, and the server's answer acted on (register
  // again, drain, cancel). From the heartbeat thread.
  Holdings Collect(absl::Time now) override;
  void OnBeatAnswer(const AgentBeatAnswer& reply) override;
  // Register again, or drain, as the server said (in a heartbeat's reply or an idle poll's).
  void OnServerNotice(bool reregister, bool drain);

  const AgentOptions options_;
  const TaskRun::Options run_options_;
  const std::unique_ptr<AgentControlPlane> client_;
  const std::unique_ptr<BlobClient> blobs_;
  Clock* const clock_;
  const std::unique_ptr<Alarm> main_alarm_;       // rings the main loop
  WorkGate* gate_ = nullptr;                             // set before Run()
  std::atomic<int64_t> tasks_completed_{0};
  std::atomic<int64_t> verifications_reported_{0};
  // What spot checks cost this executor's loop, logged when it stops (docs/benchmarks.md, "Cost"):
  // its lease calls, its asks for spot checks (and how many found none), and the time a check was
  // in hand. The main loop's thread only (Run logs them once the loop has ended).
  int64_t lease_calls_ = 0;
  int64_t verify_asks_ = 0;
  int64_t verify_asks_empty_ = 0;
  absl::Duration verify_held_ = absl::ZeroDuration();

  // Shared between the loops and the callers from other threads.
  mutable absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status exit_status_ ABSL_GUARDED_BY(mu_);
  // What the heartbeat reports, by task key: immutable snapshots the main loop replaces.
  std::map<std::string, std::shared_ptr<const LeaseProgress>> snapshots_ ABSL_GUARDED_BY(mu_);
  std::vector<AttemptRef> cancelled_ ABSL_GUARDED_BY(mu_);  // by the server, for the main loop
  std::optional<absl::Time> pass_since_ ABSL_GUARDED_BY(mu_);  // the main loop is inside a pass
  bool holds_work_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex register_mu_ ABSL_ACQUIRED_BEFORE(mu_);    // one registration at a time

  // The main loop's own state.
  ThreadRole main_{"executor main loop"};
  Phase phase_ ABSL_GUARDED_BY(main_) = Phase::kRegistering;
  absl::Duration register_backoff_ ABSL_GUARDED_BY(main_) = absl::Milliseconds(100);
  absl::Time next_register_try_ ABSL_GUARDED_BY(main_) = absl::InfinitePast();
  std::map<std::string, std::unique_ptr<TaskRun>> tasks_ ABSL_GUARDED_BY(main_);  // by key
  std::map<std::string, uint64_t> published_ ABSL_GUARDED_BY(main_);  // key -> version sent
  std::deque<TaskPtr> queue_ ABSL_GUARDED_BY(main_);     // leased and fetched, not in the runner
  std::map<std::string, TaskPtr> batches_ ABSL_GUARDED_BY(main_);  // runner batch -> its task
  std::vector<TaskPtr> to_complete_ ABSL_GUARDED_BY(main_);  // uploaded, completion not accepted
  absl::Time next_completion_try_ ABSL_GUARDED_BY(main_) = absl::InfinitePast();
  // The runner process (runner_supervisor.h): its own lock; the main loop starts, feeds and ends
  // it, any thread may ask its pid or kill it.
  RunnerSupervisor runner_;
  // Gang duties it serves as a member, by attempt key; their refs for the heartbeat.
  std::map<std::string, std::unique_ptr<GangService>> duties_ ABSL_GUARDED_BY(main_);
  std::vector<AttemptRef> duty_refs_ ABSL_GUARDED_BY(mu_);
  TaskPtr loading_for_ ABSL_GUARDED_BY(main_) = nullptr;  // the task the runner loads for
  // The background fetch of a registry model (one at a time) and where each fetched one is.
  struct ModelFetch {
    std::string digest;
    std::thread thread;
    std::atomic<bool> done{false};
    // The download stopped because the machine was not free (the owner came back): not a
    // failure of the task, which goes back as preempted.
    std::atomic<bool> paused{false};
    absl::StatusOr<std::string> path;  // written by the thread before `done`
  };
  std::unique_ptr<ModelFetch> fetch_ ABSL_GUARDED_BY(main_);
  std::map<std::string, std::string> model_paths_ ABSL_GUARDED_BY(main_);  // digest -> cached file
  // The spot check in hand (agent_verify.cc): at most one at a time.
  struct Verifying {
    VerificationGrant grant;
    std::string batch;                 // its rescore batch id
    absl::Time since;                  // when it was leased
    bool load_asked = false;           // it asked the runner to load the job's model
    bool sent = false;                 // its rescore went to the runner ...
    bool done = false;                 // ... which has answered it (batch_done)
    int64_t runner_generation = 0;     // the runner it loaded on or sent to
    std::vector<size_t> sent_items;    // the rescore's item i is grant.items[sent_items[i]]
    std::vector<std::optional<RecordVerdict>> verdicts;  // by grant item
  };
  std::optional<Verifying> verifying_ ABSL_GUARDED_BY(main_);
  absl::Time next_verify_ask_ ABSL_GUARDED_BY(main_) = absl::InfinitePast();
  // A lease call came back empty since its last ask for spot checks (true at first: it asks once
  // on starting). Asks wait for it, so a check never goes before a task the server has for it.
  bool verify_due_ ABSL_GUARDED_BY(main_) = true;
  // It held a task since its last idle lease call: the next one is a quick look, not a long poll.
  bool quick_look_ ABSL_GUARDED_BY(main_) = false;
  bool verify_unoffered_ ABSL_GUARDED_BY(main_) = false;  // the server leases no spot checks
  // The gang network (options_.gang->link, else the real one); immutable.
  const std::shared_ptr<GangLink> gang_link_;
  // The gang task whose members the loop waits for (MembersReady), since when.
  TaskPtr gang_wait_for_ ABSL_GUARDED_BY(main_) = nullptr;
  absl::Time gang_wait_since_ ABSL_GUARDED_BY(main_);
  // How much to lease and when (lease_window.h): the prefetch window, long polls, back-off, and
  // reclaiming after an unanswered call.
  LeaseWindow window_ ABSL_GUARDED_BY(main_);
  absl::Time last_commit_ring_ ABSL_GUARDED_BY(main_) = absl::InfinitePast();
  std::optional<absl::Time> shutdown_deadline_ ABSL_GUARDED_BY(main_);
  bool more_events_ ABSL_GUARDED_BY(main_) = false;      // the last pass left events to take
  bool holding_ ABSL_GUARDED_BY(main_) = false;          // the owner's mode holds leasing and feeding
  // Owner first.
  bool yield_observed_ ABSL_GUARDED_BY(main_) = false;   // since the owner last took the machine
  absl::Time next_throttle_toggle_ ABSL_GUARDED_BY(main_) = absl::InfinitePast();

  // The heartbeat (heartbeater.h): its schedule, its thread's state and its alarm; it reads the
  // snapshots above through Collect. Declared last: built over everything it reads.
  Heartbeater heartbeater_;
  std::thread heartbeat_thread_;
  std::atomic<bool> heartbeat_stop_{false};
};

}  // namespace minions
