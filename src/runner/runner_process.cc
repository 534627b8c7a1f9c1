#include "runner/runner_process.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace minions {

using runner_protocol::Event;

absl::StatusOr<std::unique_ptr<RunnerProcess>> RunnerProcess::Start(const Options& options) {
  auto process = std::unique_ptr<RunnerProcess>(new RunnerProcess());
  ProcessRunner::Options runner_options;
  runner_options.command = options.command;
  runner_options.environment = options.environment;
  runner_options.stderr_path = options.stderr_path;
  RunnerProcess* self = process.get();
  auto runner = ProcessRunner::Start(runner_options, [self] { self->Notify(); });
  if (!runner.ok()) return runner.status();
  process->runner_ = std::move(*runner);
  process->program_ = options.command[0];
  auto ready = process->Next(options.start_timeout);
  if (!ready.ok()) {
    if (absl::IsDeadlineExceeded(ready.status())) {
      return absl::DeadlineExceededError(absl::StrCat("runner '", options.command[0], "' did not say ready within ",
                                                      absl::FormatDuration(options.start_timeout)));
    }
    return ready.status();
  }
  process->ready_ = ready->body;  // ProcessRunner let only a valid `ready` through first
  return process;
}

RunnerProcess::~RunnerProcess() = default;

void RunnerProcess::Notify() {
  absl::MutexLock lock(&mu_);
  ++arrivals_;
}

absl::StatusOr<Event> RunnerProcess::Next(absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  while (true) {
    uint64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = arrivals_;
    }
    auto event = runner_->Poll();
    if (!event.ok()) return event.status();
    if (*event) return std::move(**event);
    absl::MutexLock lock(&mu_);
    auto arrived = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrivals_ != seen; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline)) {
      return absl::DeadlineExceededError("no line from the runner before the deadline");
    }
  }
}

absl::StatusOr<Json> RunnerProcess::Load(const runner_protocol::LoadRequest& request) {
  runner_->Load(request);
  while (true) {
    auto event = Next(absl::Minutes(10));
    if (!event.ok()) return event.status();
    if (event->type == Event::Type::kLoaded) {
      const Json& info = JsonField(event->body, "info");
      return info.is_object() ? info : Json::object();
    }
    if (event->type == Event::Type::kError) return absl::InvalidArgumentError(event->message);
    // Anything else (a pong, a late result) is not ours to handle here.
  }
}

absl::StatusOr<Json> RunnerProcess::RunBatch(const std::string& batch, const std::vector<std::string>& records,
                                             const ResultCallback& on_result) {
  runner_->StartBatch(batch, records);
  while (true) {
    auto event = Next(absl::InfiniteDuration());
    if (!event.ok()) return event.status();
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

absl::StatusOr<Json> RunnerProcess::Rescore(const rescore::Request& request, const VerdictCallback& on_verdict) {
  runner_->StartRescore(request);
  while (true) {
    auto event = Next(absl::InfiniteDuration());
    if (!event.ok()) return event.status();
    if (event->batch != request.batch) continue;
    switch (event->type) {
      case Event::Type::kVerdict:
        if (event->index < request.items.size()) on_verdict(event->index, event->body);
        break;
      case Event::Type::kBatchDone:
        return event->body;
      case Event::Type::kError:
        return absl::InternalError(absl::StrCat("runner error in rescore ", request.batch, ": ", event->message));
      default:
        break;
    }
  }
}

absl::Status RunnerProcess::StartBatch(const std::string& batch, const std::vector<std::string>& records) {
  runner_->StartBatch(batch, records);
  return absl::OkStatus();
}

absl::StatusOr<Event> RunnerProcess::NextEvent(absl::Duration timeout) { return Next(timeout); }

absl::Status RunnerProcess::Cancel(const std::string& batch) {
  runner_->Cancel(batch);
  return absl::OkStatus();
}

ExitInfo RunnerProcess::Shutdown(absl::Duration grace) {
  runner_->RequestShutdown();
  const absl::Time deadline = absl::Now() + grace;
  while (true) {
    auto event = Next(deadline - absl::Now());
    if (event.ok()) continue;  // whatever it still says
    if (absl::IsDeadlineExceeded(event.status())) runner_->Kill();
    break;
  }
  // After a kill its end arrives once the reader has seen it.
  while (true) {
    auto event = Next(absl::Seconds(10));
    if (!event.ok()) break;
  }
  return runner_->exit_info().value_or(ExitInfo{});
}

}  // namespace minions
