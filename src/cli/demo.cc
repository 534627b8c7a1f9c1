#include "cli/demo.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cli/local_run.h"
#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "common/subprocess.h"

namespace minions::cli {
namespace fs = std::filesystem;

std::string MinionsHome() {
  if (const char* home = std::getenv("MINIONS_HOME"); home && *home) return home;
  const char* user_home = std::getenv("HOME");
  return absl::StrCat(user_home && *user_home ? user_home : "/tmp", "/.minions");
}

namespace {

// Runs minions-make-test-model unless the model exists.
bool EnsureTestModel(const std::string& path) {
  if (fs::exists(path)) return true;
  printf("making a test model (random weights, real tokenizer) at %s\n", path.c_str());
  fflush(stdout);
  Subprocess::Options sp;
  sp.argv = {SiblingProgram("minions-make-test-model"), "--kind", "text", "-o", path};
  auto maker = Subprocess::Start(sp);
  if (!maker.ok()) {
    fprintf(stderr, "error: %s\n", std::string(maker.status().message()).c_str());
    return false;
  }
  (*maker)->CloseStdin();
  while ((*maker)->ReadLine().ok()) {
  }
  auto exit = (*maker)->Wait();
  return exit.ok() && exit->exited && exit->code == 0;
}

}  // namespace

int RunDemo(const DemoOptions& options) {
  std::error_code ec;
  fs::create_directories(fs::path(options.workdir) / "models", ec);
  if (ec) {
    fprintf(stderr, "error: cannot create %s: %s\n", options.workdir.c_str(), ec.message().c_str());
    return 1;
  }
  std::string model = (fs::path(options.workdir) / "models" / "minions-test-text.gguf").string();
  if (!EnsureTestModel(model)) {
    fprintf(stderr, "error: could not make the test model\n");
    return 1;
  }
  std::string input = (fs::path(options.workdir) / "prompts.jsonl").string();
  {
    SamplePromptOptions sample;
    sample.records = options.records;
    std::ofstream out(input, std::ios::trunc);
    for (const auto& line : SamplePromptLines(sample)) out << line << '\n';
  }
  LocalRunOptions run;
  run.input_path = input;
  run.model_path = model;
  run.output_path = (fs::path(options.workdir) / "output.jsonl").string();
  run.errors_path = (fs::path(options.workdir) / "errors.jsonl").string();
  run.runner_log = (fs::path(options.workdir) / "runner.log").string();
  run.load = options.load;
  printf("running %zu records from %s on %s\n", options.records, input.c_str(), model.c_str());
  fflush(stdout);
  auto summary = RunLocally(run);
  if (!summary.ok()) {
    fprintf(stderr, "error: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  printf("\n%zu records in %.2f s (%.1f records/s, %.0f generated tokens/s; model load %.2f s)\n",
         summary->records, summary->seconds, summary->records / std::max(summary->seconds, 1e-9),
         summary->completion_tokens / std::max(summary->seconds, 1e-9), summary->load_seconds);
  printf("served: %zu   errors: %zu\n\n", summary->records - summary->errors, summary->errors);

  std::ifstream results(run.output_path);
  std::string line;
  for (int shown = 0; shown < 3 && std::getline(results, line);) {
    auto parsed = ParseJson(line);
    if (!parsed.ok()) continue;
    const Json& choices = JsonField(JsonField(JsonField(*parsed, "response"), "body"), "choices");
    if (!choices.is_array() || choices.empty()) continue;
    const Json& choice = choices[0];
    std::string text = choice.contains("message") ? JsonString(JsonField(choice, "message"), "content")
                                                  : JsonString(choice, "text");
    printf("  %s -> %s\n", JsonString(*parsed, "custom_id").c_str(), DumpJson(text).c_str());
    ++shown;
  }
  std::ifstream error_lines(run.errors_path);
  while (std::getline(error_lines, line)) {
    auto parsed = ParseJson(line);
    if (!parsed.ok()) continue;
    printf("  error %s: %s\n", DumpJson(JsonField(*parsed, "custom_id")).c_str(),
           JsonString(JsonField(*parsed, "error"), "message").c_str());
  }
  printf("\n(the model has random weights, so the text is noise: point --model at a real GGUF for "
         "real answers)\noutput: %s\nerrors: %s\n",
         run.output_path.c_str(), run.errors_path.c_str());
  // The sample deliberately holds two bad lines; anything else failing is a real failure.
  size_t expected_errors = options.records > 42 ? 2 : (options.records > 17 ? 1 : 0);
  return summary->errors == expected_errors ? 0 : 1;
}

}  // namespace minions::cli
