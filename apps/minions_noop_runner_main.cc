// minions-noop-runner: a runner that does no inference. It answers every record at once with an
// empty completion, so a pool that uses it measures the control plane alone: leasing, staging,
// the runner pipe, uploads, completion and finalisation.

#include <iostream>
#include <string>

#include "runner/batch_record.h"
#include "runner/protocol.h"

int main() {
  using namespace minions;
  std::ios::sync_with_stdio(false);
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
          ParsedRecord parsed = ParseRecordLine(command->run.records[i]);
          Json out = parsed.ok() ? MakeResponseLine(parsed.custom_id, MakeCompletionBody(parsed.custom_id, "noop", "",
                                                                                         "stop", {}, 0))
                                 : MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message);
          stats.errors += !parsed.ok();
          std::cout << runner_protocol::EncodeResult(command->run.batch, i, out);
        }
        std::cout << runner_protocol::EncodeBatchDone(command->run.batch, stats);
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
