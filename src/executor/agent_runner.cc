// ExecutorAgent, the runner's side: which model each queued task needs (fetched into the model
// cache first), feeding the tasks to the runner in order, taking what it says, and what its end
// costs each task it held (a hang, a load that does not come, a crash). The runner process itself
// is the RunnerSupervisor's (runner_supervisor.h). Kept apart from agent.cc (the main loop,
// leasing, uploads and reports) so the two read separately.

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "executor/agent.h"

namespace minions {
namespace {

// Events taken per pass at most, so a flood of results cannot starve leasing and completions.
constexpr int kEventsPerPass = 4096;

}  // namespace

std::string ExecutorAgent::RunnerOf(const LeaseGrant& lease) {
  return lease.runner.empty() ? RunnerSupervisor::kBuiltInRunner : lease.runner;
}

std::string ExecutorAgent::ModelKey(const LeaseGrant& lease) {
  std::string key =
      absl::StrCat(RunnerOf(lease), ":", lease.model, "@", lease.model_digest, "\n", lease.runner_options_json);
  // A gang's model lives across its members' rpc-servers, which live for one attempt: each gang
  // attempt is a runner of its own.
  if (!lease.gang.empty()) absl::StrAppend(&key, "\ngang ", TaskKey(lease.ref));
  return key;
}

bool ExecutorAgent::MayFetch() const {
  if (heartbeat_stop_) return false;  // the agent is going away
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
  }
  if (gate_ == nullptr) return true;
  const WorkMode mode = gate_->mode();
  return mode == WorkMode::kRun || mode == WorkMode::kThrottle;
}

absl::StatusOr<std::optional<std::string>> ExecutorAgent::CachedModel(const LeaseGrant& lease) {
  if (auto known = model_paths_.find(lease.model_digest); known != model_paths_.end()) {
    return std::optional<std::string>(known->second);
  }
  if (!options_.model_cache) {
    return absl::FailedPreconditionError("this executor has no model cache for registry models");
  }
  if (fetch_ && fetch_->done) {
    fetch_->thread.join();
    std::unique_ptr<ModelFetch> fetched = std::move(fetch_);
    if (fetched->path.ok()) {
      model_paths_[fetched->digest] = *fetched->path;
      if (fetched->digest == lease.model_digest) return std::optional<std::string>(*fetched->path);
    } else if (fetched->digest == lease.model_digest) {
      // Paused for the owner: Aborted, which FeedRunner hands back as a preemption.
      if (fetched->paused) return absl::AbortedError(fetched->path.status().message());
      return fetched->path.status();
    }
  }
  if (fetch_) return std::optional<std::string>();  // another model is on its way first
  // In the background: a large model takes minutes, and the main loop must go on meanwhile.
  auto fetch = std::make_unique<ModelFetch>();
  fetch->digest = lease.model_digest;
  ModelFetch* raw = fetch.get();
  std::shared_ptr<ModelCache> cache = options_.model_cache;
  raw->thread = std::thread([this, raw, cache, digest = lease.model_digest, size = lease.model_size_bytes,
                             url = lease.model_url] {
    raw->path = cache->Fetch(digest, size, url, [this, raw] {
      const bool may = MayFetch();
      if (!may) raw->paused = true;
      return may;
    });
    raw->done = true;
    main_alarm_->Ring();
  });
  fetch_ = std::move(fetch);
  MINIONS_LOG(Info) << "fetching model " << lease.model << "@" << lease.model_digest << " (" << lease.model_size_bytes
                    << " bytes) into the model cache";
  return std::optional<std::string>();
}

absl::StatusOr<runner_protocol::LoadRequest> ExecutorAgent::LoadRequestFor(const LeaseGrant& lease) const {
  runner_protocol::LoadRequest load;
  if (!lease.model_digest.empty()) {
    // A registry model: the cache's verified file (FeedRunner fetched it first).
    auto path = model_paths_.find(lease.model_digest);
    if (path == model_paths_.end()) return absl::NotFoundError(ModelAccess::UnavailableMessage(lease.model));
    load.model = path->second;
  } else {
    // Only from the owner's model folders, by real path (one answer for every refusal).
    if (!options_.models) return absl::NotFoundError(ModelAccess::UnavailableMessage(lease.model));
    ASSIGN_OR_RETURN(load.model, options_.models->Resolve(lease.model));
  }
  bool threads_given = false;
  if (!lease.runner_options_json.empty()) {
    ASSIGN_OR_RETURN(Json json, ParseJson(lease.runner_options_json));
    ASSIGN_OR_RETURN(load.options, runner_protocol::LoadOptions::FromJson(json));
    threads_given = JsonField(json, "n_threads").is_number();
  }
  if (options_.runner_threads > 0 && !threads_given) load.options.n_threads = options_.runner_threads;
  // A gang's leader: the model's layers spread over its members' rpc-servers (from the lease,
  // never from the job's options).
  for (const LeaseGrant::GangPeer& peer : lease.gang) load.gang.servers.push_back({peer.endpoint, peer.bytes});
  if (!lease.gang.empty()) load.gang.leader_bytes = lease.gang_leader_bytes;
  return load;
}

void ExecutorAgent::FeedRunner(absl::Time now) {
  while (!queue_.empty()) {
    TaskPtr task = queue_.front();
    // A task under suspicion of crashing the runner runs alone: nothing joins it, and it waits
    // for the runner to empty.
    bool suspect_running = false;
    for (const auto& [batch, other] : batches_) suspect_running |= other->suspect();
    if (suspect_running || (task->suspect() && RunnerBusy())) return;
    const std::string model = ModelKey(task->lease());
    if (!runner_.Has(model)) {
      // A model change waits until the runner has finished the previous model's tasks.
      if (RunnerBusy()) return;
      if (!task->lease().model_digest.empty()) {
        absl::StatusOr<std::optional<std::string>> cached = CachedModel(task->lease());
        if (!cached.ok()) {
          // Not fetched (no room, the bytes were wrong, the URL failed): another executor may do
          // better, and this one tries afresh next time. A download paused because the owner came
          // back failed nothing: the task goes back uncounted (preempted).
          queue_.pop_front();
          GiveUp(task, absl::Status(cached.status().code(),
                                    absl::StrCat("cannot fetch the model: ", cached.status().message())),
                 absl::IsAborted(cached.status()) ? FailureClass::kPreempted : FailureClass::kRetryable);
          continue;
        }
        if (!cached->has_value()) return;  // still on its way; the fetch rings the loop when done
      }
      auto load = LoadRequestFor(task->lease());
      if (!load.ok()) {
        // Options that do not parse will not parse next time either.
        queue_.pop_front();
        GiveUp(task, absl::InvalidArgumentError(absl::StrCat("cannot load the model: ", load.status().message())),
               FailureClass::kPermanent);
        continue;
      }
      const std::vector<int> ports = GangPorts(task->lease());
      if (runner_.running() && (!runner_.Is(RunnerOf(task->lease()), ports) || !ports.empty())) {
        // Another runner program, or a sandbox with other gang ports: the idle one ends (it
        // holds no batch) and the lease's starts.
        for (TaskPtr held : DropRunner()) queue_.push_back(held);
      }
      if (!task->lease().gang.empty() && !MembersReady(task, now)) {
        if (gang_wait_for_ == task) return;  // asked again on a later pass
        continue;                            // given up
      }
      std::vector<int> runner_ports = ports;
      if (!task->lease().gang.empty()) {
        absl::StatusOr<std::vector<int>> tunnels = OpenGangTunnels(task->lease(), &*load);
        if (!tunnels.ok()) {
          queue_.pop_front();
          GiveUp(task, absl::Status(tunnels.status().code(), absl::StrCat("cannot reach the gang: ", tunnels.status().message())),
                 FailureClass::kRetryable);
          continue;
        }
        runner_ports = *tunnels;
      }
      if (!runner_.running()) {
        // The gang's tunnels, kept by the supervisor, admit the new runner's process.
        if (absl::Status s = runner_.Start(RunnerOf(task->lease()), runner_ports); !s.ok()) {
          // A runner that will not start may be a passing problem of this machine.
          queue_.pop_front();
          GiveUp(task, absl::Status(s.code(), absl::StrCat("cannot start the runner: ", s.message())),
                 FailureClass::kRetryable);
          continue;
        }
      }
      runner_.Load(*load, model, task->lease().model_digest.empty() ? task->lease().model : task->lease().model_digest,
                   now);
      loading_for_ = task;
      return;  // the runner says `loaded` (or why not)
    }
    if (runner_.loading()) return;
    queue_.pop_front();
    std::optional<TaskRun::Batch> batch = task->NextBatch(now);
    if (!batch) {  // nothing left to run (it resumed at its end)
      FinishTask(task, TaskRun::BatchEnd::kFinished, now);
      continue;
    }
    batches_[batch->id] = task;
    runner_.StartBatch(batch->id, batch->records, now);
  }
}

bool ExecutorAgent::MembersReady(TaskPtr task, absl::Time now) {
  absl::Status members = GangMembersAnswer(task->lease());
  if (members.ok()) {
    gang_wait_for_ = nullptr;
    return true;
  }
  // The members start their gates when their own lease answers reach them: a moment, usually.
  if (gang_wait_for_ != task) {
    gang_wait_for_ = task;
    gang_wait_since_ = now;
  }
  const absl::Duration wait = options_.gang ? options_.gang->member_wait : absl::Seconds(60);
  if (now - gang_wait_since_ < wait) return false;
  gang_wait_for_ = nullptr;
  // A member that never came up: counted. One that answered this attempt before (its runner
  // crashed on a record since, and this is the next try) and went away: preempted.
  GiveUp(task, absl::UnavailableError(absl::StrCat(members.message(), " (waited ", absl::FormatDuration(wait), ")")),
         task->crashes() > 0 ? FailureClass::kPreempted : FailureClass::kRetryable);
  return false;
}

void ExecutorAgent::TakeRunnerEvents(absl::Time now) {
  more_events_ = false;
  for (int taken = 0; runner_.running() && taken < kEventsPerPass; ++taken) {
    auto event = runner_.Poll();
    if (!event.ok()) return OnRunnerDied(event.status());
    if (!*event) return;
    OnEvent(**event, now);
  }
  more_events_ = runner_.running();  // the burst goes on next pass, after the other work
}

void ExecutorAgent::OnEvent(const runner_protocol::Event& event, absl::Time now) {
  using Type = runner_protocol::Event::Type;
  if (TakeVerificationEvent(event, now)) return;  // a spot check's (agent_verify.cc)
  switch (event.type) {
    case Type::kLoaded: {
      // Where the weights went (llama.cpp's own account: the devices' buffers, the gang's
      // share): what an operator asks first of a GPU or a gang.
      const Json info = JsonField(event.body, "info");
      Json facts = Json::object();
      for (const char* key : {"device", "layers", "offloaded_layers", "model_buffers", "gang"}) {
        if (info.is_object() && info.contains(key)) facts[key] = info[key];
      }
      MINIONS_LOG(Info) << "runner loaded " << JsonString(event.body, "model") << ": " << DumpJson(facts);
      runner_.Loaded();
      loading_for_ = nullptr;
      return;
    }
    case Type::kError:
      if (JsonString(event.body, "op") == "load" && runner_.loading()) {
        // A model that cannot be loaded will not load next time either.
        TaskPtr task = loading_for_;
        runner_.LoadFailed();
        loading_for_ = nullptr;
        if (task) {
          // Across a gang, a member may be what failed: retryable (counted), on another gang.
          GiveUp(task, absl::InvalidArgumentError(absl::StrCat("cannot load the model: ", event.message)),
                 task->lease().gang.empty() ? FailureClass::kPermanent : FailureClass::kRetryable);
        }
        return;
      }
      MINIONS_LOG(Warning) << "runner error" << (event.batch.empty() ? "" : " for batch " + event.batch) << ": "
                           << event.message;
      return;
    case Type::kResult: {
      auto it = batches_.find(event.batch);
      if (it == batches_.end()) return;  // a batch given up already
      TaskPtr task = it->second;
      runner_.Heard(now, true);
      task->OnResult(event.batch, event.index, JsonField(event.body, "output"));
      MaybeCheckpoint(task, now);
      return;
    }
    case Type::kBatchDone: {
      auto it = batches_.find(event.batch);
      if (it == batches_.end()) return;
      TaskPtr task = it->second;
      batches_.erase(it);
      runner_.Heard(now, RunnerBusy());
      FinishTask(task, task->OnBatchDone(event.batch, JsonBool(event.body, "cancelled")), now);
      return;
    }
    case Type::kReady:
    case Type::kPong:
    case Type::kVerdict:  // of a spot check given up already: nothing to match it to
      return;
  }
}

void ExecutorAgent::CheckRunner(absl::Time now) {
  if (!runner_.running()) return;
  if (runner_.LoadTimedOut(now)) {
    TaskPtr task = loading_for_;
    MINIONS_LOG(Warning) << "the runner did not load its model within " << options_.load_timeout << "; ending it";
    DropRunner();
    if (task) {
      GiveUp(task,
             absl::DeadlineExceededError(absl::StrCat("the runner did not load the model within ",
                                                      absl::FormatDuration(options_.load_timeout))),
             FailureClass::kRetryable);
    }
    return;
  }
  if (!runner_.Hung(now)) return;  // never while frozen
  const absl::Duration silence = runner_.Silence(now);
  const absl::Duration limit = runner_.hang_limit();
  std::vector<TaskPtr> held = DropRunner();
  MINIONS_LOG(Warning) << "the runner said nothing for " << silence << " while holding " << held.size()
                       << " tasks (a hang past " << limit << "): killed";
  for (TaskPtr task : held) {
    GiveUp(task,
           absl::DeadlineExceededError(absl::StrCat("the runner made no progress for ", absl::FormatDuration(silence),
                                                    " and was killed as hung")),
           FailureClass::kRetryable);
  }
}

std::vector<ExecutorAgent::TaskPtr> ExecutorAgent::DropRunner() {
  std::vector<TaskPtr> held;
  for (const auto& [batch, task] : batches_) held.push_back(task);
  std::sort(held.begin(), held.end(), [](TaskPtr a, TaskPtr b) { return a->started() < b->started(); });
  batches_.clear();
  runner_.Stop();  // SIGKILL and reap, its tunnels too: its memory is the machine's again
  loading_for_ = nullptr;
  return held;
}

void ExecutorAgent::OnRunnerDied(const absl::Status& why) {
  const bool on_purpose = runner_.TakeKilledOnPurpose();
  MINIONS_LOG(Warning) << "the runner died: " << why.message();
  TaskPtr loading = loading_for_;
  std::vector<TaskPtr> victims = DropRunner();
  // A gang leader's runner also dies when a member goes (its rpc connection drops): then the
  // attempt is preempted, not failed, and resumes from its checkpoint on a new gang. When every
  // member's gate still answers, the runner died of its own accord, like any runner: below.
  auto member_gone = [&](TaskPtr task) -> std::optional<absl::Status> {
    if (task->lease().gang.empty()) return std::nullopt;
    if (on_purpose) return absl::UnavailableError(absl::StrCat("the gang's runner was ended: ", why.message()));
    absl::Status members = GangMembersAnswer(task->lease());
    if (members.ok()) {
      MINIONS_LOG(Warning) << Describe(task->lease().ref)
                           << " every gang member still answers: the runner crashed on its own";
      return std::nullopt;
    }
    return absl::UnavailableError(absl::StrCat("the gang's runner ended (", members.message(), "): ", why.message()));
  };
  std::vector<TaskPtr> again;
  for (TaskPtr task : victims) {
    if (std::optional<absl::Status> gone = member_gone(task)) {
      GiveUp(task, *gone, FailureClass::kPreempted);
      continue;
    }
    if (on_purpose) {
      task->OnRunnerGone();  // killed for the owner: it runs again later, nothing to isolate
      again.push_back(task);
    } else if (task->OnRunnerCrashed(victims.size() == 1, std::string(why.message()))) {
      again.push_back(task);
    } else {
      GiveUp(task,
             absl::UnavailableError(absl::StrCat("the runner failed ", task->crashes(), " times; last: ", why.message())),
             FailureClass::kRetryable);
    }
  }
  // They go first, in their order, when a new runner is up.
  queue_.insert(queue_.begin(), again.begin(), again.end());
  if (loading && on_purpose) return;
  if (std::optional<absl::Status> gone = loading ? member_gone(loading) : std::nullopt) {
    GiveUp(loading, absl::UnavailableError(absl::StrCat("while loading: ", gone->message())), FailureClass::kPreempted);
  } else if (loading) {
    GiveUp(loading, absl::UnavailableError(absl::StrCat("the runner ended while loading the model: ", why.message())),
           FailureClass::kRetryable);
  }
}

void ExecutorAgent::KillRunner(const char* why) { runner_.Kill(why); }

}  // namespace minions
