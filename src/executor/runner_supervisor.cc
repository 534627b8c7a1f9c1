#include "executor/runner_supervisor.h"

#include <signal.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace minions {

RunnerSupervisor::RunnerSupervisor(Options options, std::unique_ptr<RunnerFactory> built_in,
                                   std::map<std::string, std::shared_ptr<RunnerFactory>> declared,
                                   std::function<void()> on_event)
    : options_(options),
      built_in_(std::move(built_in)),
      declared_(std::move(declared)),
      on_event_(std::move(on_event)),
      watch_(options.hang) {}

RunnerSupervisor::~RunnerSupervisor() {
  // Its runner and tunnels end with it (not through Stop: the metrics may be gone by now).
  std::unique_ptr<Runner> ending;
  std::vector<std::unique_ptr<GangTunnel>> tunnels;
  {
    absl::MutexLock lock(&mu_);
    ending = std::move(runner_);
    tunnels.swap(tunnels_);
  }
  ending.reset();
  for (auto& tunnel : tunnels) tunnel->Stop();
}

bool RunnerSupervisor::running() const {
  absl::MutexLock lock(&mu_);
  return runner_ != nullptr;
}

bool RunnerSupervisor::Has(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  return runner_ != nullptr && model_ == model;
}

bool RunnerSupervisor::Is(const std::string& name, const std::vector<int>& ports) const {
  absl::MutexLock lock(&mu_);
  return runner_ != nullptr && name_ == name && ports_ == ports;
}

int64_t RunnerSupervisor::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

absl::Status RunnerSupervisor::Start(const std::string& name, const std::vector<int>& tcp_ports) {
  RunnerFactory* factory = built_in_.get();
  if (name != kBuiltInRunner) {
    auto declared = declared_.find(name);
    if (declared == declared_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("this executor offers no runner '", name, "'"));
    }
    factory = declared->second.get();
  }
  // Started outside the lock (a process starts): only the main loop starts runners.
  ASSIGN_OR_RETURN(std::unique_ptr<Runner> runner, factory->StartConnecting(on_event_, tcp_ports));
  const int pid = runner->pid();
  {
    absl::MutexLock lock(&mu_);
    runner_ = std::move(runner);
    ++generation_;
    name_ = name;
    ports_ = tcp_ports;
    watch_ = RunnerWatch(options_.hang);
    for (auto& tunnel : tunnels_) tunnel->AdmitProcess(pid);
  }
  if (options_.metrics) options_.metrics->SetRunnerPid(pid);  // metrics hook
  return absl::OkStatus();
}

void RunnerSupervisor::KeepTunnels(std::vector<std::unique_ptr<GangTunnel>> tunnels) {
  std::vector<std::unique_ptr<GangTunnel>> old;
  {
    absl::MutexLock lock(&mu_);
    old.swap(tunnels_);
    tunnels_ = std::move(tunnels);
  }
  for (auto& tunnel : old) tunnel->Stop();
}

void RunnerSupervisor::Load(const runner_protocol::LoadRequest& request, const std::string& model,
                            const std::string& reported, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!runner_) return;
  runner_->Load(request);
  model_ = model;
  reported_ = reported;
  loading_since_ = now;
}

bool RunnerSupervisor::loading() const {
  absl::MutexLock lock(&mu_);
  return loading_since_.has_value();
}

void RunnerSupervisor::Loaded() {
  absl::MutexLock lock(&mu_);
  loading_since_.reset();
}

void RunnerSupervisor::LoadFailed() {
  absl::MutexLock lock(&mu_);
  loading_since_.reset();
  model_.clear();
  reported_.clear();
}

bool RunnerSupervisor::LoadTimedOut(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return runner_ != nullptr && loading_since_ && now - *loading_since_ >= options_.load_timeout;
}

void RunnerSupervisor::StartBatch(const std::string& batch, const std::vector<std::string>& records, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!runner_) return;
  runner_->StartBatch(batch, records);
  watch_.Sent(now);
}

void RunnerSupervisor::StartRescore(const rescore::Request& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!runner_) return;
  runner_->StartRescore(request);
  watch_.Sent(now);
}

void RunnerSupervisor::Cancel(const std::string& batch) {
  absl::MutexLock lock(&mu_);
  if (runner_) runner_->Cancel(batch);
}

void RunnerSupervisor::Heard(absl::Time now, bool busy) {
  absl::MutexLock lock(&mu_);
  watch_.Heard(now, busy);
}

absl::StatusOr<std::optional<runner_protocol::Event>> RunnerSupervisor::Poll() {
  absl::MutexLock lock(&mu_);
  if (!runner_) return absl::FailedPreconditionError("no runner runs");
  return runner_->Poll();
}

bool RunnerSupervisor::Hung(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return runner_ != nullptr && !frozen_ && watch_.Hung(now);
}

absl::Duration RunnerSupervisor::Silence(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return watch_.Silence(now);
}

absl::Duration RunnerSupervisor::hang_limit() const {
  absl::MutexLock lock(&mu_);
  return watch_.limit();
}

absl::Time RunnerSupervisor::NextCheck() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = frozen_ ? absl::InfiniteFuture() : watch_.HungAt();
  if (loading_since_) next = std::min(next, *loading_since_ + options_.load_timeout);
  return next;
}

void RunnerSupervisor::Freeze(bool frozen, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!runner_) {
    frozen_ = false;
    return;
  }
  runner_->Signal(frozen ? SIGSTOP : SIGCONT);
  frozen_ = frozen;
  // A stopped runner says nothing, and is not hung for that.
  if (frozen) {
    watch_.Pause();
  } else {
    watch_.Resume(now);
  }
}

bool RunnerSupervisor::frozen() const {
  absl::MutexLock lock(&mu_);
  return frozen_;
}

void RunnerSupervisor::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  if (runner_) runner_->RequestShutdown();
}

bool RunnerSupervisor::Drained() {
  absl::MutexLock lock(&mu_);
  if (!runner_) return true;
  while (true) {
    auto event = runner_->Poll();
    if (!event.ok()) return true;
    if (!*event) return false;
  }
}

void RunnerSupervisor::Stop() {
  std::unique_ptr<Runner> ending;
  std::vector<std::unique_ptr<GangTunnel>> tunnels;
  {
    absl::MutexLock lock(&mu_);
    ending = std::move(runner_);
    tunnels.swap(tunnels_);  // a new runner gets its own (KeepTunnels)
    model_.clear();
    reported_.clear();
    ports_.clear();
    loading_since_.reset();
    watch_ = RunnerWatch(options_.hang);
    frozen_ = false;
  }
  ending.reset();  // SIGKILL and reap: its memory is the machine's again
  for (auto& tunnel : tunnels) tunnel->Stop();
  if (options_.metrics) options_.metrics->SetRunnerPid(0);  // metrics hook
}

bool RunnerSupervisor::TakeKilledOnPurpose() {
  absl::MutexLock lock(&mu_);
  const bool on_purpose = killed_on_purpose_;
  killed_on_purpose_ = false;
  return on_purpose;
}

int RunnerSupervisor::pid() const {
  absl::MutexLock lock(&mu_);
  return runner_ ? runner_->pid() : 0;
}

std::string RunnerSupervisor::model_loaded() const {
  absl::MutexLock lock(&mu_);
  return reported_;
}

void RunnerSupervisor::Kill(const char* why) {
  absl::MutexLock lock(&mu_);
  if (!runner_) return;
  MINIONS_LOG(Warning) << "killing the runner: " << why;
  killed_on_purpose_ = true;  // its death is not a crash: no record is to blame
  runner_->Kill();
}

}  // namespace minions
