// RunnerService's `rescore` command (docs/runner-protocol.md, "rescore"), apart from the `run`
// path it shares nothing with but the output.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "runner/llama/rescorer.h"
#include "runner/llama/runner_service.h"

namespace minions::llama_runner {

void RunnerService::HandleRescore(const rescore::Request& request) {
  const auto started = std::chrono::steady_clock::now();
  runner_protocol::BatchStats stats;
  stats.records = request.items.size();
  // A verification context of its own per command: the generation slots' cached prefixes stay.
  std::unique_ptr<Rescorer> rescorer;
  if (engine_) rescorer = std::make_unique<Rescorer>(*engine_);
  for (size_t i = 0; i < request.items.size(); ++i) {
    const rescore::Item& item = request.items[i];
    const std::string custom_id = ParseRecordLine(item.record).custom_id;
    if (Stopping() || IsCancelled(request.batch)) {
      stats.cancelled = true;
      ++stats.errors;
      Emit(rescore::EncodeUncheckable(request.batch, i, custom_id, "the check was cancelled"), false);
      continue;
    }
    if (!rescorer) {
      ++stats.errors;
      Emit(rescore::EncodeUncheckable(request.batch, i, custom_id, "no model is loaded (send a load command first)"),
           false);
      continue;
    }
    auto verdict = rescorer->Check(item.record, item.output, request.thresholds);
    if (!verdict.ok()) {
      ++stats.errors;
      MINIONS_LOG(Warning) << "cannot re-score " << custom_id << ": " << verdict.status().message();
      Emit(rescore::EncodeUncheckable(request.batch, i, custom_id, std::string(verdict.status().message())), false);
      continue;
    }
    stats.prompt_tokens += verdict->counted_prompt_tokens;
    stats.completion_tokens += verdict->counted_completion_tokens;
    Emit(rescore::EncodeVerdict(request.batch, i, custom_id, *verdict), false);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.erase(request.batch);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  Emit(runner_protocol::EncodeBatchDone(request.batch, stats));
}

}  // namespace minions::llama_runner
