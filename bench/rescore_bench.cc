// minions-bench-rescore: what verification by re-scoring sees of honest answers and of forged
// ones (issue 38, points 5 and 7; docs/verification.md, docs/benchmarks.md).
//
// A producer engine generates answers for `--records` records (completions and chat, greedy and
// sampled); verifier engines that differ from it in threads, batch size and parallel sequences
// re-score every answer with the default thresholds. It prints, per verifier setting, the false
// positives among honest answers and the distribution of their margins (greedy: the largest gap
// in nats; sampled: the log-likelihood's standard deviations from its expectation), then how many
// forged, token-flipped, truncated, swapped and inflated-usage answers each rule catches, and what
// a check costs next to generating the answer.
//
//   minions-bench-rescore [--model M.gguf | --shape 0.5b --type q4_0] [--records 200]
//                         [--max-tokens 32] [--threads 2] [--work-dir DIR]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench_engine.h"
#include "bench_util.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "runner/llama/llama_engine.h"
#include "runner/llama/rescorer.h"

namespace {

using minions::Json;
using namespace minions::llama_runner;
using Clock = std::chrono::steady_clock;
namespace rescore = minions::rescore;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "minions-bench-rescore: error: %s\n", message.c_str());
  std::exit(1);
}

std::vector<std::string> MakeRecords(int n, int max_tokens) {
  const char* subjects[] = {"the sea", "a small town", "bread", "the moon", "rivers", "a lost key", "winter", "trains"};
  const char* asks[] = {"Write about", "Tell me a story about", "List facts about", "Describe", "Explain"};
  std::mt19937 rng(11);
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    const std::string prompt = absl::StrCat(asks[rng() % 5], " ", subjects[rng() % 8], " (", i, ").");
    const bool sampled = i % 2 == 1;
    Json body = {{"max_tokens", max_tokens}, {"temperature", sampled ? 0.7 : 0.0}};
    if (i % 4 == 3) body["top_p"] = 0.9;
    Json line = {{"custom_id", absl::StrCat("r", i)}};
    if (i % 3 == 0) {
      body["messages"] = {{{"role", "user"}, {"content", prompt}}};
      line["url"] = "/v1/chat/completions";
      line["body"] = body;
    } else {
      line.update(body);
      line["prompt"] = prompt;
    }
    lines.push_back(minions::DumpJson(line));
  }
  return lines;
}

std::unique_ptr<LlamaEngine> Load(const std::string& model, int threads, int parallel, int batch) {
  auto engine = minions::bench::LoadBenchEngine(model, threads, parallel, 512, batch);
  if (!engine.ok()) Die(std::string(engine.status().message()));
  return std::move(*engine);
}

Json& Choice(Json& line) { return line["response"]["body"]["choices"][0]; }
std::string Text(Json line) {
  Json& c = Choice(line);
  return c.contains("message") ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
}
void SetText(Json& line, const std::string& text) {
  Json& c = Choice(line);
  (c.contains("message") ? c["message"]["content"] : c["text"]) = text;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minions-bench-rescore: honest and forged answers through verification by re-scoring"};
  std::string model, shape, type = "q4_0", work_dir = "/tmp/minions-bench-rescore";
  int records = 200, max_tokens = 32, threads = 2;
  app.add_option("--model", model, "a GGUF model (default: the random-weight test model, or --shape)");
  app.add_option("--shape", shape, "make a random-weight model of this shape (0.5b, 1b, ...)");
  app.add_option("--type", type, "weights of the --shape model");
  app.add_option("--records", records, "records to generate and check");
  app.add_option("--max-tokens", max_tokens, "tokens per answer");
  app.add_option("--threads", threads, "the producer's threads (verifiers vary around it)");
  app.add_option("--work-dir", work_dir, "where made models go");
  CLI11_PARSE(app, argc, argv);
  InstallLlamaLogging();
  std::filesystem::create_directories(work_dir);
  auto bench_model = minions::bench::BenchModel(model, shape, type, work_dir);
  if (!bench_model.ok()) Die(absl::StrCat("cannot make the model: ", bench_model.status().message()));
  model = *bench_model;
  const std::vector<std::string> lines = MakeRecords(records, max_tokens);

  // The producer: batched, several sequences at once, as an executor serves a task.
  auto producer = Load(model, threads, 8, 256);
  std::map<size_t, Json> outputs;
  auto start = Clock::now();
  std::vector<WorkItem> items;
  for (size_t i = 0; i < lines.size(); ++i) items.push_back({"", i, *minions::ParseRecordLine(lines[i]).request});
  producer->Serve(std::move(items), [&](WorkResult r) { outputs[r.index] = std::move(r.output); }, [] { return false; });
  const double generate_seconds = SecondsSince(start);
  int64_t generated_tokens = 0;
  for (auto& [i, out] : outputs) generated_tokens += minions::JsonInt(out["response"]["body"]["usage"], "completion_tokens");
  producer.reset();

  struct Setting {
    const char* name;
    int threads, parallel, batch;
  };
  const std::vector<Setting> settings = {{"same as producer", threads, 8, 256},
                                         {"1 thread, batch 512", 1, 1, 512},
                                         {"threads+1, batch 32", threads + 1, 4, 32},
                                         {"threads, batch 7", threads, 2, 7}};
  std::printf("model %s, %d records (half greedy, half sampled at T=0.7, a quarter of those top_p 0.9), "
              "%d tokens each at most\n\n",
              model.c_str(), records, max_tokens);
  std::printf("| verifier | honest flagged | greedy max gap p50 / p99 / max (nats) | sampled sigmas min / p1 | "
              "re-splits | check s / generate s |\n|---|---|---|---|---|---|\n");
  double check_seconds_same = 0;
  for (const Setting& s : settings) {
    auto verifier = Load(model, s.threads, s.parallel, s.batch);
    Rescorer rescorer(*verifier);
    int flagged = 0;
    int64_t resplits = 0;
    std::vector<double> gaps, sigmas;
    start = Clock::now();
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!outputs[i]["error"].is_null()) continue;
      auto verdict = rescorer.Check(lines[i], outputs[i], {});
      if (!verdict.ok()) Die(std::string(verdict.status().message()));
      if (!verdict->passed) {
        ++flagged;
        std::fprintf(stderr, "false positive (%s): %s: %s\n", s.name, lines[i].c_str(), verdict->reason.c_str());
      }
      resplits += verdict->resplits;
      (i % 2 == 0 ? gaps : sigmas).push_back(i % 2 == 0 ? verdict->max_gap : verdict->sigmas);
    }
    const double seconds = SecondsSince(start);
    if (&s == &settings.front()) check_seconds_same = seconds;
    std::printf("| %s (%d threads, %d parallel, batch %d) | %d of %zu | %.3g / %.3g / %.3g | %.2f / %.2f | %lld | %.2f / %.2f |\n",
                s.name, s.threads, s.parallel, s.batch, flagged, outputs.size(), Quantile(gaps, 0.5),
                Quantile(gaps, 0.99), Quantile(gaps, 1.0), Quantile(sigmas, 0.0), Quantile(sigmas, 0.01), static_cast<long long>(resplits), seconds,
                generate_seconds);
  }

  // Dishonest answers, each checked by a verifier unlike the producer.
  auto verifier = Load(model, threads + 1, 4, 32);
  Rescorer rescorer(*verifier);
  std::mt19937 rng(5);
  struct Kind {
    const char* name;
    int caught = 0, tried = 0, greedy_caught = 0, greedy_tried = 0;
  };
  std::vector<Kind> kinds = {{"forged (another record's text)"}, {"one character flipped"}, {"truncated to half"},
                             {"answer of another record"}, {"prompt_tokens + 1"}, {"completion_tokens x 2"}};
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!outputs[i]["error"].is_null() || Text(outputs[i]).size() < 4) continue;
    const size_t other = (i + 2) % lines.size();  // the same greedy/sampled kind, another prompt
    for (size_t k = 0; k < kinds.size(); ++k) {
      Json bad = outputs[i];
      std::string text = Text(bad);
      switch (k) {
        case 0: SetText(bad, Text(outputs[other])); break;
        case 1: text[rng() % text.size()] ^= 0x01; SetText(bad, text); break;
        case 2: SetText(bad, text.substr(0, text.size() / 2)); Choice(bad)["finish_reason"] = "stop"; break;
        case 3: bad = outputs[other]; bad["custom_id"] = outputs[i]["custom_id"]; break;
        case 4: bad["response"]["body"]["usage"]["prompt_tokens"] = bad["response"]["body"]["usage"]["prompt_tokens"].get<int>() + 1; break;
        case 5: bad["response"]["body"]["usage"]["completion_tokens"] = 2 * bad["response"]["body"]["usage"]["completion_tokens"].get<int>(); break;
      }
      if (minions::DumpJson(bad) == minions::DumpJson(outputs[i])) continue;  // the change changed nothing
      auto verdict = rescorer.Check(lines[i], bad, {});
      if (!verdict.ok()) Die(std::string(verdict.status().message()));
      const bool greedy = i % 2 == 0;
      kinds[k].tried++;
      kinds[k].caught += !verdict->passed;
      kinds[k].greedy_tried += greedy;
      kinds[k].greedy_caught += greedy && !verdict->passed;
    }
  }
  std::printf("\n| dishonest answer | caught (all) | caught (greedy) | caught (sampled) |\n|---|---|---|---|\n");
  for (const Kind& k : kinds) {
    std::printf("| %s | %d of %d | %d of %d | %d of %d |\n", k.name, k.caught, k.tried, k.greedy_caught, k.greedy_tried,
                k.caught - k.greedy_caught, k.tried - k.greedy_tried);
  }
  std::printf("\ngenerating %lld tokens took %.2f s; checking them all (same settings) %.2f s: %.1f %% of it\n",
              static_cast<long long>(generated_tokens), generate_seconds, check_seconds_same,
              100.0 * check_seconds_same / generate_seconds);
  // Nothing generated or checked: the benchmark has rotted (the suite's smoke run fails on it).
  return generated_tokens > 0 && check_seconds_same > 0 ? 0 : 1;
}
