// minions-bench-schema: structured outputs against the same records unconstrained (issue 36,
// point 11; docs/benchmarks.md). The runner serves chat records with a bounded json_schema
// (decoding under the grammar compiled from it, once per runner) and the same records without
// one, in interleaved passes of fresh records; it prints records/s and generated tokens/s of each
// side, their ratio, and how many constrained answers parse and validate.
//
//   minions-bench-schema [--model M.gguf | --shape 1b --type q4_0] [--records 16] [--max-tokens 64]
//                        [--threads 1] [--parallel 4] [--repeat 2] [--work-dir DIR]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "bench_engine.h"
#include "bench_util.h"
#include "common/json_util.h"
#include "runner/llama/llama_engine.h"

namespace {

using minions::Json;
using namespace minions::llama_runner;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "minions-bench-schema: error: %s\n", message.c_str());
  std::exit(1);
}

// Every string, array and number bounded, so that a grammar-following answer always ends.
const Json& Schema() {
  static const Json schema = Json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},
      "age":{"type":"integer","minimum":0,"maximum":120},
      "city":{"enum":["Paris","Oslo","Lima","Accra"]},
      "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},
    "required":["name","age","city","tags"],"additionalProperties":false})");
  return schema;
}

// `n` chat records of pass `pass`; each pass's prompts open with the pass and side, so no pass
// reuses another's computed prompt.
std::vector<WorkItem> Records(int n, int pass, bool constrained, int max_tokens) {
  const char* people[] = {"a baker", "a pilot", "two sisters", "an old sailor", "a teacher", "a child"};
  std::vector<WorkItem> items;
  for (int i = 0; i < n; ++i) {
    Json body = {{"model", "m"},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"messages", {{{"role", "user"},
                                {"content", absl::StrCat("[", pass, constrained ? "s" : "u", i, "] Describe ",
                                                         people[i % 6], " as a JSON record.")}}}}};
    if (constrained) {
      body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", Schema()}}}};
    }
    Json line = {{"custom_id", absl::StrCat("p", pass, "-", i)}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", body}};
    auto parsed = minions::ParseRecordLine(minions::DumpJson(line));
    if (!parsed.ok()) Die(parsed.error_message);
    items.push_back({"", static_cast<size_t>(i), *parsed.request});
  }
  return items;
}

struct Side {
  std::vector<double> records_per_s, tokens_per_s;
  int answers = 0, valid = 0, stopped = 0;
};

bool Valid(const std::string& text) {
  auto v = minions::ParseJson(text);
  if (!v.ok() || !v->is_object() || v->size() != 4) return false;
  const Json& o = *v;
  return o["name"].is_string() && o["name"].get<std::string>().size() <= 48 && o["age"].is_number_integer() &&
         o["age"].get<int>() >= 0 && o["age"].get<int>() <= 120 && o["city"].is_string() && o["tags"].is_array() &&
         o["tags"].size() <= 3;
}

void Pass(LlamaEngine& engine, int records, int pass, bool constrained, int max_tokens, Side& side) {
  int64_t tokens = 0;
  const auto start = Clock::now();
  engine.Serve(
      Records(records, pass, constrained, max_tokens),
      [&](WorkResult r) {
        tokens += r.usage.completion_tokens;
        if (!constrained || r.is_error) return;
        const Json& choice = r.output["response"]["body"]["choices"][0];
        ++side.answers;
        if (choice["finish_reason"] == "stop") {
          ++side.stopped;
          side.valid += Valid(choice["message"]["content"].get<std::string>());
        }
      },
      [] { return false; });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  side.records_per_s.push_back(records / seconds);
  side.tokens_per_s.push_back(static_cast<double>(tokens) / seconds);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minions-bench-schema: json_schema-constrained records against the same records unconstrained"};
  std::string model, shape, type = "q4_0", work_dir = "/tmp/minions-bench-schema";
  int records = 16, max_tokens = 64, threads = 1, parallel = 4, repeat = 2;
  app.add_option("--model", model, "a GGUF model (default: a --shape model, made once into --work-dir)");
  app.add_option("--shape", shape, "make a random-weight model of this shape (0.5b, 1b, ...)");
  app.add_option("--type", type, "weights of the --shape model")->capture_default_str();
  app.add_option("--records", records, "records per pass and side")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "max_tokens of every record")->capture_default_str();
  app.add_option("--threads", threads, "the runner's threads")->capture_default_str();
  app.add_option("--parallel", parallel, "sequences decoded at once")->capture_default_str();
  app.add_option("--repeat", repeat, "passes per side (interleaved); the median is shown")->capture_default_str();
  app.add_option("--work-dir", work_dir, "where a made model goes");
  CLI11_PARSE(app, argc, argv);
  if (records < 1 || repeat < 1) Die("--records and --repeat must be at least 1");
  InstallLlamaLogging();
  if (model.empty() && shape.empty()) Die("give --model or --shape");
  auto bench_model = minions::bench::BenchModel(model, shape, type, work_dir);
  if (!bench_model.ok()) Die(std::string(bench_model.status().message()));
  model = *bench_model;
  auto engine = minions::bench::LoadBenchEngine(model, threads, parallel, 1024);
  if (!engine.ok()) Die(std::string(engine.status().message()));

  Side plain, schema;
  Pass(**engine, std::min(records, parallel), -1, true, 8, schema);  // warm-up: compiles the schema once
  schema = {};
  for (int r = 0; r < repeat; ++r) {
    Pass(**engine, records, r, false, max_tokens, plain);
    Pass(**engine, records, r, true, max_tokens, schema);
  }
  const double rec_ratio = Median(schema.records_per_s) / Median(plain.records_per_s);
  const double tok_ratio = Median(schema.tokens_per_s) / Median(plain.tokens_per_s);
  std::printf("| side | records/s | generated tokens/s |\n|---|---:|---:|\n");
  std::printf("| unconstrained | %.3f | %.2f |\n", Median(plain.records_per_s), Median(plain.tokens_per_s));
  std::printf("| json_schema | %.3f | %.2f |\n", Median(schema.records_per_s), Median(schema.tokens_per_s));
  std::printf("constrained / unconstrained: %.2fx records/s, %.2fx tokens/s; %d of %d constrained answers ended "
              "by themselves, %d of those parse and validate; %zu grammars compiled\n",
              rec_ratio, tok_ratio, schema.stopped, schema.answers, schema.valid, (*engine)->grammars_compiled());
  if (!(Median(plain.tokens_per_s) > 0) || schema.answers == 0) Die("measured nothing");
  if (schema.valid != schema.stopped) Die("a constrained answer that ended does not validate");
  return 0;
}
