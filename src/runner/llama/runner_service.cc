#include "runner/llama/runner_service.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "minions/version.h"

namespace minions::llama_runner {

using runner_protocol::Command;

RunnerService::RunnerService(int input_fd, FILE* output) : input_fd_(input_fd), output_(output) {}

void RunnerService::Emit(const std::string& line) {
  std::lock_guard<std::mutex> lock(output_mu_);
  fwrite(line.data(), 1, line.size(), output_);
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
        cancel_running_ = true;
        cv_.notify_all();
        return;
      case Command::Op::kCancel: {
        if (command->id == running_batch_ || command->id.empty()) cancel_running_ = true;
        // A queued batch is answered at once: every record cancelled.
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (it->op == Command::Op::kRun && (command->id.empty() || it->run.batch == command->id)) {
            runner_protocol::BatchStats stats;
            for (size_t i = 0; i < it->run.records.size(); ++i) {
              auto parsed = ParseRecordLine(it->run.records[i]);
              Emit(runner_protocol::EncodeResult(
                  it->run.batch, i,
                  MakeErrorLine(parsed.custom_id, kErrorCancelled, "the batch was cancelled")));
            }
            stats.records = stats.errors = it->run.records.size();
            stats.cancelled = true;
            Emit(runner_protocol::EncodeBatchDone(it->run.batch, stats));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
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
  cancel_running_ = true;
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
      if (shutdown_) break;
      if (queue_.empty()) break;  // input closed and nothing left to do
      command = std::move(queue_.front());
      queue_.pop_front();
      if (command.op == Command::Op::kRun) {
        running_batch_ = command.run.batch;
        cancel_running_ = false;
      }
    }
    if (command.op == Command::Op::kLoad) {
      HandleLoad(command.load);
    } else if (command.op == Command::Op::kRun) {
      HandleRun(command.run);
      std::lock_guard<std::mutex> lock(mu_);
      running_batch_.clear();
    }
  }
  engine_.reset();
  return 0;
}

void RunnerService::HandleLoad(const runner_protocol::LoadRequest& load) {
  // The same model with the same options stays loaded: that is what makes tasks after the
  // first one cheap.
  if (engine_ && engine_model_ == load.model &&
      engine_options_.ToJson() == load.options.ToJson()) {
    Emit(runner_protocol::EncodeLoaded(load.model, engine_->Info()));
    return;
  }
  engine_.reset();  // free the old model's memory before loading the next one
  auto start = std::chrono::steady_clock::now();
  auto engine = LlamaEngine::Load(load.model, load.options);
  if (!engine.ok()) {
    MINIONS_LOG(Error) << "load failed: " << engine.status().message();
    Emit(runner_protocol::EncodeError("load", "", std::string(engine.status().message())));
    return;
  }
  engine_ = std::move(*engine);
  engine_model_ = load.model;
  engine_options_ = load.options;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Json info = engine_->Info();
  info["load_seconds"] = seconds;
  MINIONS_LOG(Info) << "loaded model " << load.model << " in " << seconds << " s";
  Emit(runner_protocol::EncodeLoaded(load.model, info));
}

void RunnerService::HandleRun(const runner_protocol::RunRequest& run) {
  auto start = std::chrono::steady_clock::now();
  runner_protocol::BatchStats stats;
  stats.records = run.records.size();
  auto emit_result = [&](size_t index, const Json& output, bool is_error, const Usage& usage) {
    if (is_error) ++stats.errors;
    stats.prompt_tokens += usage.prompt_tokens;
    stats.completion_tokens += usage.completion_tokens;
    Emit(runner_protocol::EncodeResult(run.batch, index, output));
  };

  std::vector<WorkItem> items;
  std::vector<std::string> custom_ids(run.records.size());
  for (size_t i = 0; i < run.records.size(); ++i) {
    ParsedRecord parsed = ParseRecordLine(run.records[i]);
    custom_ids[i] = parsed.custom_id;
    if (!parsed.ok()) {
      emit_result(i, MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message), true, {});
      continue;
    }
    if (!engine_) {
      emit_result(i, MakeErrorLine(parsed.custom_id, kErrorRunnerFailed,
                                   "no model is loaded (send a load command first)"),
                  true, {});
      continue;
    }
    items.push_back({i, std::move(*parsed.request)});
  }
  if (engine_ && !items.empty()) {
    auto unserved = engine_->Serve(
        std::move(items),
        [&](WorkResult result) { emit_result(result.index, result.output, result.is_error, result.usage); },
        [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return cancel_running_;
        });
    for (size_t index : unserved) {
      emit_result(index, MakeErrorLine(custom_ids[index], kErrorCancelled, "the batch was cancelled"),
                  true, {});
    }
    stats.cancelled = !unserved.empty();
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Emit(runner_protocol::EncodeBatchDone(run.batch, stats));
}

}  // namespace minions::llama_runner
