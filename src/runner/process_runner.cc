#include "runner/process_runner.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {

using runner_protocol::Event;

absl::StatusOr<std::unique_ptr<ProcessRunner>> ProcessRunner::Start(const Options& options,
                                                                    std::function<void()> on_event) {
  if (options.command.empty()) return absl::InvalidArgumentError("no runner program given");
  Subprocess::Options sp;
  sp.argv = options.command;
  sp.extra_env = options.environment;
  sp.stderr_path = options.stderr_path;
  sp.own_process_group = true;  // what the runner starts dies with it
  auto process = Subprocess::Start(sp);
  if (!process.ok()) return process.status();
  return std::unique_ptr<ProcessRunner>(
      new ProcessRunner(std::move(*process), options.command[0], std::move(on_event)));
}

ProcessRunner::ProcessRunner(std::unique_ptr<Subprocess> process, std::string program,
                             std::function<void()> on_event)
    : process_(std::move(process)), program_(std::move(program)), on_event_(std::move(on_event)) {
  writer_ = std::thread([this] { WriterLoop(); });
  reader_ = std::thread([this] { ReaderLoop(); });
}

ProcessRunner::~ProcessRunner() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // The writer may be blocked in a write to a runner that reads nothing: the kill ends that
  // write (EPIPE), and ends the reader's stream.
  process_->Signal(SIGKILL);
  writer_.join();
  reader_.join();
  (void)process_->Wait();
}

void ProcessRunner::Send(std::string line) {
  absl::MutexLock lock(&mu_);
  if (close_stdin_) return;  // shut down: nothing more is read
  outbox_.push_back(std::move(line));
}

void ProcessRunner::Load(const runner_protocol::LoadRequest& request) { Send(runner_protocol::EncodeLoad(request)); }

void ProcessRunner::StartBatch(const std::string& batch, const std::vector<std::string>& records) {
  Send(runner_protocol::EncodeRun({batch, records}));
}

void ProcessRunner::StartRescore(const rescore::Request& request) { Send(rescore::EncodeRequest(request)); }

void ProcessRunner::Cancel(const std::string& batch) { Send(runner_protocol::EncodeCancel(batch)); }

void ProcessRunner::RequestShutdown() {
  Send(runner_protocol::EncodeShutdown());
  absl::MutexLock lock(&mu_);
  close_stdin_ = true;
}

void ProcessRunner::Kill() { process_->Signal(SIGKILL); }
void ProcessRunner::Signal(int signal) { process_->Signal(signal); }

std::optional<ExitInfo> ProcessRunner::exit_info() const {
  absl::MutexLock lock(&mu_);
  return exit_info_;
}

absl::StatusOr<std::optional<Event>> ProcessRunner::Poll() {
  absl::MutexLock lock(&mu_);
  if (!inbox_.empty()) {
    Event event = std::move(inbox_.front());
    inbox_.pop_front();
    return std::optional<Event>(std::move(event));
  }
  if (ended_) return *ended_;
  return std::optional<Event>();
}

void ProcessRunner::WriterLoop() {
  while (true) {
    std::string line;
    bool close = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ProcessRunner* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->outbox_.empty() || self->close_stdin_;
          },
          this));
      if (stopping_) return;
      if (!outbox_.empty()) {
        line = std::move(outbox_.front());
        outbox_.pop_front();
      } else {
        close = true;
      }
    }
    if (close) {
      process_->CloseStdin();
      return;
    }
    // Blocks while the runner is busy; the reader keeps draining its output meanwhile.
    if (!process_->Write(line).ok()) return;  // it is gone: the reader reports how
  }
}

void ProcessRunner::Push(Event event) {
  bool was_empty;
  {
    absl::MutexLock lock(&mu_);
    was_empty = inbox_.empty();
    inbox_.push_back(std::move(event));
  }
  // The consumer takes everything there is each time it is woken: one wake per burst.
  if (was_empty && on_event_) on_event_();
}

void ProcessRunner::End(absl::Status why) {
  {
    absl::MutexLock lock(&mu_);
    ended_ = std::move(why);
  }
  if (on_event_) on_event_();
}

void ProcessRunner::ReaderLoop() {
  bool ready = false;
  while (true) {
    auto line = process_->ReadLine();
    if (!line.ok()) break;
    auto event = runner_protocol::DecodeEvent(*line);
    if (!ready) {
      // The first line says whether this program speaks our protocol at all.
      if (!event.ok() || event->type != Event::Type::kReady) {
        process_->Signal(SIGKILL);
        End(absl::FailedPreconditionError(absl::StrCat("'", program_, "' does not speak the runner protocol; its first line was: ",
                                                       Excerpt(*line))));
        return;
      }
      int64_t protocol = JsonInt(event->body, "protocol");
      if (protocol != runner_protocol::kProtocolVersion) {
        process_->Signal(SIGKILL);
        End(absl::FailedPreconditionError(absl::StrCat("runner '", program_, "' speaks protocol ", protocol,
                                                       ", this executor speaks ",
                                                       runner_protocol::kProtocolVersion)));
        return;
      }
      ready = true;
    }
    if (!event.ok()) {
      MINIONS_LOG(Warning) << "ignoring a malformed runner line: " << event.status().message();
      continue;
    }
    Push(std::move(*event));
  }
  // The output closed: the runner is ending. One that closed its output and lingers is ended.
  auto exit = process_->Wait(absl::Seconds(2));
  if (!exit.ok()) {
    process_->Signal(SIGKILL);
    exit = process_->Wait();
  }
  std::string how = exit.ok() ? exit->ToString() : std::string(exit.status().message());
  {
    absl::MutexLock lock(&mu_);
    if (exit.ok()) exit_info_ = *exit;
  }
  End(absl::UnavailableError(absl::StrCat("runner ", process_->pid(), " ended: ", how)));
}

}  // namespace minions
