#include "runner/llama/runner_service.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "minions/version.h"

namespace minions::llama_runner {

using runner_protocol::Command;

namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

RunnerService::RunnerService(int input_fd, FILE* output) : input_fd_(input_fd), output_(output) {}

void RunnerService::Emit(const std::string& line, bool flush) {
  std::lock_guard<std::mutex> lock(output_mu_);
  fwrite(line.data(), 1, line.size(), output_);
  if (flush) fflush(output_);
}

void RunnerService::StepDone() {
  std::lock_guard<std::mutex> lock(output_mu_);
  fflush(output_);
}

void RunnerService::ReadCommands() {
  std::string buffer;
  char chunk[65536];
  auto handle_line = [&](std::string_view line) {
    if (line.empty()) return;
    auto command = runner_protocol::DecodeCommand(line);
    if (!command.ok()) {
      Emit(runner_protocol::EncodeError("unknown", "", std::string(command.status().message())));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    switch (command->op) {
      case Command::Op::kPing:
        Emit(runner_protocol::EncodePong(command->id));
        return;
      case Command::Op::kShutdown:
        shutdown_ = true;
        cv_.notify_all();
        return;
      case Command::Op::kCancel: {
        // A batch still waiting in the queue is answered at once: every record cancelled. One
        // already streaming is marked; the main thread drops its records at the next step.
        bool queued = false;
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (it->op == Command::Op::kRun && (command->id.empty() || it->run.batch == command->id)) {
            runner_protocol::BatchStats stats;
            for (size_t i = 0; i < it->run.records.size(); ++i) {
              auto parsed = ParseRecordLine(it->run.records[i]);
              Emit(runner_protocol::EncodeResult(
                  it->run.batch, i, MakeErrorLine(parsed.custom_id, kErrorCancelled, "the batch was cancelled")));
            }
            stats.records = stats.errors = it->run.records.size();
            stats.cancelled = true;
            Emit(runner_protocol::EncodeBatchDone(it->run.batch, stats));
            it = queue_.erase(it);
            queued = true;
          } else {
            ++it;
          }
        }
        if (!queued || command->id.empty()) cancelled_.insert(command->id);
        return;
      }
      default:
        queue_.push_back(std::move(*command));
        cv_.notify_all();
        return;
    }
  };
  while (true) {
    ssize_t n = ::read(input_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = buffer.find('\n', start)) != std::string::npos) {
      handle_line(std::string_view(buffer).substr(start, nl - start));
      start = nl + 1;
    }
    buffer.erase(0, start);
  }
  if (!buffer.empty()) handle_line(buffer);
  // End of input means the executor is gone: nobody will read what we compute, so stop now.
  std::lock_guard<std::mutex> lock(mu_);
  input_closed_ = true;
  shutdown_ = true;
  cv_.notify_all();
}

int RunnerService::Run() {
  Emit(runner_protocol::EncodeReady("minions-llama-runner", kVersion));
  std::thread reader([this] { ReadCommands(); });
  reader.detach();  // it ends with the input; at exit the process takes it down
  while (true) {
    Command command;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !queue_.empty() || input_closed_; });
      if (shutdown_ || queue_.empty()) break;
      command = std::move(queue_.front());
      queue_.pop_front();
    }
    if (command.op == Command::Op::kLoad) {
      HandleLoad(command.load);
    } else if (command.op == Command::Op::kRescore) {
      HandleRescore(command.rescore);
    } else if (command.op == Command::Op::kRun) {
      Expand(std::move(command.run));
      // The engine pulls further runs from the queue itself while it works (see Next()).
      if (engine_ && !stream_.empty()) engine_->ServeStream(*this);
      StepDone();
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_.erase("");  // a cancel-everything applies to what was in flight, not to later runs
      }
      // Whatever the engine could not take (no model, a shutdown) is answered here.
      while (!stream_.empty()) {
        WorkItem item = std::move(stream_.front());
        stream_.pop_front();
        if (!engine_ && !Stopping()) {
          Answer(item.batch, item.index,
                 MakeErrorLine(item.request.custom_id, kErrorRunnerFailed, "no model is loaded (send a load command first)"),
                 true, {});
        } else {
          OnDropped(item);
        }
      }
    }
  }
  engine_.reset();
  return 0;
}

void RunnerService::HandleLoad(const runner_protocol::LoadRequest& load) {
  // The same model with the same options stays loaded: that is what makes tasks after the
  // first one cheap.
  if (engine_ && engine_model_ == load.model && engine_options_.ToJson() == load.options.ToJson() &&
      engine_gang_ == load.gang) {
    Emit(runner_protocol::EncodeLoaded(load.model, engine_->Info()));
    return;
  }
  engine_.reset();  // free the old model's memory before loading the next one
  auto start = std::chrono::steady_clock::now();
  auto engine = LlamaEngine::Load(load.model, load.options, load.gang);
  if (!engine.ok()) {
    MINIONS_LOG(Error) << "load failed: " << engine.status().message();
    Emit(runner_protocol::EncodeError("load", "", std::string(engine.status().message())));
    return;
  }
  engine_ = std::move(*engine);
  engine_model_ = load.model;
  engine_options_ = load.options;
  engine_gang_ = load.gang;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Json info = engine_->Info();
  info["load_seconds"] = seconds;
  MINIONS_LOG(Info) << "loaded model " << load.model << " in " << seconds << " s";
  Emit(runner_protocol::EncodeLoaded(load.model, info));
}

void RunnerService::Expand(runner_protocol::RunRequest run) {
  BatchState& state = batches_[run.batch];
  state.total = run.records.size();
  state.stats.records = run.records.size();
  state.started = SteadySeconds();
  if (run.records.empty()) {
    Emit(runner_protocol::EncodeBatchDone(run.batch, state.stats));
    batches_.erase(run.batch);
    return;
  }
  for (size_t i = 0; i < run.records.size(); ++i) {
    ParsedRecord parsed = ParseRecordLine(run.records[i]);
    if (!parsed.ok()) {
      Answer(run.batch, i, MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message, parsed.error_param),
             true, {});
      continue;
    }
    stream_.push_back({run.batch, i, std::move(*parsed.request)});
  }
}

void RunnerService::Answer(const std::string& batch, size_t index, const Json& output, bool is_error,
                           const Usage& usage, int cached_tokens) {
  auto it = batches_.find(batch);
  if (it == batches_.end()) return;
  BatchState& state = it->second;
  state.stats.errors += is_error;
  state.stats.prompt_tokens += usage.prompt_tokens;
  state.stats.completion_tokens += usage.completion_tokens;
  state.stats.cached_prompt_tokens += cached_tokens;
  Emit(runner_protocol::EncodeResult(batch, index, output), /*flush=*/false);
  if (++state.answered < state.total) return;
  state.stats.seconds = SteadySeconds() - state.started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state.stats.cancelled |= cancelled_.erase(batch) > 0;
  }
  Emit(runner_protocol::EncodeBatchDone(batch, state.stats));
  batches_.erase(it);
}

bool RunnerService::IsCancelled(const std::string& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_.count(batch) > 0 || cancelled_.count("") > 0;
}

std::optional<WorkItem> RunnerService::Next() {
  if (stream_.empty()) {
    // Take the next queued run into the stream, unless a load must go first.
    runner_protocol::RunRequest run;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutdown_ || queue_.empty() || queue_.front().op != Command::Op::kRun) return std::nullopt;
      run = std::move(queue_.front().run);
      queue_.pop_front();
    }
    Expand(std::move(run));
    if (stream_.empty()) return Next();  // every record of that run was malformed
  }
  WorkItem item = std::move(stream_.front());
  stream_.pop_front();
  return item;
}

void RunnerService::OnResult(WorkResult result) {
  Answer(result.batch, result.index, result.output, result.is_error, result.usage, result.cached_tokens);
}

bool RunnerService::Cancelled(const WorkItem& item) { return IsCancelled(item.batch); }

void RunnerService::OnDropped(const WorkItem& item) {
  const char* why = Stopping() ? "the runner is shutting down" : "the batch was cancelled";
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(item.batch);  // batch_done reports it as cancelled
  }
  Answer(item.batch, item.index, MakeErrorLine(item.request.custom_id, kErrorCancelled, why), true, {});
}

bool RunnerService::Stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}

}  // namespace minions::llama_runner
