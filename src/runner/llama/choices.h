#pragma once
// n > 1: the choices of one record. Each choice is generated in a decode slot of its own, with its
// own seeded stream (choice 0 keeps the record's seed, so n = 1 and choice 0 of n agree); siblings
// share their prompt's KV cells through the engine's prefix sharing. The record is answered once,
// when every choice is in: one body with choices 0..n-1, its usage counting the prompt once and
// every choice's tokens.
//
// Ownership: a ChoiceGroup is shared by the choice items of its record. Threads: the engine's one
// serving thread.

#include <optional>
#include <vector>

#include "common/json_util.h"
#include "runner/llama/llama_engine.h"

namespace minions::llama_runner {

struct ChoiceGroup {
  int n = 1;
  int remaining = 1;
  bool answered = false;  // the record got its line (all choices, an error, or dropped)
  std::vector<Json> outputs;  // by choice, the choice's own output line
  Usage usage;
  int cached_tokens = 0;
};

// The record's n choice items (each with its group and its choice's seed); the item itself when
// n is 1.
std::vector<WorkItem> ExpandChoices(WorkItem item);

// Keeps a finished choice; once the last one is in, the record's merged result.
std::optional<WorkResult> AddChoice(const WorkItem& item, WorkResult result);

// True the first time one of the group's items may answer the record alone (an error, a drop);
// the group is answered from then on. Items without a group always may.
bool ClaimAnswer(const WorkItem& item);

}  // namespace minions::llama_runner
