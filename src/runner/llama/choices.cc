#include "runner/llama/choices.h"

namespace minions::llama_runner {

std::vector<WorkItem> ExpandChoices(WorkItem item) {
  std::vector<WorkItem> items;
  const int n = item.request.n;
  if (n <= 1) {
    items.push_back(std::move(item));
    return items;
  }
  auto group = std::make_shared<ChoiceGroup>();
  group->n = group->remaining = n;
  group->outputs.resize(static_cast<size_t>(n));
  const uint64_t seed = item.request.sampling.seed.value_or(DefaultSeed(item.request.custom_id));
  for (int k = 0; k < n; ++k) {
    WorkItem choice = item;
    choice.choice = k;
    choice.group = group;
    // Streams far apart in seed space (the golden ratio's odd multiplier), choice 0 the record's own.
    choice.request.sampling.seed = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(k);
    items.push_back(std::move(choice));
  }
  return items;
}

std::optional<WorkResult> AddChoice(const WorkItem& item, WorkResult result) {
  ChoiceGroup& group = *item.group;
  if (group.answered) return std::nullopt;
  group.outputs[static_cast<size_t>(item.choice)] = std::move(result.output);
  // The prompt is the record's once; every choice's tokens count.
  group.usage.prompt_tokens = result.usage.prompt_tokens;
  group.usage.completion_tokens += result.usage.completion_tokens;
  if (result.usage.reasoning_tokens) {
    group.usage.reasoning_tokens = group.usage.reasoning_tokens.value_or(0) + *result.usage.reasoning_tokens;
  }
  group.cached_tokens = std::max(group.cached_tokens, result.cached_tokens);
  if (--group.remaining > 0) return std::nullopt;
  group.answered = true;
  Json line = std::move(group.outputs[0]);
  Json& body = line["response"]["body"];
  for (int k = 1; k < group.n; ++k) {
    Json choice = std::move(group.outputs[static_cast<size_t>(k)]["response"]["body"]["choices"][0]);
    choice["index"] = k;
    body["choices"].push_back(std::move(choice));
  }
  body["usage"] = group.usage.ToJson();
  WorkResult merged{item.batch, item.index, std::move(line), false, group.usage};
  merged.cached_tokens = group.cached_tokens;
  return merged;
}

bool ClaimAnswer(const WorkItem& item) {
  if (!item.group) return true;
  if (item.group->answered) return false;
  item.group->answered = true;
  return true;
}

}  // namespace minions::llama_runner
