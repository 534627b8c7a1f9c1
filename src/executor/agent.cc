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
#include "runner/batch_record.h"

namespace minions {
namespace {

std::string ReadFileOr(const std::string& path, const std::string& fallback) {
  std::ifstream in(path);
  std::string value;
  if (in && std::getline(in, value) && !value.empty()) return value;
  return fallback;
}

bool SameLease(const v1::LeaseRef& a, const v1::LeaseRef& b) {
  return a.job_id() == b.job_id() && a.task_index() == b.task_index() && a.attempt() == b.attempt();
}

std::string Describe(const v1::TaskLease& lease) {
  return absl::StrCat("job=", lease.ref().job_id(), " task=", lease.ref().task_index(),
                      " attempt=", lease.ref().attempt());
}

// A result line that goes to the error file: an error, or no usable response.
bool IsErrorLine(const Json& line) {
  return !JsonField(line, "error").is_null() || !JsonField(line, "response").is_object();
}

inline constexpr std::string_view kErrorRunnerCrashed = "runner_crashed";

}  // namespace

ExecutorAgent::ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client,
                             std::unique_ptr<BlobClient> blobs, Clock* clock)
    : options_(std::move(options)), client_(std::move(client)), blobs_(std::move(blobs)), clock_(clock) {
  if (options_.runner_command.empty()) options_.runner_command = {SiblingProgram("minions-llama-runner")};
  options_.max_prefetch = std::max(1, options_.max_prefetch);
}

ExecutorAgent::~ExecutorAgent() {
  heartbeat_stop_ = true;
  clock_->Wake();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string ExecutorAgent::id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return id_;
}

std::vector<ExecutorAgent::TaskPtr> ExecutorAgent::ActiveTasks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TaskPtr> tasks;
  for (const auto& [key, task] : active_) tasks.push_back(task);
  return tasks;
}

void ExecutorAgent::Drain() {
  drain_ = true;
  clock_->Wake();
}

void ExecutorAgent::Stop() {
  stop_ = true;
  drain_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (runner_) {
    for (const auto& [key, task] : active_) (void)runner_->Cancel(task->batch);
  }
  clock_->Wake();
}

absl::Status ExecutorAgent::Register() {
  std::string id_file = options_.state_dir.empty() ? "" : options_.state_dir + "/executor-id";
  v1::RegisterRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_executor_id(id_.empty() && !id_file.empty() ? ReadFileOr(id_file, "") : id_);
  }
  v1::Capabilities capabilities = DetectCapabilities(options_.name);
  capabilities.set_max_tasks(options_.max_prefetch);
  *request.mutable_capabilities() = capabilities;
  auto reply = client_->Register(request);
  if (!reply.ok()) return reply.status();
  ttl_ms_ = std::max<int64_t>(reply->lease_ttl_ms(), 300);
  {
    std::lock_guard<std::mutex> lock(mu_);
    id_ = reply->executor_id();
  }
  if (!id_file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.state_dir, ec);
    std::ofstream(id_file, std::ios::trunc) << reply->executor_id() << "\n";
  }
  SetLogComponent(absl::StrCat("executor ", reply->executor_id()));
  MINIONS_LOG(Info) << "registered as executor=" << reply->executor_id() << " (lease ttl " << reply->lease_ttl_ms()
                    << " ms)";
  return absl::OkStatus();
}

int ExecutorAgent::PrefetchWindow() const {
  // Enough tasks to cover prefetch_target beyond the one running; at least two so the runner
  // always has the next task queued.
  double want = 1 + absl::ToDoubleSeconds(options_.prefetch_target) / std::max(avg_task_seconds_, 1e-3);
  return std::clamp(static_cast<int>(std::ceil(want)), 2, options_.max_prefetch);
}

absl::Status ExecutorAgent::Run() {
  // Register, riding out a server that is not up yet.
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::Status s = Register();
    if (s.ok()) break;
    if (stop_ || drain_) return absl::OkStatus();
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) return s;
    MINIONS_LOG(Warning) << "cannot register yet: " << s.message();
    clock_->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });

  while (true) {
    size_t active;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active = active_.size();
    }
    if (drain_ && active == 0) break;
    // Owner first: the availability controller may hold the loop (agent_yield.cc).
    bool hold = ApplyWorkMode();
    if (!drain_ && !hold) LeaseMore();
    if (!hold) FeedRunner();
    bool in_runner = false;
    for (const auto& task : ActiveTasks()) in_runner |= task->in_runner;
    if (!in_runner) {
      FlushCompletions();
      if (hold) {
        clock_->SleepFor(absl::Seconds(1));  // woken at once when the mode changes
        continue;
      }
      // Idle: the next lease call long-polls, unless the last one failed (then wait it out).
      // Waiting only for completions to go through: retry them shortly.
      if (!to_complete_.empty()) {
        clock_->SleepFor(options_.idle_poll);
      } else if (clock_->Now() < next_lease_try_) {
        clock_->SleepUntil(next_lease_try_);
      }
      continue;
    }
    // Wait for the runner; come back soon enough to top up the window. Events already waiting
    // are taken in one go, so a burst of finished tasks is completed in one call.
    auto event = runner_->NextEvent(absl::Milliseconds(50));
    for (int taken = 0; event.ok() && taken < 4096; ++taken) {
      OnEvent(*event);
      if (!runner_) break;
      event = runner_->NextEvent(absl::ZeroDuration());
    }
    if (!event.ok() && !absl::IsDeadlineExceeded(event.status())) OnRunnerDied(event.status());
    FlushCompletions();
  }

  heartbeat_stop_ = true;
  clock_->Wake();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (frozen_) SignalRunner(SIGCONT);  // a stopped runner cannot read its shutdown
  std::unique_ptr<RunnerProcess> runner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner = std::move(runner_);
  }
  if (runner) runner->Shutdown(absl::Seconds(5));
  MINIONS_LOG(Info) << "executor stopped after " << tasks_completed_ << " tasks";
  return absl::OkStatus();
}

int ExecutorAgent::LeaseMore() {
  size_t held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = active_.size();
  }
  int window = PrefetchWindow();
  // Top up when half the window is free (one lease call brings several tiny tasks). An idle
  // executor long-polls: the server answers the moment a task is ready, so a submission starts
  // without a polling delay. A busy one asks at most every 50 ms when the queue is dry.
  if (static_cast<int>(held) > window / 2) return 0;
  absl::Time now = clock_->Now();
  if (now < next_lease_try_) return 0;
  if (held > 0 && now - last_empty_lease_ < absl::Milliseconds(50)) return 0;
  v1::LeaseRequest request;
  request.set_executor_id(id());
  request.set_max_tasks(window - static_cast<int>(held));
  if (held == 0 && !drain_) request.set_wait_ms(absl::ToInt64Milliseconds(options_.lease_wait));
  auto reply = client_->Lease(request);
  if (!reply.ok()) {
    if (absl::IsNotFound(reply.status())) (void)Register();  // the server forgot us (new database)
    MINIONS_LOG(Debug) << "lease failed: " << reply.status().message();
    last_empty_lease_ = now;
    next_lease_try_ = clock_->Now() + options_.idle_poll;  // do not hammer a server that is down
    return 0;
  }
  if (reply->leases().empty()) {
    last_empty_lease_ = now;
    // A server that answered a long poll early (an older one, or one shutting down) must not
    // turn this loop into a busy one.
    if (request.wait_ms() > 0 && clock_->Now() - now < options_.lease_wait / 2) {
      next_lease_try_ = clock_->Now() + options_.idle_poll;
    }
    return 0;
  }
  for (const auto& lease : reply->leases()) {
    TaskPtr task = Stage(lease);
    if (task) staged_.push_back(task);
  }
  return reply->leases_size();
}

ExecutorAgent::TaskPtr ExecutorAgent::Stage(const v1::TaskLease& lease) {
  auto task = std::make_shared<ActiveTask>();
  task->lease = lease;
  task->key = absl::StrCat(lease.ref().job_id(), "/", lease.ref().task_index(), "#", lease.ref().attempt());
  task->batch = task->key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_[task->key] = task;  // heartbeats cover it from now on
  }
  auto input = blobs_->GetRange(lease.input_url(), lease.byte_begin(), lease.byte_end());
  if (!input.ok()) {
    Report(task, absl::Status(input.status().code(), absl::StrCat("cannot read the input: ", input.status().message())),
           FailureClass::kRetryable);
    Forget(task);
    return nullptr;
  }
  task->records = SplitRecordLines(*input);
  if (static_cast<int64_t>(task->records.size()) != lease.n_records()) {
    Report(task,
           absl::DataLossError(absl::StrCat("the input range holds ", task->records.size(), " records, the task ",
                                            lease.n_records())),
           FailureClass::kPermanent);
    Forget(task);
    return nullptr;
  }
  if (lease.resume_from() < 0 || lease.resume_from() > lease.n_records() || lease.chunk_urls_size() == 0) {
    Report(task,
           absl::InvalidArgumentError(absl::StrCat("the lease resumes at record ", lease.resume_from(), " of ",
                                                   lease.n_records(), " with ", lease.chunk_urls_size(),
                                                   " chunk URLs")),
           FailureClass::kPermanent);
    Forget(task);
    return nullptr;
  }
  task->outputs.resize(task->records.size());
  task->resume_from = task->chunk_begin = lease.resume_from();
  task->last_chunk_at = clock_->Now();
  if (task->resume_from > 0) {
    MINIONS_LOG(Info) << Describe(lease) << " resumes after " << task->resume_from << " committed records";
  }
  return task;
}

absl::Status ExecutorAgent::EnsureRunner() {
  if (runner_) return absl::OkStatus();
  RunnerProcess::Options options;
  options.command = options_.sandbox ? options_.sandbox->Wrap(options_.runner_command) : options_.runner_command;
  options.stderr_path = options_.runner_log;
  auto runner = RunnerProcess::Start(options);
  if (!runner.ok()) return runner.status();
  std::lock_guard<std::mutex> lock(mu_);
  runner_ = std::move(*runner);
  if (options_.metrics) options_.metrics->SetRunnerPid(runner_->pid());  // metrics hook
  loaded_model_.clear();
  loaded_options_.clear();
  return absl::OkStatus();
}

absl::Status ExecutorAgent::LoadModel(const v1::TaskLease& lease) {
  runner_protocol::LoadRequest load;
  // Only from the owner's model folders, by real path (one answer for every refusal).
  absl::StatusOr<std::string> model = options_.models ? options_.models->Resolve(lease.model())
                                                      : absl::NotFoundError(ModelAccess::UnavailableMessage(lease.model()));
  if (!model.ok()) return model.status();
  load.model = *model;
  if (!lease.runner_options_json().empty()) {
    auto json = ParseJson(lease.runner_options_json());
    if (!json.ok()) return json.status();
    auto options = runner_protocol::LoadOptions::FromJson(*json);
    if (!options.ok()) return options.status();
    load.options = *options;
    if (options_.runner_threads > 0 && !JsonField(*json, "n_threads").is_number()) {
      load.options.n_threads = options_.runner_threads;
    }
  } else if (options_.runner_threads > 0) {
    load.options.n_threads = options_.runner_threads;
  }
  auto info = runner_->Load(load);
  if (!info.ok()) return info.status();
  loaded_model_ = lease.model();
  loaded_options_ = lease.runner_options_json();
  return absl::OkStatus();
}

void ExecutorAgent::FeedRunner() {
  while (!staged_.empty()) {
    TaskPtr task = staged_.front();
    if (task->cancelled || stop_) {
      staged_.pop_front();
      if (stop_ && !task->cancelled) {
        Report(task, absl::AbortedError("the executor is stopping"), FailureClass::kPreempted);
      }
      Forget(task);
      continue;
    }
    // A task under suspicion of crashing the runner runs alone: nothing joins it, and it waits
    // for the runner to empty.
    bool busy = false, suspect_running = false;
    for (const auto& other : ActiveTasks()) {
      if (!other->in_runner) continue;
      busy = true;
      suspect_running |= other->suspect;
    }
    if (suspect_running || (task->suspect && busy)) return;
    const auto& lease = task->lease;
    bool same_model = runner_ && loaded_model_ == lease.model() && loaded_options_ == lease.runner_options_json();
    if (!same_model) {
      // A model change waits until the runner has finished the previous model's tasks.
      if (busy) return;
      absl::Status s = EnsureRunner();
      if (s.ok()) s = LoadModel(lease);
      if (!s.ok()) {
        // A model that cannot be loaded will not load next time either; a runner that will not
        // start may be a passing problem of this machine.
        bool load_error = absl::IsInvalidArgument(s) || absl::IsNotFound(s);
        if (!load_error) {
          std::lock_guard<std::mutex> lock(mu_);
          runner_.reset();
        }
        staged_.pop_front();
        Report(task, absl::Status(s.code(), absl::StrCat(load_error ? "cannot load the model: " : "runner: ", s.message())),
               load_error ? FailureClass::kPermanent : FailureClass::kRetryable);
        Forget(task);
        continue;
      }
    }
    std::vector<size_t> indices;
    if (!task->isolation.empty()) {
      indices = std::move(task->isolation.front());
      task->isolation.pop_front();
    } else {
      indices = Unfinished(task);
    }
    if (indices.empty()) {  // nothing left to run (it resumed at its end)
      staged_.pop_front();
      task->started = clock_->Now();
      FinishTask(task, Json::object());
      continue;
    }
    std::vector<std::string> records;
    records.reserve(indices.size());
    for (size_t i : indices) records.push_back(task->records[i]);
    std::string batch = task->runs == 0 ? task->key : absl::StrCat(task->key, ".", task->runs);
    ++task->runs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task->batch = batch;
    }
    task->batch_records = std::move(indices);
    task->in_runner = true;
    task->started = clock_->Now();
    batches_[batch] = task;
    staged_.pop_front();
    if (absl::Status s = runner_->StartBatch(batch, records); !s.ok()) {
      OnRunnerDied(s);
      return;
    }
  }
}

std::vector<size_t> ExecutorAgent::Unfinished(const TaskPtr& task) const {
  std::vector<size_t> left;
  for (size_t i = task->resume_from; i < task->outputs.size(); ++i) {
    if (!task->outputs[i]) left.push_back(i);
  }
  return left;
}

void ExecutorAgent::OnEvent(const runner_protocol::Event& event) {
  auto it = batches_.find(event.batch);
  if (it == batches_.end()) return;  // a batch we already gave up
  TaskPtr task = it->second;
  if (event.type == runner_protocol::Event::Type::kResult) {
    if (event.index >= task->batch_records.size()) return;
    const size_t i = task->batch_records[event.index];
    const Json& line = JsonField(event.body, "output");
    if (!task->outputs[i]) {
      task->records_done.fetch_add(1);
      if (!JsonField(line, "error").is_null()) task->records_failed.fetch_add(1);
    }
    task->outputs[i] = line;
    if (absl::Status s = MaybeCheckpoint(task, false); !s.ok()) {
      MINIONS_LOG(Warning) << Describe(task->lease) << " checkpoint not uploaded (will retry): " << s.message();
    }
  } else if (event.type == runner_protocol::Event::Type::kBatchDone) {
    batches_.erase(it);
    if (!task->isolation.empty() && !JsonBool(event.body, "cancelled")) {
      task->in_runner = false;  // more groups of an isolated task to run, alone
      staged_.push_front(task);
      return;
    }
    FinishTask(task, event.body);
  } else if (event.type == runner_protocol::Event::Type::kError) {
    MINIONS_LOG(Warning) << "runner error for batch " << event.batch << ": " << event.message;
  }
}

absl::Status ExecutorAgent::MaybeCheckpoint(const TaskPtr& task, bool final) {
  const int64_t n = static_cast<int64_t>(task->records.size());
  // The last URL pair is kept for the final chunk: with none other left, only the end uploads.
  if (!final && static_cast<int>(task->chunks.size()) + 1 >= task->lease.chunk_urls_size()) return absl::OkStatus();
  // The finished prefix only grows: each record is looked at once, whatever the result order.
  int64_t end = std::max(task->prefix_end, task->chunk_begin);
  while (end < n && task->outputs[end]) ++end;
  task->prefix_end = end;
  const absl::Time now = clock_->Now();
  if (!final) {
    if (end == task->chunk_begin || end >= n) return absl::OkStatus();  // the final chunk carries it
    bool due = end - task->chunk_begin >= options_.checkpoint_records ||
               now - task->last_chunk_at >= options_.checkpoint_interval;
    if (!due) return absl::OkStatus();
  } else if (end < n) {
    return absl::InternalError("the final chunk has records without output");
  } else if (end == task->chunk_begin && !task->chunks.empty()) {
    return absl::OkStatus();  // everything is in chunks already
  }
  const int seq = static_cast<int>(task->chunks.size());
  if (seq >= task->lease.chunk_urls_size()) return absl::FailedPreconditionError("no chunk URL left");
  std::string output, errors;
  int64_t failed = 0;
  for (int64_t i = task->chunk_begin; i < end; ++i) {
    const Json& line = *task->outputs[i];
    bool is_error = IsErrorLine(line);
    (is_error ? errors : output) += DumpJson(line) + "\n";
    failed += is_error;
  }
  // Every chunk writes its output object (the finaliser reads a missing one as lost); a chunk
  // without error lines writes no error object.
  const v1::ChunkUrls& urls = task->lease.chunk_urls(seq);
  RETURN_IF_ERROR(blobs_->Put(urls.output_url(), output));
  if (!errors.empty()) RETURN_IF_ERROR(blobs_->Put(urls.errors_url(), errors));
  v1::Chunk chunk;
  chunk.set_attempt(task->lease.ref().attempt());
  chunk.set_seq(seq);
  chunk.set_begin(task->chunk_begin);
  chunk.set_end(end);
  chunk.set_records_failed(failed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    task->chunks.push_back(chunk);
  }
  task->chunk_begin = end;
  task->last_chunk_at = now;
  // Commit it now rather than at the next periodic heartbeat (up to TTL/3 away), at most a few
  // times a second: a loss costs one chunk, not one chunk plus a heartbeat interval.
  if (now - last_commit_wake_ >= absl::Milliseconds(250)) {
    last_commit_wake_ = now;
    heartbeat_now_ = true;
    clock_->Wake();
  }
  return absl::OkStatus();
}

void ExecutorAgent::FinishTask(const TaskPtr& task, const Json& batch_done) {
  double seconds = absl::ToDoubleSeconds(clock_->Now() - task->started);
  avg_task_seconds_ = 0.8 * avg_task_seconds_ + 0.2 * seconds;
  task->in_runner = false;
  if (stop_) {
    Report(task, absl::AbortedError("the executor is stopping"), FailureClass::kPreempted);
    return Forget(task);
  }
  if (task->cancelled) return Forget(task);
  if (JsonBool(batch_done, "cancelled")) {
    Report(task, absl::AbortedError("the runner cancelled the batch"), FailureClass::kRetryable);
    return Forget(task);
  }
  for (size_t i = task->resume_from; i < task->records.size(); ++i) {
    if (task->outputs[i]) continue;
    task->outputs[i] = MakeErrorLine(ParseRecordLine(task->records[i]).custom_id, kErrorRunnerFailed,
                                     "the runner gave no result for this record");
  }
  if (absl::Status s = MaybeCheckpoint(task, true); !s.ok()) {
    Report(task, absl::Status(s.code(), absl::StrCat("cannot upload the output: ", s.message())),
           FailureClass::kRetryable);
    return Forget(task);
  }
  to_complete_.push_back(task);
}

void ExecutorAgent::FlushCompletions() {
  if (to_complete_.empty() || clock_->Now() < next_completion_try_) return;
  v1::CompleteBatchRequest request;
  request.set_executor_id(id());
  std::vector<TaskPtr> sent;
  for (const TaskPtr& task : to_complete_) {
    if (task->cancelled) {
      Forget(task);
      continue;
    }
    v1::LeaseRef* ref = request.add_refs();
    *ref = task->lease.ref();
    int64_t failed = 0;
    for (const v1::Chunk& chunk : task->chunks) {
      failed += chunk.records_failed();
      *ref->add_chunks() = chunk;
    }
    ref->set_records_done(task->lease.n_records());
    ref->set_records_failed(failed);
    sent.push_back(task);
  }
  to_complete_.clear();
  if (sent.empty()) return;
  auto reply = client_->CompleteBatch(request);
  if (!reply.ok()) {
    // Keep them: the heartbeat keeps renewing their leases, and the next try may get through.
    MINIONS_LOG(Warning) << "cannot complete " << sent.size() << " tasks yet: " << reply.status().message();
    to_complete_ = std::move(sent);
    next_completion_try_ = clock_->Now() + absl::Milliseconds(500);
    return;
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    const v1::Outcome* outcome = i < static_cast<size_t>(reply->outcomes_size()) ? &reply->outcomes(i) : nullptr;
    if (outcome && outcome->code() == 0) {
      ++tasks_completed_;
      if (options_.metrics) options_.metrics->TaskCompleted();  // metrics hook
      MINIONS_LOG(Debug) << Describe(sent[i]->lease) << " completed: " << sent[i]->records_done
                         << " records run, " << sent[i]->records_failed << " errors";
    } else {
      MINIONS_LOG(Warning) << Describe(sent[i]->lease)
                           << " completion refused: " << (outcome ? outcome->message() : "no answer");
    }
    Forget(sent[i]);
  }
}

void ExecutorAgent::OnRunnerDied(const absl::Status& why) {
  MINIONS_LOG(Warning) << "the runner died: " << why.message();
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner_.reset();
  }
  loaded_model_.clear();
  batches_.clear();
  std::vector<TaskPtr> victims;
  for (const auto& task : ActiveTasks()) {
    if (task->in_runner) victims.push_back(task);
  }
  const bool on_purpose = killed_on_purpose_.exchange(false);
  std::vector<TaskPtr> again;
  for (const auto& task : victims) {
    task->in_runner = false;
    if (on_purpose && !task->cancelled && !stop_) {
      again.push_back(task);  // killed for the owner: it runs again later, nothing to isolate
      continue;
    }
    if (task->cancelled || stop_) {
      if (stop_) Report(task, absl::AbortedError("the executor is stopping"), FailureClass::kPreempted);
      Forget(task);
      continue;
    }
    if (!Isolate(task, victims.size() == 1, why)) {
      Report(task,
             absl::UnavailableError(absl::StrCat("the runner failed ", task->crashes, " times; last: ", why.message())),
             FailureClass::kRetryable);
      Forget(task);
      continue;
    }
    again.push_back(task);
  }
  // They go first, in their order, when a new runner is up.
  staged_.insert(staged_.begin(), again.begin(), again.end());
}

bool ExecutorAgent::Isolate(const TaskPtr& task, bool ran_alone, const absl::Status& why) {
  if (++task->crashes > options_.max_crashes_per_task) return false;
  task->suspect = true;
  std::vector<size_t> left;
  for (size_t i : task->batch_records) {
    if (!task->outputs[i]) left.push_back(i);
  }
  if (left.empty()) return true;
  if (!ran_alone) {
    // Whose record killed it is unknown: each task in the runner runs again, alone.
    task->isolation.push_front(std::move(left));
    return true;
  }
  if (left.size() == 1) {
    const size_t i = left[0];
    task->outputs[i] = MakeErrorLine(
        ParseRecordLine(task->records[i]).custom_id, kErrorRunnerCrashed,
        absl::StrCat("the runner crashed on this record, run alone: ", std::string(why.message())));
    task->records_done.fetch_add(1);
    task->records_failed.fetch_add(1);
    MINIONS_LOG(Warning) << Describe(task->lease) << " record " << (task->lease.first_record() + static_cast<int64_t>(i))
                         << " crashes the runner; reported as an error record";
    return true;
  }
  // Halve the group: the half holding the poison record crashes again, the other goes through.
  std::vector<size_t> second(left.begin() + static_cast<std::ptrdiff_t>(left.size() / 2), left.end());
  left.resize(left.size() / 2);
  task->isolation.push_front(std::move(second));
  task->isolation.push_front(std::move(left));
  return true;
}

void ExecutorAgent::Forget(const TaskPtr& task) {
  std::lock_guard<std::mutex> lock(mu_);
  active_.erase(task->key);
}

void ExecutorAgent::HeartbeatLoop() {
  absl::Time last_renewed = clock_->Now();
  while (!heartbeat_stop_) {
    absl::Duration ttl = absl::Milliseconds(ttl_ms_.load());
    // Every TTL/3, or at once when a chunk waits to be committed.
    absl::Time deadline = clock_->Now() + ttl / 3;
    while (!heartbeat_stop_ && !heartbeat_now_.exchange(false) && clock_->Now() < deadline) {
      clock_->SleepUntil(deadline);
    }
    if (heartbeat_stop_) break;
    std::vector<TaskPtr> tasks = ActiveTasks();
    v1::HeartbeatRequest request;
    request.set_executor_id(id());
    std::string reason;
    request.set_state(FleetState(!tasks.empty(), &reason));
    request.set_state_reason(reason);
    if (options_.metrics) {  // metrics hook
      options_.metrics->SetState(ParseExecutorState(request.state()).value_or(ExecutorState::kAvailable),
                                 request.state_reason());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& task : tasks) {
        v1::LeaseRef* ref = request.add_leases();
        *ref = task->lease.ref();
        ref->set_records_done(task->resume_from + task->records_done);
        ref->set_records_failed(task->records_failed);
        for (const v1::Chunk& chunk : task->chunks) *ref->add_chunks() = chunk;
      }
    }
    auto reply = client_->Heartbeat(request);
    absl::Time now = clock_->Now();
    if (!reply.ok()) {
      MINIONS_LOG(Warning) << "heartbeat failed: " << reply.status().message();
      if (!tasks.empty() && now - last_renewed >= ttl && !detached_) {
        // The server is away (restarting, or out of reach). Keep running: when it answers again,
        // the heartbeat re-attaches the leases that are still ours and cancels the others, and
        // every report stays fenced by its attempt, so nothing runs twice into the results.
        detached_ = true;
        MINIONS_LOG(Warning) << "no lease renewed for a whole TTL; carrying on until the server answers";
      }
      continue;
    }
    if (detached_) {
      detached_ = false;
      MINIONS_LOG(Info) << "the server answers again; re-attached " << reply->renewed_size() << " leases, "
                        << reply->cancel_size() << " were given to others";
    }
    last_renewed = now;
    if (reply->reregister()) {
      (void)Register();
      continue;
    }
    if (reply->drain() && !drain_) {
      MINIONS_LOG(Info) << "the server asked this executor to drain";
      Drain();
    }
    for (const auto& ref : reply->cancel()) {
      for (const auto& task : tasks) {
        if (!SameLease(ref, task->lease.ref()) || task->cancelled.exchange(true)) continue;
        MINIONS_LOG(Info) << Describe(task->lease) << " cancelled by the server";
        std::lock_guard<std::mutex> lock(mu_);
        if (runner_) (void)runner_->Cancel(task->batch);
      }
    }
  }
}

void ExecutorAgent::KillRunner(const char* why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (runner_) {
    MINIONS_LOG(Warning) << "killing the runner: " << why;
    killed_on_purpose_ = true;  // its death is not a crash: no record is to blame
    ::kill(runner_->pid(), SIGKILL);
  }
}

void ExecutorAgent::Report(const TaskPtr& task, absl::Status outcome, FailureClass failure) {
  if (task->cancelled) return;  // not ours to report any more
  v1::FailRequest request;
  request.set_executor_id(id());
  *request.mutable_ref() = task->lease.ref();
  {
    // Chunks uploaded since the last heartbeat are committed with the report: a preempted or
    // failed attempt hands back every record it finished.
    std::lock_guard<std::mutex> lock(mu_);
    for (const v1::Chunk& chunk : task->chunks) *request.mutable_ref()->add_chunks() = chunk;
  }
  request.set_failure_class(std::string(FailureClassName(failure)));
  request.set_message(std::string(outcome.message()));
  absl::Status s = client_->Fail(request);
  MINIONS_LOG(Warning) << Describe(task->lease) << " " << FailureClassName(failure) << ": " << outcome.message()
                       << (s.ok() ? "" : absl::StrCat(" (report refused: ", std::string(s.message()), ")"));
}

}  // namespace minions
