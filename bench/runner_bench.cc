// minions-bench-runner: records/s and generated tokens/s of the Minions runner against the same
// work done directly with llama.cpp, in one run on the same records and the same machine.
//
//   (a) direct, one prompt at a time: llama.cpp's API, a context with one sequence, a prompt is
//       decoded and generated to the end before the next one starts.
//   (b) direct, batched: llama.cpp's API, P sequences decoded together by a hand-written
//       continuous-batching loop over llama_batch (a finished sequence's slot is refilled at once).
//   (c) the runner: minions-llama-runner driven through RunnerProcess (JSON lines over pipes), the
//       records sent as one batch; timed from sending the batch to its batch_done.
//
// All three do the same work per record: parse the OpenAI Batch line, apply the chat template,
// tokenize, decode, sample greedily, turn tokens into text. They use the same threads, the same
// context per sequence and the same batch sizes. Model loading is not timed (reported apart).
//
//   minions-bench-runner [--model M.gguf] [--records 64] [--max-tokens 32] [--parallel 8]
//                        [--threads 0] [--repeat 1] [--flash-attn auto] [--in-process]
//                        [--runner PATH]
//
// Without --model it writes the test model with minions-make-test-model into a temporary folder.
// Results and the commands that reproduce them: docs/benchmarks.md.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "common/subprocess.h"
#include "llama.h"
#include "runner/batch_record.h"
#include "runner/llama/llama_engine.h"
#include "runner/protocol.h"
#include "runner/runner_process.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct BenchOptions {
  std::string model;
  size_t records = 64;
  int max_tokens = 32;
  int parallel = 8;
  int threads = 0;
  int repeat = 1;
  size_t warmup = 4;
  std::string runner;
  bool in_process = false;
  std::string flash_attn = "auto";
};

// What one timed pass of a variant produced.
struct RunResult {
  double seconds = 0;
  size_t records = 0;       // records served (errors excluded)
  size_t errors = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::vector<std::optional<std::string>> texts;  // generated text per record
  double runner_seconds = 0;  // (c): the batch as timed inside the runner (batch_done "seconds")
  double slowest_seconds = 0;  // the slowest of the passes (with --repeat)
};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "minions-bench-runner: error: %s\n", message.c_str());
  std::exit(1);
}

// ---------------------------------------------------------------------------------------------
// Direct llama.cpp. Written as a competent llama.cpp user would, from llama.h alone; the record
// handling (template, tokenization flags, max_tokens default, stop at EOG) matches LlamaEngine so
// that both produce the same tokens.

// Context parameters shared by (a) and (b), and mirrored in the runner's load options.
struct ContextShape {
  int ctx_per_seq = 0;
  int n_batch = 512;
  int threads = 1;
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
};

// The runner's reading of its flash_attn load option: "auto" is off without a GPU (on CPU the
// flash-attention kernel depends on the batch size, and the runner prefers determinism).
llama_flash_attn_type FlashAttnType(const std::string& option) {
  if (option == "on") return LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (option == "off") return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  if (!llama_supports_gpu_offload()) return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  return LLAMA_FLASH_ATTN_TYPE_AUTO;
}

class DirectLlama {
 public:
  DirectLlama(const std::string& model_path, const ContextShape& shape) : shape_(shape) {
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 999;  // as the runner: every layer on the GPU when there is one
    model_ = llama_model_load_from_file(model_path.c_str(), mparams);
    if (model_ == nullptr) Die(absl::StrCat("llama.cpp cannot load '", model_path, "'"));
    vocab_ = llama_model_get_vocab(model_);
    if (const char* tmpl = llama_model_chat_template(model_, nullptr)) chat_template_ = tmpl;
  }
  ~DirectLlama() {
    for (auto& [n_seq, ctx] : contexts_) llama_free(ctx);
    llama_model_free(model_);
  }

  int n_ctx_train() const { return llama_model_n_ctx_train(model_); }
  void set_ctx_per_seq(int n) { shape_.ctx_per_seq = n; }

  // Selects the context for n_seq sequences, creating it the first time. Contexts are kept, so
  // that a timed pass never pays for a cold context.
  void UseContext(int n_seq) {
    if (auto it = contexts_.find(n_seq); it != contexts_.end()) {
      ctx_ = it->second;
      n_ctx_seq_ = static_cast<int>(llama_n_ctx_seq(ctx_));
      return;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_seq_max = static_cast<uint32_t>(n_seq);
    cparams.n_ctx = static_cast<uint32_t>(shape_.ctx_per_seq * n_seq);
    const int n_batch = std::max(shape_.n_batch, n_seq);
    cparams.n_batch = static_cast<uint32_t>(n_batch);
    cparams.n_ubatch = static_cast<uint32_t>(std::min(n_batch, 512));
    cparams.n_threads = shape_.threads;
    cparams.n_threads_batch = shape_.threads;
    cparams.kv_unified = false;
    cparams.flash_attn_type = shape_.flash_attn;
    cparams.no_perf = true;
    ctx_ = llama_init_from_model(model_, cparams);
    if (ctx_ == nullptr) Die(absl::StrCat("llama.cpp cannot create a context for ", n_seq, " sequences"));
    contexts_[n_seq] = ctx_;
    n_ctx_seq_ = static_cast<int>(llama_n_ctx_seq(ctx_));
  }

  // (a): one record at a time.
  RunResult RunSequential(const std::vector<std::string>& lines) {
    UseContext(1);
    RunResult result;
    result.texts.resize(lines.size());
    llama_memory_t mem = llama_get_memory(ctx_);
    const int n_batch = static_cast<int>(llama_n_batch(ctx_));
    llama_batch batch = llama_batch_init(n_batch, 0, 1);
    llama_sampler* sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(sampler, llama_sampler_init_greedy());
    auto start = Clock::now();
    for (size_t i = 0; i < lines.size(); ++i) {
      Job job;
      if (!Prepare(lines[i], &job)) {
        ++result.errors;
        continue;
      }
      llama_memory_clear(mem, true);
      llama_sampler_reset(sampler);
      // The prompt, in chunks of n_batch; logits for its last token only.
      const int n_prompt = static_cast<int>(job.prompt.size());
      for (int fed = 0; fed < n_prompt;) {
        batch.n_tokens = 0;
        for (; fed < n_prompt && batch.n_tokens < n_batch; ++fed) {
          Add(batch, job.prompt[fed], fed, 0, fed + 1 == n_prompt);
        }
        if (llama_decode(ctx_, batch) != 0) Die("llama_decode failed");
      }
      llama_pos n_past = n_prompt;
      int n_generated = 0;
      std::string text;
      while (true) {
        llama_token token = llama_sampler_sample(sampler, ctx_, -1);
        if (llama_vocab_is_eog(vocab_, token)) break;
        text += Piece(token);
        ++n_generated;
        if (n_generated >= job.max_tokens || n_past + 1 >= n_ctx_seq_) break;
        batch.n_tokens = 0;
        Add(batch, token, n_past, 0, true);
        if (llama_decode(ctx_, batch) != 0) Die("llama_decode failed");
        ++n_past;
      }
      ++result.records;
      result.prompt_tokens += n_prompt;
      result.generated_tokens += n_generated;
      result.texts[i] = std::move(text);
    }
    result.seconds = SecondsSince(start);
    llama_sampler_free(sampler);
    llama_batch_free(batch);
    return result;
  }

  // (b): n_parallel sequences decoded together; a finished sequence's slot takes the next record
  // at once. Each step decodes one token of every generating sequence plus as much of the new
  // prompts as fits in n_batch.
  RunResult RunBatched(const std::vector<std::string>& lines, int n_parallel) {
    UseContext(n_parallel);
    RunResult result;
    result.texts.resize(lines.size());
    llama_memory_t mem = llama_get_memory(ctx_);
    llama_memory_clear(mem, true);
    const int n_batch = static_cast<int>(llama_n_batch(ctx_));
    llama_batch batch = llama_batch_init(n_batch, 0, 1);

    struct Seq {
      bool busy = false;
      size_t record = 0;
      Job job;
      int n_fed = 0;        // prompt tokens in the batch or the cache
      llama_pos n_past = 0; // tokens in the cache after the current decode
      int n_generated = 0;
      llama_token next = -1;  // sampled, to be decoded in the next step
      int i_logits = -1;      // row of this sequence's logits in the current batch
      std::string text;
      llama_sampler* sampler = nullptr;
    };
    std::vector<Seq> seqs(static_cast<size_t>(n_parallel));
    for (Seq& s : seqs) {
      s.sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
      llama_sampler_chain_add(s.sampler, llama_sampler_init_greedy());
    }
    auto release = [&](Seq& s, llama_seq_id id) {
      ++result.records;
      result.prompt_tokens += static_cast<int64_t>(s.job.prompt.size());
      result.generated_tokens += s.n_generated;
      result.texts[s.record] = std::move(s.text);
      llama_memory_seq_rm(mem, id, -1, -1);
      s.busy = false;
    };

    auto start = Clock::now();
    size_t next_record = 0;
    while (true) {
      for (Seq& s : seqs) {
        while (!s.busy && next_record < lines.size()) {
          size_t r = next_record++;
          if (!Prepare(lines[r], &s.job)) {
            ++result.errors;
            continue;
          }
          s.busy = true;
          s.record = r;
          s.n_fed = 0;
          s.n_past = 0;
          s.n_generated = 0;
          s.text.clear();
          llama_sampler_reset(s.sampler);
        }
      }
      batch.n_tokens = 0;
      for (size_t k = 0; k < seqs.size(); ++k) {
        Seq& s = seqs[k];
        s.i_logits = -1;
        if (s.busy && s.n_fed == static_cast<int>(s.job.prompt.size())) {
          Add(batch, s.next, s.n_past, static_cast<llama_seq_id>(k), true);
          s.i_logits = batch.n_tokens - 1;
        }
      }
      for (size_t k = 0; k < seqs.size(); ++k) {
        Seq& s = seqs[k];
        const int n_prompt = static_cast<int>(s.job.prompt.size());
        if (!s.busy || s.n_fed == n_prompt) continue;
        for (; s.n_fed < n_prompt && batch.n_tokens < n_batch; ++s.n_fed) {
          bool last = s.n_fed + 1 == n_prompt;
          Add(batch, s.job.prompt[s.n_fed], s.n_fed, static_cast<llama_seq_id>(k), last);
          if (last) s.i_logits = batch.n_tokens - 1;
        }
      }
      if (batch.n_tokens == 0) break;
      if (llama_decode(ctx_, batch) != 0) Die("llama_decode failed");
      for (size_t k = 0; k < seqs.size(); ++k) {
        Seq& s = seqs[k];
        if (!s.busy || s.i_logits < 0) continue;  // idle, or a prompt not fully fed yet
        s.n_past = s.n_generated == 0 ? s.n_fed : s.n_past + 1;
        llama_token token = llama_sampler_sample(s.sampler, ctx_, s.i_logits);
        if (llama_vocab_is_eog(vocab_, token)) {
          release(s, static_cast<llama_seq_id>(k));
          continue;
        }
        s.text += Piece(token);
        ++s.n_generated;
        if (s.n_generated >= s.job.max_tokens || s.n_past + 1 >= n_ctx_seq_) {
          release(s, static_cast<llama_seq_id>(k));
        } else {
          s.next = token;
        }
      }
    }
    result.seconds = SecondsSince(start);
    for (Seq& s : seqs) llama_sampler_free(s.sampler);
    llama_batch_free(batch);
    return result;
  }

 private:
  struct Job {
    std::vector<llama_token> prompt;
    int max_tokens = 0;
  };

  static void Add(llama_batch& batch, llama_token token, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = batch.n_tokens++;
    batch.token[i] = token;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
  }

  // Parses a record, renders its prompt and tokenizes it; false for a record the runner would
  // answer with an error line (none in the benchmark's input).
  bool Prepare(const std::string& line, Job* job) {
    minions::ParsedRecord parsed = minions::ParseRecordLine(line);
    if (!parsed.ok()) return false;
    const minions::InferenceRequest& req = *parsed.request;
    const bool chat = req.endpoint == minions::Endpoint::kChatCompletions;
    if (!chat && req.endpoint != minions::Endpoint::kCompletions) return false;
    std::string text;
    if (chat) {
      std::vector<llama_chat_message> messages;
      for (const auto& m : req.messages) messages.push_back({m.role.c_str(), m.content.c_str()});
      const char* tmpl = chat_template_.empty() ? "chatml" : chat_template_.c_str();
      size_t guess = 256;
      for (const auto& m : req.messages) guess += 2 * m.content.size() + 32;
      std::vector<char> buf(guess);
      int32_t n = llama_chat_apply_template(tmpl, messages.data(), messages.size(), true, buf.data(),
                                            static_cast<int32_t>(buf.size()));
      if (n > static_cast<int32_t>(buf.size())) {
        buf.resize(static_cast<size_t>(n));
        n = llama_chat_apply_template(tmpl, messages.data(), messages.size(), true, buf.data(), n);
      }
      if (n < 0) return false;
      text.assign(buf.data(), static_cast<size_t>(n));
    } else {
      text = req.prompt;
    }
    job->prompt.resize(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), job->prompt.data(),
                               static_cast<int32_t>(job->prompt.size()), true, chat);
    if (n < 0) {
      job->prompt.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), job->prompt.data(),
                         static_cast<int32_t>(job->prompt.size()), true, chat);
    }
    job->prompt.resize(static_cast<size_t>(std::max(n, 0)));
    const int n_prompt = static_cast<int>(job->prompt.size());
    if (n_prompt == 0 || n_prompt >= n_ctx_seq_) return false;
    const int default_max = chat ? 256 : 16;  // the runner's defaults (load option, OpenAI's 16)
    job->max_tokens = req.sampling.max_tokens.value_or(std::min(default_max, n_ctx_seq_ - n_prompt));
    return n_prompt + job->max_tokens <= n_ctx_seq_;
  }

  std::string Piece(llama_token token) const {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, false);
    if (n < 0) {
      std::string big(static_cast<size_t>(-n), '\0');
      n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, false);
      big.resize(static_cast<size_t>(std::max(n, 0)));
      return big;
    }
    return std::string(buf, static_cast<size_t>(n));
  }

  ContextShape shape_;
  llama_model* model_ = nullptr;
  const llama_vocab* vocab_ = nullptr;
  std::map<int, llama_context*> contexts_;  // by number of sequences
  llama_context* ctx_ = nullptr;            // the one in use
  int n_ctx_seq_ = 0;
  std::string chat_template_;
};

// ---------------------------------------------------------------------------------------------
// (c): the runner.

RunResult RunThroughRunner(minions::RunnerProcess& runner, const std::string& batch_id,
                           const std::vector<std::string>& lines) {
  RunResult result;
  result.texts.resize(lines.size());
  std::vector<minions::Json> outputs(lines.size());
  auto start = Clock::now();
  auto done = runner.RunBatch(batch_id, lines, [&](size_t index, const minions::Json& line) {
    outputs[index] = line;
  });
  result.seconds = SecondsSince(start);
  if (!done.ok()) Die(absl::StrCat("runner batch failed: ", std::string(done.status().message())));
  const minions::Json& usage = (*done)["usage"];
  result.prompt_tokens = usage.value("prompt_tokens", int64_t{0});
  result.generated_tokens = usage.value("completion_tokens", int64_t{0});
  result.errors = done->value("errors", size_t{0});
  result.runner_seconds = done->value("seconds", 0.0);
  result.records = lines.size() - result.errors;
  for (size_t i = 0; i < lines.size(); ++i) {
    const minions::Json& out = outputs[i];
    if (!out.is_object() || !out.contains("response") || !out["response"].is_object()) continue;
    const minions::Json& choice = out["response"]["body"]["choices"][0];
    if (choice.contains("text")) {
      result.texts[i] = choice["text"].get<std::string>();
    } else if (choice.contains("message")) {
      result.texts[i] = choice["message"]["content"].get<std::string>();
    }
  }
  return result;
}

// (d), diagnostic: the runner's engine called in this process, without the runner process, its
// pipes and the JSON that crosses them. (c) - (d) is the cost of the process boundary.
RunResult RunEngineInProcess(minions::llama_runner::LlamaEngine& engine, const std::vector<std::string>& lines) {
  RunResult result;
  result.texts.resize(lines.size());
  auto start = Clock::now();
  std::vector<minions::llama_runner::WorkItem> items;
  for (size_t i = 0; i < lines.size(); ++i) {
    minions::ParsedRecord parsed = minions::ParseRecordLine(lines[i]);
    if (!parsed.ok()) {
      ++result.errors;
      continue;
    }
    items.push_back({"", i, std::move(*parsed.request)});
  }
  engine.Serve(
      std::move(items),
      [&](minions::llama_runner::WorkResult r) {
        if (r.is_error) {
          ++result.errors;
          return;
        }
        ++result.records;
        result.prompt_tokens += r.usage.prompt_tokens;
        result.generated_tokens += r.usage.completion_tokens;
        const minions::Json& choice = r.output["response"]["body"]["choices"][0];
        result.texts[r.index] = choice.contains("text") ? choice["text"].get<std::string>()
                                                        : choice["message"]["content"].get<std::string>();
      },
      [] { return false; });
  result.seconds = SecondsSince(start);
  return result;
}

// Writes the test model with the sibling program minions-make-test-model.
std::string MakeTestModel(const std::string& dir) {
  std::string path = (std::filesystem::path(dir) / "minions-test-text.gguf").string();
  minions::Subprocess::Options sp;
  sp.argv = {minions::SiblingProgram("minions-make-test-model"), "-o", path};
  auto process = minions::Subprocess::Start(sp);
  if (!process.ok()) Die(absl::StrCat("cannot start minions-make-test-model: ", std::string(process.status().message())));
  while ((*process)->ReadLine().ok()) {
  }
  auto exit = (*process)->Wait();
  if (!exit.ok() || !exit->exited || exit->code != 0) {
    Die(absl::StrCat("minions-make-test-model failed (", exit.ok() ? exit->ToString() : "no exit status",
                     "); pass --model or set MINIONS_VOCAB_DIR"));
  }
  return path;
}

// Keeps the fastest of `repeat` passes (and the time of the slowest).
void KeepBest(std::optional<RunResult>& best, RunResult run) {
  const double slowest = std::max(run.seconds, best ? best->slowest_seconds : 0.0);
  if (!best || run.seconds < best->seconds) best = std::move(run);
  best->slowest_seconds = slowest;
}

// Text as it reads after a trip through an output line (invalid UTF-8 becomes U+FFFD).
std::string AsInOutputLine(const std::string& text) {
  auto parsed = minions::ParseJson(minions::DumpJson(minions::Json(text)));
  return parsed.ok() && parsed->is_string() ? parsed->get<std::string>() : text;
}

// Records whose generated text differs between two variants (records without text excluded).
size_t Mismatches(RunResult x, RunResult y) {
  size_t n = 0;
  for (auto* run : {&x, &y}) {
    for (auto& text : run->texts) {
      if (text) text = AsInOutputLine(*text);
    }
  }
  for (size_t i = 0; i < x.texts.size() && i < y.texts.size(); ++i) {
    if (x.texts[i] && y.texts[i] && *x.texts[i] != *y.texts[i]) ++n;
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions opt;
  CLI::App app{"The Minions runner against the same work done directly with llama.cpp (one prompt "
               "at a time, and batched); see docs/benchmarks.md",
               "minions-bench-runner"};
  app.add_option("--model", opt.model, "GGUF model (default: the test model, written to a temp dir)");
  app.add_option("--records", opt.records, "records (greedy chat and completion requests)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-tokens", opt.max_tokens, "max_tokens of every record")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--parallel", opt.parallel, "sequences decoded together in (b) and the runner")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", opt.threads, "CPU threads for every variant (0: all cores)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--repeat", opt.repeat, "timed passes per variant; the fastest counts")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", opt.warmup, "records of the untimed warm-up pass of each variant")
      ->capture_default_str();
  app.add_option("--runner", opt.runner, "runner program (default: minions-llama-runner next to this program)");
  app.add_option("--flash-attn", opt.flash_attn,
                 "flash attention in every variant, as the runner's load option (auto: off on CPU)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_flag("--in-process", opt.in_process,
               "also time (d): the runner's engine (LlamaEngine) in this process, without the runner "
               "process and its pipes (loads the model once more)");
  CLI11_PARSE(app, argc, argv);

  const int threads =
      opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string runner_program =
      opt.runner.empty() ? minions::SiblingProgram("minions-llama-runner") : opt.runner;

  // Quiet llama.cpp (warnings and errors only), as in the runner.
  minions::llama_runner::InstallLlamaLogging();

  char dir_template[] = "/tmp/minions-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) Die("cannot create a temporary folder");
  const std::string tmp_dir = dir_template;
  std::string model = opt.model;
  if (model.empty()) model = MakeTestModel(tmp_dir);

  minions::cli::SamplePromptOptions sample;
  sample.records = opt.records;
  sample.max_tokens = opt.max_tokens;
  sample.include_bad_lines = false;
  sample.include_embeddings = false;
  sample.greedy_only = true;
  const std::vector<std::string> lines = minions::cli::SamplePromptLines(sample);
  sample.records = std::min(opt.warmup, opt.records);
  const std::vector<std::string> warmup_lines = minions::cli::SamplePromptLines(sample);

  // Direct llama.cpp: the model, and the context shape the runner gets too.
  auto load_start = Clock::now();
  ContextShape shape;
  shape.threads = threads;
  shape.flash_attn = FlashAttnType(opt.flash_attn);
  DirectLlama direct(model, shape);
  const int ctx_per_seq = std::min(direct.n_ctx_train(), 4096);  // the runner's default
  direct.set_ctx_per_seq(ctx_per_seq);
  direct.UseContext(opt.parallel);
  direct.UseContext(1);
  const double direct_load_seconds = SecondsSince(load_start);

  // The runner, loaded with the same shape.
  minions::RunnerProcess::Options ro;
  ro.command = {runner_program};
  ro.stderr_path = (std::filesystem::path(tmp_dir) / "runner.log").string();
  auto runner = minions::RunnerProcess::Start(ro);
  if (!runner.ok()) Die(absl::StrCat("cannot start the runner '", runner_program, "': ", std::string(runner.status().message())));
  minions::runner_protocol::LoadRequest load;
  load.model = model;
  load.options.n_parallel = opt.parallel;
  load.options.n_ctx_per_seq = ctx_per_seq;
  load.options.n_batch = shape.n_batch;
  load.options.n_threads = threads;
  load.options.flash_attn = opt.flash_attn;
  load_start = Clock::now();
  auto info = (*runner)->Load(load);
  if (!info.ok()) Die(absl::StrCat("the runner cannot load the model: ", std::string(info.status().message())));
  const double runner_load_seconds = SecondsSince(load_start);

  std::unique_ptr<minions::llama_runner::LlamaEngine> engine;
  if (opt.in_process) {
    auto loaded = minions::llama_runner::LlamaEngine::Load(model, load.options);
    if (!loaded.ok()) Die(absl::StrCat("LlamaEngine cannot load the model: ", std::string(loaded.status().message())));
    engine = std::move(*loaded);
  }

  std::printf("minions-bench-runner: %zu records (greedy, max_tokens %d), parallel %d, threads %d, "
              "repeat %d (fastest pass counts), context %d tokens per sequence, flash attention %s\n",
              lines.size(), opt.max_tokens, opt.parallel, threads, opt.repeat, ctx_per_seq,
              shape.flash_attn == LLAMA_FLASH_ATTN_TYPE_ENABLED    ? "on"
              : shape.flash_attn == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off"
                                                                   : "auto");
  std::printf("model: %s (%s, %lld parameters)\n", model.c_str(),
              info->value("name", std::string("?")).c_str(),
              static_cast<long long>(info->value("n_params", int64_t{0})));
  std::printf("model load (not timed below): direct %.2f s, runner %.2f s\n", direct_load_seconds,
              runner_load_seconds);
  std::fflush(stdout);

  // Warm-up: caches, thread pools, the runner's first batch.
  if (!warmup_lines.empty()) {
    direct.RunSequential(warmup_lines);
    direct.RunBatched(warmup_lines, opt.parallel);
    RunThroughRunner(**runner, "warmup", warmup_lines);
    if (engine) RunEngineInProcess(*engine, warmup_lines);
  }

  // Each timed pass starts after a short pause, so that the threads of the previous variant (often
  // in the other process; ggml's OpenMP workers spin-wait for a while before they sleep) are idle.
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  std::optional<RunResult> seq, batched, served, in_process;
  for (int r = 0; r < opt.repeat; ++r) {
    settle();
    KeepBest(seq, direct.RunSequential(lines));
    settle();
    KeepBest(batched, direct.RunBatched(lines, opt.parallel));
    settle();
    KeepBest(served, RunThroughRunner(**runner, absl::StrCat("bench-", r), lines));
    if (engine) {
      settle();
      KeepBest(in_process, RunEngineInProcess(*engine, lines));
    }
  }
  (*runner)->Shutdown();

  struct Row {
    const char* name;
    const RunResult* run;
  };
  std::vector<Row> rows = {{"(a) llama.cpp, one prompt at a time", &*seq},
                           {"(b) llama.cpp, batched", &*batched},
                           {"(c) minions runner", &*served}};
  if (in_process) rows.push_back({"(d) runner's engine, in-process", &*in_process});
  auto tokens_per_s = [](const RunResult& run) { return run.generated_tokens / std::max(run.seconds, 1e-9); };
  auto records_per_s = [](const RunResult& run) { return run.records / std::max(run.seconds, 1e-9); };
  std::printf("\n%-38s %9s %8s %10s %12s %9s %9s\n", "variant", "seconds", "records", "records/s",
              "gen tokens/s", "vs (b)", "vs (a)");
  for (const Row& row : rows) {
    const RunResult& run = *row.run;
    std::printf("%-38s %9.3f %8zu %10.2f %12.1f %8.1f%% %8.1f%%\n", row.name, run.seconds, run.records,
                records_per_s(run), tokens_per_s(run), 100.0 * tokens_per_s(run) / tokens_per_s(*batched),
                100.0 * tokens_per_s(run) / tokens_per_s(*seq));
  }
  if (opt.repeat > 1) {
    std::printf("spread of the %d passes (slowest / fastest - 1):", opt.repeat);
    for (const Row& row : rows) {
      std::printf(" %.3s %.1f%%", row.name, 100.0 * (row.run->slowest_seconds / std::max(row.run->seconds, 1e-9) - 1));
    }
    std::printf("\n");
  }
  std::printf("(c) inside the runner: %.3f s of %.3f s (the rest: sending the batch, decoding its "
              "command, reading the results)\n",
              served->runner_seconds, served->seconds);
  std::printf("generated tokens: (a) %lld, (b) %lld, (c) %lld; prompt tokens: (a) %lld, (b) %lld, (c) %lld\n",
              static_cast<long long>(seq->generated_tokens), static_cast<long long>(batched->generated_tokens),
              static_cast<long long>(served->generated_tokens), static_cast<long long>(seq->prompt_tokens),
              static_cast<long long>(batched->prompt_tokens), static_cast<long long>(served->prompt_tokens));
  int status = 0;
  if (seq->errors + batched->errors + served->errors > 0) {
    std::printf("WARNING: records failed: (a) %zu, (b) %zu, (c) %zu\n", seq->errors, batched->errors,
                served->errors);
    status = 1;
  }
  if (batched->generated_tokens != served->generated_tokens) {
    std::printf("WARNING: (b) and (c) generated different numbers of tokens; the ratio compares unequal work\n");
  }
  if (size_t n = Mismatches(*batched, *served); n > 0) {
    std::printf("WARNING: %zu records have different text in (b) and (c)\n", n);
  }
  if (in_process && in_process->generated_tokens != served->generated_tokens) {
    std::printf("WARNING: (c) and (d) generated different numbers of tokens\n");
  }
  if (size_t n = Mismatches(*seq, *batched); n > 0) {
    std::printf("note: %zu records have different text in (a) and (b) (batched arithmetic differs)\n", n);
  }
  std::printf("runner / direct batched: %.1f %% (target >= 98 %%)\n",
              100.0 * tokens_per_s(*served) / tokens_per_s(*batched));

  std::error_code ec;
  std::filesystem::remove_all(tmp_dir, ec);
  return status;
}
