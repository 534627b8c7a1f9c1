#include "cli/sample_prompts.h"

#include "absl/strings/str_cat.h"
#include "common/json_util.h"

namespace minions::cli {
namespace {

const char* const kTopics[] = {
    "the water cycle",      "how a bicycle gear works", "why the sky is blue",
    "the history of tea",   "how vaccines train the immune system",
    "binary search",        "the rules of chess",       "photosynthesis",
    "how a compiler works", "the moons of Jupiter",     "sourdough bread",
    "plate tectonics",      "the Fibonacci sequence",   "how batteries store energy",
    "the printing press",   "coral reefs"};
const char* const kStyles[] = {"in one sentence", "for a ten-year-old", "as a haiku",
                               "in three bullet points", "with an analogy"};

}  // namespace

std::vector<std::string> SamplePromptLines(const SamplePromptOptions& options) {
  std::vector<std::string> lines;
  const size_t n_topics = sizeof(kTopics) / sizeof(kTopics[0]);
  const size_t n_styles = sizeof(kStyles) / sizeof(kStyles[0]);
  for (size_t i = 0; i < options.records; ++i) {
    std::string id = absl::StrCat("request-", i + 1);
    const char* topic = kTopics[i % n_topics];
    const char* style = kStyles[(i / n_topics) % n_styles];
    if (options.include_bad_lines && i == 17) {
      lines.push_back(absl::StrCat("{\"custom_id\": \"", id, "\", \"method\": \"POST\", this is not json"));
      continue;
    }
    if (options.include_bad_lines && i == 42) {
      lines.push_back(DumpJson({{"custom_id", id}, {"method", "POST"}, {"url", "/v1/images/generations"},
                                {"body", {{"prompt", "a cat"}}}}));
      continue;
    }
    Json body;
    std::string url;
    if (options.include_embeddings && i % 50 == 7) {
      url = "/v1/embeddings";
      body = {{"model", "minions-test"}, {"input", absl::StrCat("A note about ", topic)}};
    } else if (i % 3 == 0) {
      url = "/v1/completions";
      body = {{"model", "minions-test"},
              {"prompt", absl::StrCat("Here is a short explanation of ", topic, ":")},
              {"max_tokens", options.max_tokens}};
    } else {
      url = "/v1/chat/completions";
      body = {{"model", "minions-test"},
              {"messages", Json::array({{{"role", "system"}, {"content", "You are a concise teacher."}},
                                        {{"role", "user"}, {"content", absl::StrCat("Explain ", topic, " ", style, ".")}}})},
              {"max_tokens", options.max_tokens}};
    }
    if (url != "/v1/embeddings") {
      if (options.greedy_only || i % 2 == 0) {
        body["temperature"] = 0;
      } else {
        body["temperature"] = 0.8;
        body["top_p"] = 0.95;
        body["seed"] = 1000 + i;
      }
    }
    lines.push_back(DumpJson({{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}));
  }
  return lines;
}

}  // namespace minions::cli
