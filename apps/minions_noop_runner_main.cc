// minions-noop-runner: a runner that does no inference. It answers every record at once with an
// empty completion, so a pool that uses it measures the control plane alone: leasing, staging,
// the runner pipe, uploads, completion and finalisation. Each answer states a usage (the record
// line's bytes as prompt tokens, one completion token), so the accounting of tokens is tested
// with it too.
//
// Two switches make it a test double for failure handling (the tests of checkpoints and poison
// records use them; production never sets them):
//   MINIONS_NOOP_RECORD_DELAY_MS=N   answer each record N ms after the previous one
//   MINIONS_NOOP_CRASH_ON=TEXT       abort (a crash, as a poison record would cause) on reaching a
//                                    record whose line contains TEXT
//   MINIONS_NOOP_STALL_ON=TEXT       stop answering (alive, reading nothing more) on reaching a
//                                    record whose line contains TEXT: a hung runner
//
// It reads one command and answers it before it reads the next, one line at a time, as
// examples/echo_runner.py does: whoever drives it must read its answers while it feeds it.

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "runner/batch_record.h"
#include "runner/protocol.h"

int main() {
  using namespace minions;
  std::ios::sync_with_stdio(false);
  const char* delay_env = std::getenv("MINIONS_NOOP_RECORD_DELAY_MS");
  const auto delay = std::chrono::milliseconds(delay_env ? std::atoi(delay_env) : 0);
  const char* crash_env = std::getenv("MINIONS_NOOP_CRASH_ON");
  const std::string crash_on = crash_env ? crash_env : "";
  const char* stall_env = std::getenv("MINIONS_NOOP_STALL_ON");
  const std::string stall_on = stall_env ? stall_env : "";
  std::cout << runner_protocol::EncodeReady("noop", "1") << std::flush;
  std::string line;
  while (std::getline(std::cin, line)) {
    auto command = runner_protocol::DecodeCommand(line);
    if (!command.ok()) {
      std::cout << runner_protocol::EncodeError("unknown", "", std::string(command.status().message())) << std::flush;
      continue;
    }
    switch (command->op) {
      case runner_protocol::Command::Op::kLoad:
        std::cout << runner_protocol::EncodeLoaded(command->load.model, Json::object());
        break;
      case runner_protocol::Command::Op::kRun: {
        runner_protocol::BatchStats stats;
        stats.records = command->run.records.size();
        for (size_t i = 0; i < command->run.records.size(); ++i) {
          if (!crash_on.empty() && command->run.records[i].find(crash_on) != std::string::npos) {
            std::cout << std::flush;  // the answers before it are out
            std::abort();
          }
          if (!stall_on.empty() && command->run.records[i].find(stall_on) != std::string::npos) {
            std::cout << std::flush;
            while (true) pause();
          }
          if (delay.count() > 0) {
            std::cout << std::flush;
            std::this_thread::sleep_for(delay);
          }
          ParsedRecord parsed = ParseRecordLine(command->run.records[i]);
          const Usage usage{.prompt_tokens = static_cast<int>(command->run.records[i].size()),
                            .completion_tokens = 1};
          Json out = parsed.ok() ? MakeResponseLine(parsed.custom_id, MakeCompletionBody(parsed.custom_id, "noop", "",
                                                                                         "stop", usage, 0))
                                 : MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message);
          stats.errors += !parsed.ok();
          std::cout << runner_protocol::EncodeResult(command->run.batch, i, out);
        }
        std::cout << runner_protocol::EncodeBatchDone(command->run.batch, stats);
        break;
      }
      case runner_protocol::Command::Op::kRescore: {
        // No model, nothing to check with: every item is uncheckable (never a verdict).
        runner_protocol::BatchStats stats;
        stats.records = stats.errors = command->rescore.items.size();
        for (size_t i = 0; i < command->rescore.items.size(); ++i) {
          std::cout << rescore::EncodeUncheckable(command->rescore.batch, i,
                                                  ParseRecordLine(command->rescore.items[i].record).custom_id,
                                                  "the no-op runner has no model to re-score with");
        }
        std::cout << runner_protocol::EncodeBatchDone(command->rescore.batch, stats);
        break;
      }
      case runner_protocol::Command::Op::kPing:
        std::cout << runner_protocol::EncodePong(command->id);
        break;
      case runner_protocol::Command::Op::kCancel:
        break;
      case runner_protocol::Command::Op::kShutdown:
        return 0;
    }
    std::cout << std::flush;
  }
  return 0;
}
