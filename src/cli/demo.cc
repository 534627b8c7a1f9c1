#include "cli/demo.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/client_verbs.h"
#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "runner/batch_record.h"

namespace minions::cli {
namespace fs = std::filesystem;

std::string MinionsHome() {
  if (const char* home = std::getenv("MINIONS_HOME"); home && *home) return home;
  const char* user_home = std::getenv("HOME");
  return absl::StrCat(user_home && *user_home ? user_home : "/tmp", "/.minions");
}

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

int RunDemo(const DemoOptions& options, const PoolFactory& start_pool) {
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

  PoolOptions pool_options;
  pool_options.data_dir = (fs::path(options.workdir) / "pool").string();
  pool_options.executors = options.executors;
  pool_options.model_folders = {(fs::path(options.workdir) / "models").string()};
  auto pool = start_pool(pool_options);
  if (!pool.ok()) {
    fprintf(stderr, "error: cannot start the pool: %s\n", std::string(pool.status().message()).c_str());
    return 1;
  }
  printf("pool up: server %s, %d executors (logs in %s/logs)\n", (*pool)->address().c_str(), (*pool)->executor_count(),
         pool_options.data_dir.c_str());
  if (!(*pool)->dashboard_url().empty()) printf("dashboard: %s\n", (*pool)->dashboard_url().c_str());

  Connection connection;
  connection.server = (*pool)->address();
  connection.token = (*pool)->admin_token();
  connection.tls.ca_file = (*pool)->ca_file();
  SubmitOptions submit;
  submit.input_path = input;
  submit.model = model;
  submit.shard_size = options.shard_size;
  submit.runner_options_json = options.runner_options_json;
  printf("submitting %zu records from %s\n", options.records, input.c_str());
  fflush(stdout);
  absl::Time start = absl::Now();
  int watched = Submit(connection, [&] {
    SubmitOptions s = submit;
    s.wait = true;
    return s;
  }());
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  JobsClient client(connection);
  auto jobs = client.List("", 1);
  if (!jobs.ok() || jobs->empty()) {
    fprintf(stderr, "error: the job is gone: %s\n", std::string(jobs.status().message()).c_str());
    return 1;
  }
  const v1::Job job = jobs->front();
  std::string output = (fs::path(options.workdir) / "output.jsonl").string();
  std::string errors = (fs::path(options.workdir) / "errors.jsonl").string();
  if (job.state() == "completed") {
    Results(connection, job.id(), output, false);
    Results(connection, job.id(), errors, true);
  }
  const auto& counts = job.request_counts();
  printf("\n%lld records in %.2f s from submit to results (%.1f records/s): %lld served, %lld errors\n\n",
         static_cast<long long>(counts.total()), seconds, counts.total() / std::max(seconds, 1e-9),
         static_cast<long long>(counts.completed()), static_cast<long long>(counts.failed()));

  std::ifstream results(output);
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
  std::ifstream error_lines(errors);
  while (std::getline(error_lines, line)) {
    auto parsed = ParseJson(line);
    if (!parsed.ok()) continue;
    printf("  error %s: %s\n", DumpJson(JsonField(*parsed, "custom_id")).c_str(),
           JsonString(OutputLineError(*parsed), "message").c_str());
  }
  printf("\n(the model has random weights, so the text is noise: submit with --model pointing at a real GGUF "
         "for real answers)\noutput: %s\nerrors: %s\n",
         output.c_str(), errors.c_str());
  // The sample deliberately holds two bad lines; anything else failing is a real failure.
  int64_t expected_errors = options.records > 42 ? 2 : (options.records > 17 ? 1 : 0);
  return watched == 0 && job.state() == "completed" && counts.failed() == expected_errors ? 0 : 1;
}

}  // namespace minions::cli
