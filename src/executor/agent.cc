#include "executor/agent.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
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

v1::LeaseRef RefOf(const v1::TaskLease& lease, int64_t done, int64_t failed) {
  v1::LeaseRef ref = lease.ref();
  ref.set_records_done(done);
  ref.set_records_failed(failed);
  return ref;
}

bool SameLease(const v1::LeaseRef& a, const v1::LeaseRef& b) {
  return a.job_id() == b.job_id() && a.task_index() == b.task_index() && a.attempt() == b.attempt();
}

}  // namespace

ExecutorAgent::ExecutorAgent(AgentOptions options, std::unique_ptr<ControlPlaneClient> client,
                             std::unique_ptr<BlobClient> blobs, Clock* clock)
    : options_(std::move(options)), client_(std::move(client)), blobs_(std::move(blobs)), clock_(clock) {
  if (options_.runner_command.empty()) options_.runner_command = {SiblingProgram("minions-llama-runner")};
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

void ExecutorAgent::Drain() {
  drain_ = true;
  clock_->Wake();
}

void ExecutorAgent::Stop() {
  stop_ = true;
  drain_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (active_ && runner_) (void)runner_->Cancel(active_->batch);
  clock_->Wake();
}

absl::Status ExecutorAgent::Register() {
  std::string id_file = options_.state_dir.empty() ? "" : options_.state_dir + "/executor-id";
  v1::RegisterRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_executor_id(id_.empty() && !id_file.empty() ? ReadFileOr(id_file, "") : id_);
  }
  *request.mutable_capabilities() = DetectCapabilities(options_.name);
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

  while (!drain_) {
    v1::LeaseRequest request;
    request.set_executor_id(id());
    request.set_max_tasks(1);
    auto reply = client_->Lease(request);
    if (!reply.ok()) {
      if (absl::IsNotFound(reply.status())) (void)Register();  // the server forgot us (new database)
      MINIONS_LOG(Debug) << "lease failed: " << reply.status().message();
      clock_->SleepFor(std::max(options_.idle_poll, absl::Milliseconds(500)));
      continue;
    }
    if (reply->leases().empty()) {
      clock_->SleepFor(options_.idle_poll);
      continue;
    }
    for (const auto& lease : reply->leases()) RunTask(lease);
  }

  heartbeat_stop_ = true;
  clock_->Wake();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::unique_ptr<RunnerProcess> runner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner = std::move(runner_);
  }
  if (runner) runner->Shutdown(absl::Seconds(5));
  MINIONS_LOG(Info) << "executor stopped after " << tasks_completed_ << " tasks";
  return absl::OkStatus();
}

void ExecutorAgent::HeartbeatLoop() {
  absl::Time last_renewed = clock_->Now();
  while (!heartbeat_stop_) {
    absl::Duration ttl = absl::Milliseconds(ttl_ms_.load());
    clock_->SleepFor(ttl / 3);
    if (heartbeat_stop_) break;
    std::shared_ptr<ActiveTask> task;
    v1::HeartbeatRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task = active_;
      request.set_executor_id(id_);
    }
    request.set_state(drain_ ? "draining" : (task ? "busy" : "available"));
    if (task) *request.add_leases() = RefOf(task->lease, task->records_done, task->records_failed);
    auto reply = client_->Heartbeat(request);
    absl::Time now = clock_->Now();
    if (!reply.ok()) {
      MINIONS_LOG(Warning) << "heartbeat failed: " << reply.status().message();
      if (task && now - last_renewed >= ttl && !task->lease_lost.exchange(true)) {
        // The lease has run out on the server's side too: the task is someone else's now.
        KillRunner("could not renew the lease for a whole TTL");
      }
      continue;
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
      if (task && SameLease(ref, task->lease.ref()) && !task->cancelled.exchange(true)) {
        MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                          << " cancelled by the server";
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
    ::kill(runner_->pid(), SIGKILL);
  }
}

absl::Status ExecutorAgent::PrepareRunner(const v1::TaskLease& lease) {
  if (!runner_) {
    RunnerProcess::Options options;
    options.command = options_.runner_command;
    options.stderr_path = options_.runner_log;
    auto runner = RunnerProcess::Start(options);
    if (!runner.ok()) return runner.status();
    std::lock_guard<std::mutex> lock(mu_);
    runner_ = std::move(*runner);
    loaded_model_.clear();
  }
  runner_protocol::LoadRequest load;
  load.model = lease.model();
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
  loaded_model_ = load.model;
  return absl::OkStatus();
}

void ExecutorAgent::Report(const std::shared_ptr<ActiveTask>& task, absl::Status outcome, FailureClass failure) {
  const auto& ref = task->lease.ref();
  if (task->lease_lost || task->cancelled) return;  // not ours to report any more
  if (outcome.ok()) {
    v1::CompleteRequest request;
    request.set_executor_id(id());
    *request.mutable_ref() = RefOf(task->lease, task->records_done, task->records_failed);
    absl::Status s = client_->Complete(request);
    if (s.ok()) {
      ++tasks_completed_;
      MINIONS_LOG(Info) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                        << " completed: " << task->records_done << " records, " << task->records_failed << " errors";
    } else {
      MINIONS_LOG(Warning) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                           << " completion refused: " << s.message();
    }
    return;
  }
  v1::FailRequest request;
  request.set_executor_id(id());
  *request.mutable_ref() = task->lease.ref();
  request.set_failure_class(std::string(FailureClassName(failure)));
  request.set_message(std::string(outcome.message()));
  absl::Status s = client_->Fail(request);
  MINIONS_LOG(Warning) << "job=" << ref.job_id() << " task=" << ref.task_index() << " attempt=" << ref.attempt()
                       << " " << FailureClassName(failure) << ": " << outcome.message()
                       << (s.ok() ? "" : absl::StrCat(" (report refused: ", std::string(s.message()), ")"));
}

void ExecutorAgent::RunTask(const v1::TaskLease& lease) {
  auto task = std::make_shared<ActiveTask>();
  task->lease = lease;
  task->batch = absl::StrCat(lease.ref().job_id(), "/", lease.ref().task_index(), "#", lease.ref().attempt());
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = task;
  }
  auto finish = [&](absl::Status outcome, FailureClass failure = FailureClass::kRetryable) {
    Report(task, std::move(outcome), failure);
    std::lock_guard<std::mutex> lock(mu_);
    active_.reset();
  };

  auto input = blobs_->GetRange(lease.input_url(), lease.byte_begin(), lease.byte_end());
  if (!input.ok()) return finish(absl::Status(input.status().code(), absl::StrCat("cannot read the input: ", input.status().message())));
  std::vector<std::string> records = SplitRecordLines(*input);
  if (static_cast<int64_t>(records.size()) != lease.n_records()) {
    return finish(absl::DataLossError(absl::StrCat("the input range holds ", records.size(), " records, the task ",
                                                   lease.n_records())),
                  FailureClass::kPermanent);
  }
  if (absl::Status s = PrepareRunner(lease); !s.ok()) {
    // A model that cannot be loaded will not load next time either; a runner that will not start
    // may be a passing problem of this machine.
    bool load_error = absl::IsInvalidArgument(s) || absl::IsNotFound(s);
    if (!load_error) {
      std::lock_guard<std::mutex> lock(mu_);
      runner_.reset();
    }
    return finish(absl::Status(s.code(), absl::StrCat(load_error ? "cannot load the model: " : "runner: ", s.message())),
                  load_error ? FailureClass::kPermanent : FailureClass::kRetryable);
  }

  std::vector<std::optional<Json>> outputs(records.size());
  auto done = runner_->RunBatch(task->batch, records, [&](size_t index, const Json& line) {
    outputs[index] = line;
    task->records_done.fetch_add(1);
    if (!JsonField(line, "error").is_null()) task->records_failed.fetch_add(1);
  });
  if (!done.ok()) {
    // The runner died: from our own kill (lease lost) or a crash.
    {
      std::lock_guard<std::mutex> lock(mu_);
      runner_.reset();
    }
    return finish(absl::UnavailableError(absl::StrCat("the runner failed: ", done.status().message())));
  }
  if (stop_) return finish(absl::AbortedError("the executor is stopping"), FailureClass::kPreempted);
  if (task->cancelled) return finish(absl::CancelledError("cancelled"));
  if (JsonBool(*done, "cancelled")) return finish(absl::AbortedError("the runner cancelled the batch"));

  std::string output, errors;
  int64_t failed = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    Json line = outputs[i] ? *outputs[i]
                           : MakeErrorLine(ParseRecordLine(records[i]).custom_id, kErrorRunnerFailed,
                                           "the runner gave no result for this record");
    bool is_error = !JsonField(line, "error").is_null() || !JsonField(line, "response").is_object();
    (is_error ? errors : output) += DumpJson(line) + "\n";
    failed += is_error;
  }
  task->records_done = static_cast<int64_t>(records.size());
  task->records_failed = failed;
  if (absl::Status s = blobs_->Put(lease.output_url(), output); !s.ok()) {
    return finish(absl::Status(s.code(), absl::StrCat("cannot upload the output: ", s.message())));
  }
  if (absl::Status s = blobs_->Put(lease.errors_url(), errors); !s.ok()) {
    return finish(absl::Status(s.code(), absl::StrCat("cannot upload the errors: ", s.message())));
  }
  finish(absl::OkStatus());
}

}  // namespace minions
