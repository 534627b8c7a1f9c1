// minions-bench-rescore: what verification by re-scoring sees of honest answers and of forged
// ones (issue 38, points 5 and 7; docs/verification.md, docs/benchmarks.md).
//
// Honest producers set up differently (threads, parallel sequences, batch size) each generate a
// share of `--records` records (completions and chat, greedy and sampled); every answer is then
// re-scored, with the default thresholds, by a verifier engine set up otherwise than its producer.
// It prints the honest answers flagged (the target is none) and the distribution of the check's
// margins: greedy, the largest gap below the argmax in nats and the lowest rank; sampled, the
// smallest token logprob after the record's transforms and the log-likelihood's standard
// deviations from its expectation; and the room each leaves to its threshold. Where this build has
// the vulkan runner and the machine a Vulkan device (Mesa's lavapipe will do), the first
// `--vulkan-records` answers are checked across backends both ways (CPU answers by the Vulkan
// runner, the Vulkan runner's answers by a CPU verifier); otherwise it says why not. Then how many
// dishonest answers each rule catches, and what checking costs next to generating.
//
//   minions-bench-rescore [--model M.gguf | --shape 0.5b --type q4_0] [--records 2400]
//                         [--max-tokens 8] [--threads 2] [--vulkan-records 240]
//                         [--dishonest-records 120] [--work-dir DIR]

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
#include "runner/llama/llama_engine.h"
#include "runner/llama/rescorer.h"
#include "runner/runner_process.h"

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

bool IsGreedy(size_t i) { return i % 2 == 0; }

// Half greedy, half sampled at T = 0.7 (a quarter of those with top_p 0.9); a third chat.
std::vector<std::string> MakeRecords(int n, int max_tokens) {
  const char* subjects[] = {"the sea", "a small town", "bread", "the moon", "rivers", "a lost key", "winter", "trains"};
  const char* asks[] = {"Write about", "Tell me a story about", "List facts about", "Describe", "Explain"};
  std::mt19937 rng(11);
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    const std::string prompt = absl::StrCat(asks[rng() % 5], " ", subjects[rng() % 8], " (", i, ").");
    Json body = {{"max_tokens", max_tokens}, {"temperature", IsGreedy(i) ? 0.0 : 0.7}};
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

// An engine's set-up: what differs between honest executors.
struct Setup {
  int threads, parallel, batch;
  std::string Name() const { return absl::StrFormat("%dt/%dp/b%d", threads, parallel, batch); }
};

std::unique_ptr<LlamaEngine> Load(const std::string& model, const Setup& s) {
  auto engine = minions::bench::LoadBenchEngine(model, s.threads, s.parallel, 512, s.batch);
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
int64_t CompletionTokens(Json out) { return minions::JsonInt(out["response"]["body"]["usage"], "completion_tokens"); }

// The value below which a fraction q of v lies (q = 1: the largest).
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// The margins of the honest answers one pairing (producer, verifier) checked.
struct Margins {
  int checked = 0, flagged = 0, unchecked = 0;
  std::vector<double> greedy_gap, greedy_rank, sampled_logprob, sampled_sigmas, sampled_rank;
  double seconds = 0;

  // A flagged honest answer is printed whole (its record and the line claimed), so that the check
  // can be replayed on it; its margins are left out of the distribution (they say why it failed).
  void Add(size_t i, const rescore::Verdict& v, const std::string& what, const std::string& record, const Json& output) {
    ++checked;
    if (!v.passed) {
      ++flagged;
      std::fprintf(stderr, "false positive (%s), record %zu: %s\n  record: %s\n  claimed: %s\n", what.c_str(), i,
                   v.reason.c_str(), record.c_str(), minions::DumpJson(output).c_str());
      return;
    }
    if (!v.skipped.empty()) return;
    if (IsGreedy(i)) {
      greedy_gap.push_back(v.max_gap);
      greedy_rank.push_back(v.max_rank);
    } else {
      sampled_logprob.push_back(v.min_logprob);
      sampled_sigmas.push_back(v.sigmas);
      sampled_rank.push_back(v.max_rank);
    }
  }
  void Merge(const Margins& m) {
    checked += m.checked, flagged += m.flagged, unchecked += m.unchecked, seconds += m.seconds;
    for (auto [to, from] : {std::pair{&greedy_gap, &m.greedy_gap}, {&greedy_rank, &m.greedy_rank},
                            {&sampled_logprob, &m.sampled_logprob}, {&sampled_sigmas, &m.sampled_sigmas},
                            {&sampled_rank, &m.sampled_rank}}) {
      to->insert(to->end(), from->begin(), from->end());
    }
  }
};

void PrintMarginsHeader() {
  std::printf("| producer -> verifier | checked | honest flagged | greedy max gap p99 / p99.9 / max (nats) | "
              "greedy worst rank | sampled min logprob min / p0.1 / p1 (nats) | sampled sigmas min |\n"
              "|---|---:|---:|---|---:|---|---:|\n");
}
void PrintMargins(const std::string& label, const Margins& m) {
  const auto& g = m.greedy_gap;
  const auto& lp = m.sampled_logprob;
  const std::string greedy = g.empty() ? "-" : absl::StrFormat("%.3g / %.3g / %.3g", Quantile(g, 0.99), Quantile(g, 0.999),
                                                               Quantile(g, 1.0));
  const std::string rank = g.empty() ? "-" : absl::StrFormat("%.0f", Quantile(m.greedy_rank, 1.0));
  const std::string sampled = lp.empty() ? "-" : absl::StrFormat("%.2f / %.2f / %.2f", Quantile(lp, 0.0), Quantile(lp, 0.001),
                                                                 Quantile(lp, 0.01));
  const std::string sigmas = lp.empty() ? "-" : absl::StrFormat("%.2f", Quantile(m.sampled_sigmas, 0.0));
  std::printf("| %s | %d | %d | %s | %s | %s | %s |\n", label.c_str(), m.checked, m.flagged, greedy.c_str(),
              rank.c_str(), sampled.c_str(), sigmas.c_str());
  std::fflush(stdout);
}

// What the honest margins imply for the thresholds, and the room the defaults leave.
void PrintImplied(const Margins& all) {
  const rescore::Thresholds t;
  const double gap = Quantile(all.greedy_gap, 1.0);
  const double rank = Quantile(all.greedy_rank, 1.0);
  const double lp = Quantile(all.sampled_logprob, 0.0);
  const double sigmas = Quantile(all.sampled_sigmas, 0.0);
  const auto over_soft = std::count_if(all.greedy_gap.begin(), all.greedy_gap.end(),
                                       [&](double g) { return g > t.gap_soft; });
  std::printf("\nImplied, over the %d honest answers that passed (%d flagged, %d uncheckable):\n",
              all.checked - all.flagged, all.flagged, all.unchecked);
  std::printf("- delta: the largest honest greedy gap is %.3g nats; gap_hard %.3g leaves %s; %lld answers had a "
              "token past gap_soft %.3g (each may have %d such before failing)\n",
              gap, t.gap_hard, gap > 0 ? absl::StrFormat("%.0fx room", t.gap_hard / gap).c_str() : "all of it (every token the argmax)",
              static_cast<long long>(over_soft), t.gap_soft, t.soft_misses);
  std::printf("- k: the worst honest greedy rank is %.0f (0: the argmax); top_k %d\n", rank, t.top_k);
  std::printf("- epsilon: the least likely honest sampled token has logprob %.2f nats; min_logprob %.0f leaves %.1f nats\n",
              lp, t.min_logprob, lp - t.min_logprob);
  std::printf("- sigmas: the lowest honest sampled log-likelihood is %.2f standard deviations from its mean; max_sigmas %.0f\n",
              sigmas, t.max_sigmas);
}

struct Produced {
  std::map<size_t, Json> outputs;
  std::vector<int> producer;  // index into the setups, per record
  double seconds = 0;
  int64_t tokens = 0;
};

// Each producer generates every records.size()/producers-th record, as an executor serves a task.
Produced Produce(const std::string& model, const std::vector<std::string>& lines, const std::vector<Setup>& setups,
                 int producers) {
  Produced p;
  p.producer.resize(lines.size());
  for (int k = 0; k < producers; ++k) {
    auto engine = Load(model, setups[k]);
    std::vector<WorkItem> items;
    for (size_t i = k; i < lines.size(); i += producers) {
      items.push_back({"", i, *minions::ParseRecordLine(lines[i]).request});
      p.producer[i] = k;
    }
    std::fprintf(stderr, "producer %s: %zu records\n", setups[k].Name().c_str(), items.size());
    const auto start = Clock::now();
    engine->Serve(std::move(items), [&](WorkResult r) { p.outputs[r.index] = std::move(r.output); }, [] { return false; });
    p.seconds += SecondsSince(start);
  }
  for (auto& [i, out] : p.outputs) p.tokens += out["error"].is_null() ? CompletionTokens(out) : 0;
  return p;
}

// Every answer checked once, by a setup other than its producer's (the three others in turn).
std::map<std::pair<int, int>, Margins> CheckAll(const std::string& model, const std::vector<std::string>& lines,
                                                 Produced& produced, const std::vector<Setup>& setups) {
  const int n = static_cast<int>(setups.size());
  std::map<std::pair<int, int>, Margins> by_pair;
  for (int v = 0; v < n; ++v) {
    std::fprintf(stderr, "verifier %s\n", setups[v].Name().c_str());
    auto engine = Load(model, setups[v]);
    Rescorer rescorer(*engine);
    for (size_t i = 0; i < lines.size(); ++i) {
      const int p = produced.producer[i];
      // Every six records hold each producer's greedy and sampled one: they go to the same verifier.
      if ((p + 1 + static_cast<int>(i / 6) % (n - 1)) % n != v) continue;
      Margins& m = by_pair[{p, v}];
      const auto start = Clock::now();
      auto verdict = rescorer.Check(lines[i], produced.outputs[i], {});
      m.seconds += SecondsSince(start);
      if (!verdict.ok()) {
        ++m.unchecked;
        std::fprintf(stderr, "uncheckable, record %zu: %s\n", i, std::string(verdict.status().message()).c_str());
        continue;
      }
      m.Add(i, *verdict, setups[p].Name() + " -> " + setups[v].Name(), lines[i], produced.outputs[i]);
    }
  }
  return by_pair;
}

// CPU answers checked by the vulkan runner, and its answers by a CPU verifier. Returns the rows
// it printed into, or says why there are none.
std::map<std::string, Margins> CheckAcrossBackends(const std::string& model, const std::string& runner,
                                                   const std::vector<std::string>& lines, Produced& produced,
                                                   size_t records, const Setup& cpu, std::string* why_not) {
  std::map<std::string, Margins> rows;
  if (!std::filesystem::exists(runner)) {
    *why_not = absl::StrCat("this build has no vulkan runner (", runner,
                            "): scripts/setup could not fetch its prebuilt backend, or MINIONS_VULKAN=0");
    return rows;
  }
  minions::RunnerProcess::Options options;
  options.command = {runner};
  options.environment = {"GGML_VK_VISIBLE_DEVICES=0"};  // ggml skips CPU-type devices (lavapipe) unless told
  options.stderr_path = "/tmp/minions-bench-rescore-vulkan.log";
  auto process = minions::RunnerProcess::Start(options);
  if (!process.ok()) {
    *why_not = absl::StrCat("the vulkan runner did not start: ", process.status().message());
    return rows;
  }
  minions::runner_protocol::LoadRequest load{model, {}};
  load.options.n_parallel = cpu.parallel;
  load.options.n_ctx_per_seq = 512;
  load.options.n_threads = cpu.threads;
  load.options.n_batch = cpu.batch;
  auto info = (*process)->Load(load);
  if (!info.ok() || minions::JsonInt(*info, "offloaded_layers") <= 0) {
    *why_not = info.ok() ? absl::StrCat("no Vulkan device took the model's layers (loaded: ", minions::DumpJson(*info), ")")
                         : absl::StrCat("the vulkan runner could not load the model: ", info.status().message());
    return rows;
  }
  records = std::min({records, lines.size(), rescore::kMaxItems});
  // The CPU's answers, re-scored on the Vulkan device.
  rescore::Request request;
  request.batch = "cpu-answers";
  for (size_t i = 0; i < records; ++i) request.items.push_back({lines[i], produced.outputs[i]});
  Margins& on_vulkan = rows["CPU (all setups) -> Vulkan"];
  auto start = Clock::now();
  auto done = (*process)->Rescore(request, [&](size_t i, const Json& message) {
    if (!message.contains("verdict")) {
      ++on_vulkan.unchecked;
      return;
    }
    on_vulkan.Add(i, rescore::Verdict::FromJson(message["verdict"]), "CPU -> Vulkan", lines[i], produced.outputs[i]);
  });
  on_vulkan.seconds = SecondsSince(start);
  if (!done.ok()) Die(absl::StrCat("the vulkan runner failed to re-score: ", done.status().message()));
  // The Vulkan device's answers, re-scored on the CPU.
  std::vector<std::string> subset(lines.begin(), lines.begin() + static_cast<long>(records));
  std::map<size_t, Json> answers;
  auto run = (*process)->RunBatch("vulkan-answers", subset, [&](size_t i, const Json& line) { answers[i] = line; });
  if (!run.ok()) Die(absl::StrCat("the vulkan runner failed to generate: ", run.status().message()));
  (*process)->Shutdown();
  auto engine = Load(model, cpu);
  Rescorer rescorer(*engine);
  Margins& on_cpu = rows["Vulkan -> CPU " + cpu.Name()];
  int differ = 0;
  for (size_t i = 0; i < records; ++i) {
    differ += IsGreedy(i) && minions::DumpJson(answers[i]["response"]["body"]["choices"]) !=
                                 minions::DumpJson(produced.outputs[i]["response"]["body"]["choices"]);
    start = Clock::now();
    auto verdict = rescorer.Check(lines[i], answers[i], {});
    on_cpu.seconds += SecondsSince(start);
    if (!verdict.ok()) {
      ++on_cpu.unchecked;
      continue;
    }
    on_cpu.Add(i, *verdict, "Vulkan -> CPU", lines[i], answers[i]);
  }
  std::printf("(Vulkan: %s; %d of %zu greedy answers differ from the CPU's text)\n",
              minions::JsonString(*info, "device").c_str(), differ, (records + 1) / 2);
  return rows;
}

// Dishonest variants of the first `records` answers, each checked by a verifier unlike the producer.
void CheckDishonest(const std::string& model, const std::vector<std::string>& lines, Produced& produced, size_t records,
                    const Setup& verifier_setup) {
  auto verifier = Load(model, verifier_setup);
  Rescorer rescorer(*verifier);
  std::mt19937 rng(5);
  struct Kind {
    const char* name;
    int caught = 0, tried = 0, greedy_caught = 0, greedy_tried = 0;
  };
  std::vector<Kind> kinds = {{"forged (another record's text)"}, {"one character flipped"}, {"truncated to half"},
                             {"answer of another record"}, {"prompt_tokens + 1"}, {"completion_tokens x 2"}};
  auto& outputs = produced.outputs;
  records = std::min(records, lines.size());
  for (size_t i = 0; i < records; ++i) {
    if (!outputs[i]["error"].is_null() || Text(outputs[i]).size() < 4) continue;
    const size_t other = (i + 2) % records;  // the same greedy/sampled kind, another prompt
    for (size_t k = 0; k < kinds.size(); ++k) {
      Json bad = outputs[i];
      std::string text = Text(bad);
      switch (k) {
        case 0: SetText(bad, Text(outputs[other])); break;
        case 1: text[rng() % text.size()] ^= 0x01; SetText(bad, text); break;
        case 2: SetText(bad, text.substr(0, text.size() / 2)); Choice(bad)["finish_reason"] = "stop"; break;
        case 3: bad = outputs[other]; bad["custom_id"] = outputs[i]["custom_id"]; break;
        case 4: bad["response"]["body"]["usage"]["prompt_tokens"] = bad["response"]["body"]["usage"]["prompt_tokens"].get<int>() + 1; break;
        case 5: bad["response"]["body"]["usage"]["completion_tokens"] = 2 * CompletionTokens(bad); break;
      }
      if (minions::DumpJson(bad) == minions::DumpJson(outputs[i])) continue;  // the change changed nothing
      auto verdict = rescorer.Check(lines[i], bad, {});
      if (!verdict.ok()) Die(std::string(verdict.status().message()));
      const bool greedy = IsGreedy(i);
      kinds[k].tried++;
      kinds[k].caught += !verdict->passed;
      kinds[k].greedy_tried += greedy;
      kinds[k].greedy_caught += greedy && !verdict->passed;
    }
  }
  std::printf("\n| dishonest answer (first %zu records) | caught (all) | caught (greedy) | caught (sampled) |\n"
              "|---|---|---|---|\n", records);
  for (const Kind& k : kinds) {
    std::printf("| %s | %d of %d | %d of %d | %d of %d |\n", k.name, k.caught, k.tried, k.greedy_caught, k.greedy_tried,
                k.caught - k.greedy_caught, k.tried - k.greedy_tried);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minions-bench-rescore: honest and forged answers through verification by re-scoring"};
  std::string model, shape, type = "q4_0", work_dir = "/tmp/minions-bench-rescore";
  std::string vulkan_runner = (std::filesystem::path(argv[0]).parent_path() / "minions-llama-runner-vulkan").string();
  int records = 2400, max_tokens = 8, threads = 2, vulkan_records = 240, dishonest_records = 120;
  app.add_option("--model", model, "a GGUF model (default: the random-weight test model, or --shape)");
  app.add_option("--shape", shape, "make a random-weight model of this shape (0.5b, 1b, ...)");
  app.add_option("--type", type, "weights of the --shape model");
  app.add_option("--records", records, "honest records to generate and check");
  app.add_option("--max-tokens", max_tokens, "tokens per answer");
  app.add_option("--threads", threads, "the first producer's threads (the other setups vary around it)");
  app.add_option("--vulkan-runner", vulkan_runner, "the vulkan runner for the pairing across backends");
  app.add_option("--vulkan-records", vulkan_records, "answers checked across backends, each way (0: none)");
  app.add_option("--dishonest-records", dishonest_records, "answers whose dishonest variants are checked");
  app.add_option("--work-dir", work_dir, "where made models go");
  CLI11_PARSE(app, argc, argv);
  InstallLlamaLogging();
  std::filesystem::create_directories(work_dir);
  auto bench_model = minions::bench::BenchModel(model, shape, type, work_dir);
  if (!bench_model.ok()) Die(absl::StrCat("cannot make the model: ", bench_model.status().message()));
  model = *bench_model;
  const std::vector<std::string> lines = MakeRecords(records, max_tokens);

  // Three producers and a fourth setup that only verifies: threads, parallel sequences, batch.
  const std::vector<Setup> setups = {{threads, 8, 256}, {1, 1, 512}, {threads + 1, 4, 32}, {threads, 2, 7}};
  Produced produced = Produce(model, lines, setups, 3);
  std::printf("model %s, %d records (half greedy, half sampled at T=0.7, a quarter of those top_p 0.9; a third "
              "chat), %d tokens at most; setups threads/parallel/batch\n\n",
              model.c_str(), records, max_tokens);
  PrintMarginsHeader();
  auto by_pair = CheckAll(model, lines, produced, setups);
  Margins all;
  for (const auto& [pair, m] : by_pair) {
    PrintMargins(setups[pair.first].Name() + " -> " + setups[pair.second].Name(), m);
    all.Merge(m);
  }
  PrintMargins("**all CPU pairings**", all);
  const double check_seconds = all.seconds;
  if (vulkan_records > 0) {
    std::string why_not;
    auto rows = CheckAcrossBackends(model, vulkan_runner, lines, produced, static_cast<size_t>(vulkan_records),
                                    setups[0], &why_not);
    for (const auto& [label, m] : rows) {
      PrintMargins(label, m);
      all.Merge(m);
    }
    if (!why_not.empty()) std::printf("\nNo pairing across backends: %s.\n", why_not.c_str());
  }
  PrintImplied(all);
  CheckDishonest(model, lines, produced, static_cast<size_t>(dishonest_records), setups[3]);
  std::printf("\ngenerating %lld tokens took %.2f s; checking them all on the CPU %.2f s: %.1f %% of it\n",
              static_cast<long long>(produced.tokens), produced.seconds, check_seconds,
              100.0 * check_seconds / produced.seconds);
  // Nothing generated or checked: the benchmark has rotted (the suite's smoke run fails on it). An
  // honest answer flagged fails the run too: the thresholds need another look.
  return produced.tokens > 0 && check_seconds > 0 && all.flagged == 0 ? 0 : 1;
}
