#include "executor/agent.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "executor/capabilities.h"

namespace minions {
namespace {

std::string ReadFileOr(const std::string& path, const std::string& fallback) {
  std::ifstream in(path);
  std::string value;
  if (in && std::getline(in, value) && !value.empty()) return value;
  return fallback;
}

AgentOptions Normalised(AgentOptions options) {
  options.max_prefetch = std::max(1, options.max_prefetch);
  return options;
}

// The main loop looks around at least this often, whatever it waits for.
constexpr absl::Duration kLongestPass = absl::Seconds(1);
// A gang leader asks its members' gates this often while it waits for them.
constexpr absl::Duration kGangAskEvery = absl::Milliseconds(100);
// A chunk is committed by a heartbeat sent at once, at most this often.
constexpr absl::Duration kCommitBeatInterval = absl::Milliseconds(250);

}  // namespace

ExecutorAgent::ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client,
                             std::unique_ptr<BlobClient> blobs, std::unique_ptr<RunnerFactory> runners, Clock* clock)
    : ExecutorAgent(std::move(options), MakeAgentControlPlane(std::move(client)), std::move(blobs), std::move(runners),
                    clock) {}

ExecutorAgent::ExecutorAgent(AgentOptions options, std::unique_ptr<AgentControlPlane> client,
                             std::unique_ptr<BlobClient> blobs, std::unique_ptr<RunnerFactory> runners, Clock* clock)
    : options_(Normalised(std::move(options))),
      run_options_{options_.checkpoint_records, options_.checkpoint_interval, options_.max_crashes_per_task},
      client_(std::move(client)),
      blobs_(std::move(blobs)),
      clock_(clock),
      main_alarm_(std::make_unique<Alarm>(clock)),
      runner_(RunnerSupervisor::Options{options_.hang, options_.load_timeout, options_.metrics}, std::move(runners),
              options_.declared_runners, [this] { main_alarm_->Ring(); }),
      gang_link_(options_.gang && options_.gang->link ? options_.gang->link : std::make_shared<NetworkGangLink>()),
      window_(LeaseWindow::Options{options_.max_prefetch, options_.prefetch_target, options_.lease_wait,
                                   options_.idle_poll}),
      heartbeater_(Heartbeater::Options{options_.stuck_after, options_.metrics, options_.model_cache}, client_.get(),
                   this, clock) {}

ExecutorAgent::~ExecutorAgent() {
  heartbeat_stop_ = true;  // also stops a model fetch at its next range (MayFetch)
  heartbeater_.Ring();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  ThreadRoleScope role(&main_);
  if (fetch_ && fetch_->thread.joinable()) fetch_->thread.join();
}

std::string ExecutorAgent::id() const {
  absl::MutexLock lock(&mu_);
  return id_;
}

bool ExecutorAgent::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

absl::Status ExecutorAgent::exit_status() const {
  absl::MutexLock lock(&mu_);
  return exit_status_;
}

void ExecutorAgent::Drain() {
  {
    absl::MutexLock lock(&mu_);
    drain_ = true;
  }
  client_->InterruptLease();
  main_alarm_->Ring();
}

void ExecutorAgent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    drain_ = true;
  }
  client_->InterruptLease();
  main_alarm_->Ring();
}

void ExecutorAgent::Wake() {
  // The owner came or went: a long poll must not hand this machine work it may no longer take.
  client_->InterruptLease();
  main_alarm_->Ring();
}

absl::Status ExecutorAgent::Run() {
  heartbeat_thread_ = std::thread([this] {
    while (!heartbeat_stop_) {
      absl::Time due = NextBeat();
      if (clock_->Now() < due) {
        heartbeater_.SleepUntil(due);
        continue;
      }
      Beat();
    }
  });
  while (true) {
    absl::Time next = Step();
    if (finished()) break;
    main_alarm_->SleepUntil(next);
  }
  heartbeat_stop_ = true;
  heartbeater_.Ring();
  heartbeat_thread_.join();
  MINIONS_LOG(Info) << "executor stopped after " << tasks_completed_ << " tasks, " << lease_calls_
                    << " lease calls; spot checks: " << verify_asks_ << " asks (" << verify_asks_empty_
                    << " found none), " << verifications_reported_ << " reported, "
                    << absl::ToDoubleSeconds(verify_held_) << " s in hand";
  return exit_status();
}

// --- The main loop ---

absl::Time ExecutorAgent::Step() {
  ThreadRoleScope role(&main_);
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return absl::InfiniteFuture();
    pass_since_ = now;
  }
  switch (phase_) {
    case Phase::kRegistering:
      TryRegister(now);
      break;
    case Phase::kServing:
      Serve(now);
      break;
    case Phase::kShuttingDown:
      ShutDown(now);
      break;
    case Phase::kFinished:
      break;
  }
  Publish();
  {
    absl::MutexLock lock(&mu_);
    pass_since_.reset();
    holds_work_ = !tasks_.empty();
    finished_ = phase_ == Phase::kFinished;
  }
  return NextPass(clock_->Now());
}

void ExecutorAgent::Serve(absl::Time now) {
  TakeCancellations();
  // Revoked (or expired): every call will be refused and its tasks are another's already, so
  // whatever runs is wasted. Stop at once, as on a stop request, and exit with why.
  if (absl::Status refused = client_->CredentialRefused(); !refused.ok()) {
    absl::MutexLock lock(&mu_);
    if (!stop_) MINIONS_LOG(Warning) << refused.message() << "; stopping";
    if (exit_status_.ok()) exit_status_ = refused;
    stop_ = drain_ = true;
  }
  bool drain, stop;
  {
    absl::MutexLock lock(&mu_);
    drain = drain_;
    stop = stop_;
  }
  if (stop) {
    // Hand the tasks back now: whatever the runner holds is given up with it.
    if (RunnerBusy() || runner_.loading()) DropRunner();
    if (verifying_) EndVerification("the executor is stopping");
    HandBack("the executor is stopping");
    next_completion_try_ = absl::InfinitePast();
    FlushCompletions(now);  // one try: a stop does not wait for the server
    for (TaskPtr task : std::vector<TaskPtr>(to_complete_)) Forget(task);
    phase_ = Phase::kShuttingDown;
    return ShutDown(clock_->Now());
  }
  TakeRunnerEvents(now);
  CheckRunner(clock_->Now());
  // Owner first: the availability controller may hold the loop (agent_yield.cc).
  const bool hold = holding_ = ApplyWorkMode(clock_->Now());
  if (drain && tasks_.empty()) {
    if (verifying_) EndVerification("the executor is draining");
    phase_ = Phase::kShuttingDown;
    return ShutDown(clock_->Now());
  }
  // Spot checks are asked for once a lease call came back empty, and run between the tasks in
  // hand; one holds leasing back only while it must (CheckHoldsLeasing, agent_verify.cc).
  Verify(!drain && !hold, clock_->Now());
  if (!drain && !hold && !CheckHoldsLeasing()) LeaseMore(clock_->Now());
  if (!hold) FeedRunner(clock_->Now());
  FlushCompletions(clock_->Now());
}

absl::Time ExecutorAgent::NextPass(absl::Time now) {
  if (more_events_) return now;
  absl::Time next = now + kLongestPass;
  switch (phase_) {
    case Phase::kRegistering:
      return std::min(next, next_register_try_);
    case Phase::kShuttingDown:
      return shutdown_deadline_ ? std::min(next, *shutdown_deadline_) : now;
    case Phase::kFinished:
      return absl::InfiniteFuture();
    case Phase::kServing:
      break;
  }
  bool drain;
  {
    absl::MutexLock lock(&mu_);
    drain = drain_;
  }
  // A spot check that holds leasing back (Serve): the window's ask waits for it.
  if (!drain && !holding_ && !InGang() && !CheckHoldsLeasing()) {
    next = std::min(next, window_.NextAsk(static_cast<int>(tasks_.size())));
  }
  if (!drain && !holding_ && MayAskForChecks()) next = std::min(next, next_verify_ask_);  // its next ask
  if (!to_complete_.empty()) next = std::min(next, next_completion_try_);
  next = std::min(next, runner_.NextCheck());  // its hang, its load's timeout
  if (gang_wait_for_ && !holding_) next = std::min(next, now + kGangAskEvery);
  if (gate_) {
    WorkMode mode = gate_->mode();
    if (mode == WorkMode::kThrottle) next = std::min(next, next_throttle_toggle_);
    if (mode == WorkMode::kPause && RunnerBusy() && !runner_.frozen()) {
      next = std::min(next, gate_->mode_since() + gate_->pause_grace());
    }
  }
  return std::max(next, now);
}

absl::Status ExecutorAgent::Register() {
  absl::MutexLock registering(&register_mu_);
  std::string id_file = options_.state_dir.empty() ? "" : options_.state_dir + "/executor-id";
  std::string known_id;
  {
    absl::MutexLock lock(&mu_);
    known_id = id_.empty() && !id_file.empty() ? ReadFileOr(id_file, "") : id_;
  }
  CapabilityOptions offer;
  offer.name = options_.name;
  offer.runners = options_.runners;
  offer.owner_memory_share = options_.owner_memory_share;
  offer.accelerator = options_.accelerator;
  if (options_.model_cache) offer.models_cached = options_.model_cache->Cached();
  v1::Capabilities capabilities = DetectCapabilities(offer);
  capabilities.set_max_tasks(options_.max_prefetch);
  if (options_.gang) capabilities.set_gang_address(options_.gang->address);
  capabilities.set_confinement(options_.confinement);
  if (options_.models) {
    for (const std::string& folder : options_.models->ReportedFolders()) capabilities.add_model_folders(folder);
  }
  auto reply = client_->Register(known_id, capabilities);
  if (!reply.ok()) return reply.status();
  {
    absl::MutexLock lock(&mu_);
    id_ = reply->executor_id;
  }
  heartbeater_.Registered(*reply);
  if (!id_file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.state_dir, ec);
    std::ofstream(id_file, std::ios::trunc) << reply->executor_id << "\n";
  }
  SetLogComponent(absl::StrCat("executor ", reply->executor_id));
  MINIONS_LOG(Info) << "registered as executor=" << reply->executor_id << " (lease ttl "
                    << absl::ToInt64Milliseconds(reply->lease_ttl) << " ms, idle heartbeat "
                    << absl::ToInt64Milliseconds(reply->idle_heartbeat) << " ms)";
  return absl::OkStatus();
}

void ExecutorAgent::TryRegister(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || drain_) {
      phase_ = Phase::kFinished;
      return;
    }
  }
  if (now < next_register_try_) return;
  absl::Status s = Register();
  if (s.ok()) {
    phase_ = Phase::kServing;
    return;
  }
  if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) {
    // Refused, not unreachable: trying again will not help.
    absl::MutexLock lock(&mu_);
    exit_status_ = s;
    phase_ = Phase::kFinished;
    return;
  }
  // Ride out a server that is not up yet.
  MINIONS_LOG(Warning) << "cannot register yet: " << s.message();
  next_register_try_ = now + register_backoff_;
  register_backoff_ = std::min(register_backoff_ * 2, absl::Seconds(5));
}

void ExecutorAgent::LeaseMore(absl::Time now) {
  if (InGang()) return;  // its memory is a gang's until that attempt ends
  const int held = static_cast<int>(tasks_.size());
  if (!window_.Due(held, now)) return;
  AgentLeaseAsk request = window_.Ask(held);
  // It has just run out of tasks: a quick look (no long poll) first. Only when that finds nothing
  // does it ask for spot checks (Verify), so it never takes a check while a task waits for it, and
  // never parks in a long poll while checks wait.
  const bool quick_look = held == 0 && quick_look_;
  if (quick_look) request.wait = absl::ZeroDuration();
  if (held == 0) quick_look_ = false;
  request.executor_id = id();
  {
    // Holding nothing at all, and available (or it would not lease): the server may keep it alive
    // from this poll, in place of its idle heartbeat.
    absl::MutexLock lock(&mu_);
    request.idle = held == 0 && !request.reclaim && snapshots_.empty() && duty_refs_.empty();
  }
  request.idle = request.idle && heartbeater_.idle_polls_renew();
  if (request.idle) heartbeater_.IdlePollStarted();
  if (request.reclaim) {
    for (const auto& [key, task] : tasks_) request.held.push_back(task->ref());
  }
  ++lease_calls_;
  auto reply = client_->Lease(request);
  if (request.idle) heartbeater_.IdlePollEnded(reply.ok(), reply.ok() && reply->idle_renewed);
  if (reply.ok() && (reply->reregister || reply->drain)) {
    OnServerNotice(reply->reregister, reply->drain);
    return;
  }
  if (!reply.ok()) {
    if (absl::IsNotFound(reply.status())) (void)Register();  // the server forgot us (new database)
    if (absl::IsFailedPrecondition(reply.status())) {
      // The server gives this executor no work as it is (a pool that requires confined runners):
      // said to the owner; LeaseWindow asks again at the long poll's pace, not the retry's.
      MINIONS_LOG(Warning) << "the server leases this executor no work: " << reply.status().message();
    } else {
      MINIONS_LOG(Debug) << "lease failed: " << reply.status().message();
    }
    window_.Failed(reply.status(), now, clock_->Now());
    return;
  }
  window_.Answered(request, reply->leases.size(), now, clock_->Now());
  if (reply->leases.empty()) {
    // Nothing to lease now: the moment to ask for spot checks (Verify).
    verify_due_ = true;
    // A long poll answered early with nothing: the server woke it because another executor
    // committed work that may have spot checks drawn (ExecutorService::WakeAVerifier). Or the
    // quick look after its last task: the checks of the job it worked on wait for an executor
    // with nothing else to do. Either way, ask now.
    if (quick_look ||
        (request.wait > absl::ZeroDuration() && clock_->Now() - now < request.wait / 2)) {
      next_verify_ask_ = absl::InfinitePast();
    }
  }
  TakeGangDuties(reply->gang_duties);
  for (const LeaseGrant& lease : reply->leases) Stage(lease, clock_->Now());
}

void ExecutorAgent::Stage(const LeaseGrant& lease, absl::Time now) {
  const std::string key = TaskKey(lease.ref);
  if (tasks_.contains(key)) return;  // granted again (a reclaim) while this executor already runs it
  LeaseProgress leased{lease.ref.job_id, lease.ref.task_index, lease.ref.attempt, lease.resume_from, 0, {}};
  {
    absl::MutexLock lock(&mu_);
    snapshots_[key] = std::make_shared<const LeaseProgress>(leased);  // heartbeats cover it from now on
  }
  heartbeater_.Soon(now);
  auto drop = [&](const absl::Status& why, FailureClass failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(main_) {
    ReportFailure(leased, why, failure);
    absl::MutexLock lock(&mu_);
    snapshots_.erase(key);
  };
  auto input = blobs_->GetRange(lease.input_url, lease.byte_begin, lease.byte_end);
  if (!input.ok()) {
    return drop(absl::Status(input.status().code(), absl::StrCat("cannot read the input: ", input.status().message())),
                FailureClass::kRetryable);
  }
  auto run = TaskRun::Start(lease, *input, run_options_, now);
  if (!run.ok()) return drop(run.status(), FailureClass::kPermanent);
  TaskPtr task = run->get();
  tasks_[key] = std::move(*run);
  quick_look_ = true;  // once it runs out of tasks, it looks for more before asking for spot checks
  queue_.push_back(task);
  PublishTask(task);
  if (lease.resume_from > 0) {
    MINIONS_LOG(Info) << Describe(lease.ref) << " resumes after " << lease.resume_from << " committed records";
  }
}

void ExecutorAgent::MaybeCheckpoint(TaskPtr task, absl::Time now, bool now_anyway) {
  std::optional<TaskRun::ChunkUpload> due = task->DueCheckpoint(now, now_anyway);
  if (!due) return;
  if (absl::Status s = Upload(task, *due, now); !s.ok()) {
    MINIONS_LOG(Warning) << Describe(task->ref()) << " checkpoint not uploaded (will retry): " << s.message();
  }
}

absl::Status ExecutorAgent::Upload(TaskPtr task, const TaskRun::ChunkUpload& upload, absl::Time now) {
  // Every chunk writes its output object (the finaliser reads a missing one as lost); a chunk
  // without error lines writes no error object.
  RETURN_IF_ERROR(blobs_->Put(upload.urls.output_url, upload.output));
  if (!upload.errors.empty()) RETURN_IF_ERROR(blobs_->Put(upload.urls.errors_url, upload.errors));
  task->ChunkUploaded(upload.chunk, now);
  PublishTask(task);
  // Commit it now rather than at the next periodic heartbeat (up to TTL/3 away), at most a few
  // times a second: a loss costs one chunk, not one chunk plus a heartbeat interval.
  if (now - last_commit_ring_ >= kCommitBeatInterval) {
    last_commit_ring_ = now;
    heartbeater_.BeatNow();
  }
  return absl::OkStatus();
}

void ExecutorAgent::FinishTask(TaskPtr task, TaskRun::BatchEnd end, absl::Time now) {
  using End = TaskRun::BatchEnd;
  if (end == End::kIgnored) return;
  if (end == End::kYielded) {
    // Stopped for the owner (agent_yield.cc): what it finished is checkpointed now (a stop may
    // follow the pause), the rest runs when the owner leaves, before the tasks not yet begun and
    // after those yielded before it.
    if (task->cancelled()) return Forget(task);
    MaybeCheckpoint(task, now, /*now_anyway=*/true);
    auto at = queue_.begin();
    while (at != queue_.end() && (*at)->yielded() && (*at)->started() < task->started()) ++at;
    queue_.insert(at, task);
    return;
  }
  window_.TaskTook(now - task->started());
  if (end == End::kRunAgain) {
    queue_.push_front(task);  // more groups of an isolated task to run, alone
    return;
  }
  if (task->cancelled()) return Forget(task);
  if (end == End::kCancelled) {
    return GiveUp(task, absl::AbortedError("the runner cancelled the batch"), FailureClass::kRetryable);
  }
  auto last = task->FinalChunk();
  absl::Status uploaded = last.ok() ? absl::OkStatus() : last.status();
  if (uploaded.ok() && *last) uploaded = Upload(task, **last, now);
  if (!uploaded.ok()) {
    return GiveUp(task,
                  absl::Status(uploaded.code(), absl::StrCat("cannot upload the output: ", uploaded.message())),
                  FailureClass::kRetryable);
  }
  to_complete_.push_back(task);
}

void ExecutorAgent::FlushCompletions(absl::Time now) {
  if (to_complete_.empty() || now < next_completion_try_) return;
  std::vector<LeaseProgress> done;
  std::vector<TaskPtr> sent;
  for (TaskPtr task : std::vector<TaskPtr>(to_complete_)) {
    if (task->cancelled()) {
      Forget(task);
      continue;
    }
    done.push_back(task->Completion());
    sent.push_back(task);
  }
  if (sent.empty()) return;
  auto reply = client_->CompleteBatch(id(), done);
  if (!reply.ok()) {
    // Keep them: the heartbeat keeps renewing their leases, and the next try may get through.
    MINIONS_LOG(Warning) << "cannot complete " << sent.size() << " tasks yet: " << reply.status().message();
    next_completion_try_ = clock_->Now() + absl::Milliseconds(500);
    return;
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    const absl::Status& outcome = (*reply)[i];
    if (outcome.ok()) {
      ++tasks_completed_;
      if (options_.metrics) options_.metrics->TaskCompleted();  // metrics hook
      MINIONS_LOG(Debug) << Describe(sent[i]->ref()) << " completed: " << sent[i]->records_done() << " records run, "
                         << sent[i]->records_failed() << " errors";
    } else {
      MINIONS_LOG(Warning) << Describe(sent[i]->ref()) << " completion refused: " << outcome.message();
    }
    Forget(sent[i]);
  }
}

void ExecutorAgent::ReportFailure(const LeaseProgress& progress, const absl::Status& why, FailureClass failure) {
  // Chunks uploaded since the last heartbeat are committed with the report: a preempted or
  // failed attempt hands back every record it uploaded.
  absl::Status s = client_->Fail(id(), progress, failure, std::string(why.message()));
  MINIONS_LOG(Warning) << Describe(AttemptRef{progress.job_id, progress.task_index, progress.attempt}) << " "
                       << FailureClassName(failure) << ": " << why.message()
                       << (s.ok() ? "" : absl::StrCat(" (report refused: ", std::string(s.message()), ")"));
}

void ExecutorAgent::GiveUp(TaskPtr task, absl::Status why, FailureClass failure) {
  if (!task->cancelled()) ReportFailure(task->Progress(), why, failure);  // else not ours to report any more
  Forget(task);
}

void ExecutorAgent::Forget(TaskPtr task) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), task), queue_.end());
  to_complete_.erase(std::remove(to_complete_.begin(), to_complete_.end(), task), to_complete_.end());
  for (auto it = batches_.begin(); it != batches_.end();) {
    it = it->second == task ? batches_.erase(it) : std::next(it);
  }
  if (loading_for_ == task) loading_for_ = nullptr;
  if (gang_wait_for_ == task) gang_wait_for_ = nullptr;
  const std::string key = task->key();
  published_.erase(key);
  {
    absl::MutexLock lock(&mu_);
    snapshots_.erase(key);
  }
  tasks_.erase(key);  // the TaskRun goes
}

void ExecutorAgent::TakeCancellations() {
  std::vector<AttemptRef> cancelled;
  {
    absl::MutexLock lock(&mu_);
    cancelled.swap(cancelled_);
  }
  for (const AttemptRef& ref : cancelled) {
    if (EndDuty(ref)) continue;  // a gang it served as a member
    auto it = tasks_.find(TaskKey(ref));
    if (it == tasks_.end() || it->second->cancelled()) continue;
    TaskPtr task = it->second.get();
    task->Cancel();
    MINIONS_LOG(Info) << Describe(ref) << " cancelled by the server";
    if (task->in_runner() && runner_.running()) {
      runner_.Cancel(task->batch());  // forgotten when its batch ends
    } else if (!task->in_runner()) {
      Forget(task);
    }
  }
}

void ExecutorAgent::PublishTask(TaskPtr task) {
  auto snapshot = std::make_shared<const LeaseProgress>(task->Progress());
  published_[task->key()] = task->version();
  absl::MutexLock lock(&mu_);
  snapshots_[task->key()] = std::move(snapshot);
}

void ExecutorAgent::Publish() {
  for (const auto& [key, task] : tasks_) {
    auto it = published_.find(key);
    if (it == published_.end() || it->second != task->version()) PublishTask(task.get());
  }
}

void ExecutorAgent::ShutDown(absl::Time now) {
  EndDuties("the executor stops");
  if (runner_.running()) {
    if (!shutdown_deadline_) {
      if (runner_.frozen()) runner_.Freeze(false, now);  // a stopped runner cannot read its shutdown
      runner_.RequestShutdown();
      shutdown_deadline_ = now + options_.shutdown_grace;
    }
    const bool ended = runner_.Drained();
    if (!ended && now < *shutdown_deadline_) return;  // its end rings the loop
    DropRunner();
  }
  phase_ = Phase::kFinished;
}

}  // namespace minions
