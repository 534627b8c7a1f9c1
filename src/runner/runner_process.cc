#include "runner/runner_process.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {

using runner_protocol::Event;

absl::StatusOr<std::unique_ptr<RunnerProcess>> RunnerProcess::Start(const Options& options) {
  Subprocess::Options sp;
  sp.argv = options.command;
  sp.stderr_path = options.stderr_path;
  auto process = Subprocess::Start(sp);
  if (!process.ok()) return process.status();
  auto runner = std::unique_ptr<RunnerProcess>(new RunnerProcess(std::move(*process)));
  auto line = runner->process_->ReadLine(options.start_timeout);
  if (!line.ok()) {
    if (absl::IsDeadlineExceeded(line.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "runner '", options.command[0], "' did not say ready within ", absl::FormatDuration(options.start_timeout)));
    }
    return runner->Died("start");
  }
  auto event = runner_protocol::DecodeEvent(*line);
  if (!event.ok() || event->type != Event::Type::kReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", options.command[0], "' does not speak the runner protocol; its first line was: ",
        Excerpt(*line)));
  }
  int64_t protocol = JsonInt(event->body, "protocol");
  if (protocol != runner_protocol::kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("runner speaks protocol ", protocol,
                                                      ", this executor speaks ",
                                                      runner_protocol::kProtocolVersion));
  }
  runner->ready_ = event->body;
  return runner;
}

RunnerProcess::~RunnerProcess() = default;

absl::Status RunnerProcess::Send(const std::string& line) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return process_->Write(line);
}

absl::Status RunnerProcess::Died(std::string_view during) {
  auto info = process_->Wait(absl::Seconds(2));
  return absl::UnavailableError(absl::StrCat(
      "runner ", process_->pid(), " ended during ", std::string(during), ": ",
      info.ok() ? info->ToString() : "closed its output"));
}

absl::StatusOr<Json> RunnerProcess::Load(const runner_protocol::LoadRequest& request) {
  if (auto s = Send(runner_protocol::EncodeLoad(request)); !s.ok()) return Died("load");
  while (true) {
    auto line = process_->ReadLine(absl::Minutes(10));
    if (!line.ok()) {
      if (absl::IsDeadlineExceeded(line.status())) return line.status();
      return Died("load");
    }
    auto event = runner_protocol::DecodeEvent(*line);
    if (!event.ok()) return event.status();
    if (event->type == Event::Type::kLoaded) {
      const Json& info = JsonField(event->body, "info");
      return info.is_object() ? info : Json::object();
    }
    if (event->type == Event::Type::kError) return absl::InvalidArgumentError(event->message);
    // Anything else (a pong, a late result) is not ours to handle here.
  }
}

absl::StatusOr<Json> RunnerProcess::RunBatch(const std::string& batch,
                                             const std::vector<std::string>& records,
                                             const ResultCallback& on_result) {
  if (auto s = Send(runner_protocol::EncodeRun({batch, records})); !s.ok()) return Died("run");
  while (true) {
    auto line = process_->ReadLine();
    if (!line.ok()) return Died(absl::StrCat("batch ", batch));
    auto event = runner_protocol::DecodeEvent(*line);
    if (!event.ok()) {
      MINIONS_LOG(Warning) << "ignoring a malformed runner line: " << event.status().message();
      continue;
    }
    if (event->batch != batch) continue;  // a reply to an earlier, abandoned batch
    switch (event->type) {
      case Event::Type::kResult:
        if (event->index >= records.size()) {
          MINIONS_LOG(Warning) << "runner sent result index " << event->index << " for a batch of "
                               << records.size();
          continue;
        }
        on_result(event->index, JsonField(event->body, "output"));
        break;
      case Event::Type::kBatchDone:
        return event->body;
      case Event::Type::kError:
        return absl::InternalError(absl::StrCat("runner error in batch ", batch, ": ", event->message));
      default:
        break;
    }
  }
}

absl::Status RunnerProcess::StartBatch(const std::string& batch, const std::vector<std::string>& records) {
  if (auto s = Send(runner_protocol::EncodeRun({batch, records})); !s.ok()) return Died("run");
  return absl::OkStatus();
}

absl::StatusOr<runner_protocol::Event> RunnerProcess::NextEvent(absl::Duration timeout) {
  while (true) {
    auto line = process_->ReadLine(timeout);
    if (!line.ok()) {
      if (absl::IsDeadlineExceeded(line.status())) return line.status();
      return Died("a batch");
    }
    auto event = runner_protocol::DecodeEvent(*line);
    if (!event.ok()) {
      MINIONS_LOG(Warning) << "ignoring a malformed runner line: " << event.status().message();
      continue;
    }
    return event;
  }
}

absl::Status RunnerProcess::Cancel(const std::string& batch) {
  return Send(runner_protocol::EncodeCancel(batch));
}

ExitInfo RunnerProcess::Shutdown(absl::Duration grace) {
  (void)Send(runner_protocol::EncodeShutdown());
  process_->CloseStdin();
  auto info = process_->Wait(grace);
  if (info.ok()) return *info;
  process_->Signal(SIGKILL);
  return process_->Wait().value_or(ExitInfo{});
}

}  // namespace minions
