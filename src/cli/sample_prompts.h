#pragma once
// Deterministic sample input for the demo, tests and benchmarks: OpenAI Batch request lines.

#include <string>
#include <vector>

namespace minions::cli {

struct SamplePromptOptions {
  size_t records = 200;
  int max_tokens = 24;
  bool include_bad_lines = true;   // a malformed line and an unsupported url, to show error lines
  bool include_embeddings = true;  // a few /v1/embeddings records
  bool greedy_only = false;        // temperature 0 everywhere
};

std::vector<std::string> SamplePromptLines(const SamplePromptOptions& options);

}  // namespace minions::cli
