#include "runner/llama/record_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "runner/llama/chat_tools.h"

namespace minions::llama_runner {
namespace {

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// What the converter would take but not honour, or would take too much memory for: a repetition
// bound above kMaxSchemaRepetition ("minItems 5000 is above ..."), a $ref outside the schema (the
// converter fetches nothing and would accept any value there). Empty when there is none.
std::string FindUnsupported(const Json& node, int depth = 0) {
  if (depth > 64) return "";
  if (node.is_object()) {
    for (const char* key : {"minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"}) {
      auto it = node.find(key);
      if (it != node.end() && it->is_number() && it->get<double>() > kMaxSchemaRepetition) {
        return absl::StrCat(key, " ", it->dump(), " is above the supported ", kMaxSchemaRepetition);
      }
    }
    if (auto ref = node.find("$ref"); ref != node.end() && (!ref->is_string() || ref->get<std::string>().rfind("#", 0) != 0)) {
      return absl::StrCat("$ref ", Excerpt(ref->dump(), 80), " is not supported (only references inside the schema, \"#/...\")");
    }
    for (const auto& [key, value] : node.items()) {
      if (std::string found = FindUnsupported(value, depth + 1); !found.empty()) return found;
    }
  } else if (node.is_array()) {
    for (const auto& value : node) {
      if (std::string found = FindUnsupported(value, depth + 1); !found.empty()) return found;
    }
  }
  return "";
}

// Runs `fn` with stderr captured and returns what it wrote there: llama.cpp's converter reports a
// pattern it cannot express only as a warning on stderr ("accepting any string"), which for us is
// a constraint dropped in silence, and its grammar parser says what is wrong with GBNF only there.
// Only the serving thread converts; a line another thread logs meanwhile is passed on after.
std::string CaptureStderr(const std::function<void()>& fn) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* capture = open_memstream(&buffer, &size);
  if (capture == nullptr) {
    fn();
    return "";
  }
  FILE* saved = stderr;
  stderr = capture;
  struct Restore {
    FILE* saved;
    FILE* capture;
    ~Restore() {
      stderr = saved;
      fclose(capture);
    }
  };
  {
    Restore restore{saved, capture};
    fn();
  }
  std::string text(buffer, size);
  free(buffer);
  return text;
}

// The converter's warning about what it could not express, or empty; the rest goes to stderr.
std::string TakeConversionWarning(std::string text) {
  const std::string marker = "WARNING: JSON schema conversion was incomplete: ";
  std::string warning;
  if (size_t at = text.find(marker); at != std::string::npos) {
    warning = LastLine(text.substr(at + marker.size()));
    text.erase(at);
  }
  if (!text.empty()) fputs(text.c_str(), stderr);
  return warning;
}

}  // namespace

absl::StatusOr<std::string> SchemaToGrammar(const std::string& schema_json) {
  auto parsed = ParseJson(schema_json);
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("the schema is not JSON: ", parsed.status().message()));
  if (std::string unsupported = FindUnsupported(*parsed); !unsupported.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the schema's ", unsupported));
  }
  try {
    std::string grammar;
    std::string warning = TakeConversionWarning(
        CaptureStderr([&] { grammar = json_schema_to_grammar(common_json::parse(schema_json)); }));
    if (!warning.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("the schema cannot be turned into a grammar: ", Excerpt(warning, 400)));
    }
    return grammar;
  } catch (const std::exception& e) {
    // The converter lists what it could not express ("Unrecognized schema: ...", "Unsupported
    // ref: ...", "Invalid pattern ..."), one per line after a heading.
    std::string what = LastLine(e.what());
    const std::string heading = "JSON schema conversion failed:\n";
    if (what.rfind(heading, 0) == 0) what = what.substr(heading.size());
    for (char& c : what) {
      if (c == '\n') c = ';';
    }
    return absl::InvalidArgumentError(absl::StrCat("the schema cannot be turned into a grammar: ", Excerpt(what, 400)));
  }
}

GrammarCache::~GrammarCache() {
  for (auto& [key, entry] : entries_) {
    if (entry.prototype) llama_sampler_free(entry.prototype);
  }
}

GrammarCache::Entry& GrammarCache::Find(std::string key, const std::function<void(Entry&)>& compile) {
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  ++compiled_;
  Entry entry;
  compile(entry);
  if (entries_.size() >= kMaxEntries) {
    auto& oldest = entries_[order_.front()];
    if (oldest.prototype) llama_sampler_free(oldest.prototype);
    entries_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(key);
  return entries_.emplace(std::move(key), std::move(entry)).first->second;
}

GrammarMask& GrammarCache::Mask() {
  if (!mask_) mask_ = std::make_unique<GrammarMask>(vocab_);
  return *mask_;
}

absl::StatusOr<llama_sampler*> GrammarCache::NewSampler(const OutputFormat& format) {
  if (format.kind == OutputFormat::Kind::kText) return nullptr;
  Entry& entry = Find(absl::StrCat(static_cast<int>(format.kind), ":", format.text), [&](Entry& entry) {
    absl::StatusOr<std::string> gbnf;
    switch (format.kind) {
      case OutputFormat::Kind::kJsonObject: gbnf = SchemaToGrammar(R"({"type":"object"})"); break;
      case OutputFormat::Kind::kJsonSchema: gbnf = SchemaToGrammar(format.text); break;
      case OutputFormat::Kind::kGrammar: gbnf = format.text; break;
      case OutputFormat::Kind::kText: break;
    }
    if (!gbnf.ok()) {
      entry.error = std::string(gbnf.status().message());
      return;
    }
    // llama.cpp's parser logs what is wrong and returns null (or throws on some inputs).
    std::string said;
    try {
      said = CaptureStderr([&] { entry.prototype = llama_sampler_init_grammar(vocab_, gbnf->c_str(), "root"); });
    } catch (const std::exception& e) {
      entry.error = e.what();
    }
    if (entry.prototype == nullptr && entry.error.empty()) {
      // The parser's first line says what it expected where ("parse: error parsing grammar: ...").
      std::string detail = LastLine(said.substr(0, said.find('\n')));
      entry.error = absl::StrCat(format.kind == OutputFormat::Kind::kGrammar
                                     ? "the grammar is not valid GBNF with a root rule"
                                     : "the grammar compiled from the schema was refused by llama.cpp",
                                 detail.empty() ? "" : ": ", Excerpt(detail, 200));
    }
  });
  if (entry.prototype == nullptr) return absl::InvalidArgumentError(absl::StrCat(format.param, ": ", entry.error));
  return llama_sampler_clone(entry.prototype);
}

absl::StatusOr<llama_sampler*> GrammarCache::NewToolSampler(const ToolGrammar& grammar) {
  Entry& entry = Find(grammar.Key(), [&](Entry& entry) {
    std::vector<const char*> patterns;
    for (const auto& p : grammar.trigger_patterns) patterns.push_back(p.c_str());
    std::string said;
    try {
      said = CaptureStderr([&] {
        entry.prototype = grammar.lazy ? llama_sampler_init_grammar_lazy_patterns(
                                             vocab_, grammar.gbnf.c_str(), "root", patterns.data(), patterns.size(),
                                             grammar.trigger_tokens.data(), grammar.trigger_tokens.size())
                                       : llama_sampler_init_grammar(vocab_, grammar.gbnf.c_str(), "root");
      });
    } catch (const std::exception& e) {
      entry.error = e.what();
    }
    if (entry.prototype == nullptr && entry.error.empty()) {
      entry.error = absl::StrCat("llama.cpp refused the tool-call grammar it built for these tools: ",
                                 Excerpt(LastLine(said.substr(0, said.find('\n'))), 200));
    }
  });
  if (entry.prototype == nullptr) return absl::InvalidArgumentError(absl::StrCat("body.tools: ", entry.error));
  return llama_sampler_clone(entry.prototype);
}

namespace {

// The tokens at the end of `prompt` that spell `text` exactly (the template's generation prompt,
// which a tool-call grammar starts with); empty when the token boundaries do not line up.
std::vector<int32_t> PromptSuffixTokens(const llama_vocab* vocab, const std::vector<int32_t>& prompt,
                                        const std::string& text) {
  std::string spelled;
  size_t i = prompt.size();
  while (i > 0 && spelled.size() < text.size()) {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab, prompt[i - 1], buf, sizeof(buf), 0, true);
    if (n < 0) return {};
    spelled.insert(0, buf, static_cast<size_t>(n));
    --i;
  }
  if (spelled != text) return {};
  return std::vector<int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(i), prompt.end());
}

}  // namespace

llama_sampler* RecordSampler::PlainChain(const SamplingParams& params, uint64_t seed) {
  // Greedy records need no sampler: the slot takes the argmax of the logits directly, which
  // spares a vocabulary-sized candidate array per token and an allocation per record.
  if (params.temperature <= 0.0f) return nullptr;
  llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (params.top_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_top_p(params.top_p, 1));
  llama_sampler_chain_add(chain, llama_sampler_init_temp(params.temperature));
  llama_sampler_chain_add(chain, llama_sampler_init_dist(static_cast<uint32_t>(seed ^ (seed >> 32))));
  return chain;
}

absl::StatusOr<std::unique_ptr<RecordSampler>> RecordSampler::Create(const llama_model* model,
                                                                     const InferenceRequest& request, uint64_t seed,
                                                                     int max_tokens, GrammarCache& grammars,
                                                                     const ToolGrammar* tools,
                                                                     const std::vector<int32_t>* prompt) {
  const SamplingParams& params = request.sampling;
  const bool tool_grammar = tools != nullptr && !tools->gbnf.empty();
  if (params.Plain() && request.format.kind == OutputFormat::Kind::kText && request.logprobs < 0 && !tool_grammar) {
    return nullptr;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::vector<llama_logit_bias> biases;
  for (const LogitBias& b : params.logit_bias) {
    if (b.token < 0 || b.token >= n_vocab) {
      return absl::InvalidArgumentError(absl::StrCat("body.logit_bias: token id ", b.token,
                                                     " is not in the model's vocabulary (ids 0 to ", n_vocab - 1, ")"));
    }
    // -100 forbids the token, as OpenAI documents; other values are added to its logit.
    biases.push_back({b.token, b.bias <= -100.0f ? -INFINITY : b.bias});
  }
  std::unique_ptr<RecordSampler> sampler(new RecordSampler());
  sampler->vocab_ = vocab;
  sampler->n_vocab_ = n_vocab;
  sampler->logprobs_top_ = request.logprobs;
  if (request.format.kind != OutputFormat::Kind::kText) {
    auto grammar = grammars.NewSampler(request.format);
    if (!grammar.ok()) return grammar.status();
    sampler->grammar_ = *grammar;
    // The converter's GBNF matches text only; a user's GBNF may name token ids.
    if (request.format.kind != OutputFormat::Kind::kGrammar || GrammarMask::JudgesTextOnly(request.format.text)) {
      sampler->mask_ = &grammars.Mask();
    }
  } else if (tool_grammar) {
    auto grammar = grammars.NewToolSampler(*tools);
    if (!grammar.ok()) return grammar.status();
    sampler->grammar_ = *grammar;
    if (!tools->generation_prompt.empty()) {
      // As llama-server does: the grammar's root begins with what the template put at the end of
      // the prompt ("<|im_start|>assistant\n"); advance it over those tokens.
      std::vector<int32_t> prefill = prompt ? PromptSuffixTokens(vocab, *prompt, tools->generation_prompt)
                                            : std::vector<int32_t>{};
      if (prefill.empty()) {
        return absl::InternalError("the tool-call grammar starts with the template's generation prompt, which the "
                                   "prompt's tokens do not end with");
      }
      try {
        for (int32_t token : prefill) llama_sampler_accept(sampler->grammar_, token);
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat("the tool-call grammar refused the template's generation prompt: ", e.what()));
      }
      sampler->utf8_remain_ = GrammarMask::Utf8Remain(0, tools->generation_prompt);
    }
    // A lazy grammar (tool_choice auto) replays part of a token when it wakes: judged in full.
    if (!tools->lazy && GrammarMask::JudgesTextOnly(tools->gbnf)) sampler->mask_ = &grammars.Mask();
  }
  llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
  sampler->chain_ = chain;
  if (!biases.empty()) {
    llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, static_cast<int32_t>(biases.size()), biases.data()));
  }
  if (params.presence_penalty != 0 || params.frequency_penalty != 0 || params.repeat_penalty != 1) {
    // The window is the whole answer: OpenAI's penalties count every token generated so far.
    llama_sampler_chain_add(chain, llama_sampler_init_penalties(n_vocab, std::max(max_tokens, 1), params.repeat_penalty,
                                                                params.frequency_penalty, params.presence_penalty));
  }
  if (params.temperature <= 0.0f) {
    llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    return sampler;
  }
  // llama.cpp's server's order: top_k, top_p, min_p, then temperature.
  if (params.top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(params.top_k));
  if (params.top_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_top_p(params.top_p, 1));
  if (params.min_p > 0.0f) llama_sampler_chain_add(chain, llama_sampler_init_min_p(params.min_p, 1));
  llama_sampler_chain_add(chain, llama_sampler_init_temp(params.temperature));
  llama_sampler_chain_add(chain, llama_sampler_init_dist(static_cast<uint32_t>(seed ^ (seed >> 32))));
  return sampler;
}

RecordSampler::~RecordSampler() {
  if (chain_) llama_sampler_free(chain_);
  if (grammar_) llama_sampler_free(grammar_);
}

int32_t RecordSampler::Sample(llama_context* ctx, int32_t idx) {
  const float* logits = llama_get_logits_ith(ctx, idx);
  auto fill = [&] {
    cur_.resize(static_cast<size_t>(n_vocab_));
    for (int i = 0; i < n_vocab_; ++i) cur_[i] = llama_token_data{i, logits[i], 0.0f};
    return llama_token_data_array{cur_.data(), cur_.size(), -1, false};
  };
  llama_token_data_array candidates = fill();
  llama_sampler_apply(chain_, &candidates);
  int32_t token = candidates.selected >= 0 ? candidates.data[candidates.selected].id : -1;
  if (grammar_ != nullptr && token >= 0) {
    // llama.cpp's rejection sampling (as common_sampler does): check the pick against the grammar
    // and only when it does not fit, mask the whole vocabulary and pick again. Most picks fit.
    llama_token_data single{token, 1.0f, 0.0f};
    llama_token_data_array one{&single, 1, -1, false};
    llama_sampler_apply(grammar_, &one);
    if (single.logit == -INFINITY) {
      candidates = fill();
      if (mask_ != nullptr && utf8_remain_ == 0) {
        mask_->Apply(grammar_, cur_);
      } else {
        llama_sampler_apply(grammar_, &candidates);
      }
      bool any = false;
      for (size_t i = 0; i < candidates.size && !any; ++i) any = candidates.data[i].logit != -INFINITY;
      if (!any) return -1;
      llama_sampler_apply(chain_, &candidates);
      token = candidates.selected >= 0 ? candidates.data[candidates.selected].id : -1;
    }
  }
  if (token >= 0 && logprobs_top_ >= 0) {
    // The model's own distribution: log-softmax of the raw logits, before biases, penalties,
    // temperature and grammar (what OpenAI reports).
    float max = *std::max_element(logits, logits + n_vocab_);
    double sum = 0;
    for (int i = 0; i < n_vocab_; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    const float log_z = max + static_cast<float>(std::log(sum));
    pending_.token = token;
    pending_.logprob = logits[token] - log_z;
    pending_.top.clear();
    if (logprobs_top_ > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(n_vocab_));
      for (int i = 0; i < n_vocab_; ++i) ids[i] = i;
      const size_t k = std::min<size_t>(static_cast<size_t>(logprobs_top_), ids.size());
      std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      for (size_t i = 0; i < k; ++i) pending_.top.emplace_back(ids[i], logits[ids[i]] - log_z);
    }
  }
  return token;
}

bool RecordSampler::Accept(int32_t token) {
  if (grammar_ != nullptr) {
    try {
      llama_sampler_accept(grammar_, token);
    } catch (const std::exception&) {
      return false;
    }
    if (mask_ != nullptr && utf8_remain_ >= 0) {
      char buf[256];
      const int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, true);
      // A piece longer than the buffer is past tracking: the mask is not used again.
      utf8_remain_ = n < 0 ? -1 : GrammarMask::Utf8Remain(utf8_remain_, std::string(buf, static_cast<size_t>(n)));
    }
  }
  llama_sampler_accept(chain_, token);
  if (logprobs_top_ >= 0 && pending_.token == token) logprobs_.push_back(std::move(pending_));
  pending_ = {};
  return true;
}

namespace {

bool IsUtf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return false;
    }
    i += n;
  }
  return true;
}

// OpenAI's token string: the piece when it is whole UTF-8 (a token may hold part of a
// character), else "bytes:\xNN..." escapes; `bytes` always has the exact bytes.
std::string TokenString(const std::string& piece) {
  if (IsUtf8(piece)) return piece;
  std::string out = "bytes:";
  for (unsigned char c : piece) absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
  return out;
}

Json Bytes(const std::string& piece) {
  Json bytes = Json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

Json LogprobsJson(const std::vector<TokenLogprob>& entries, Endpoint endpoint, int top, size_t text_size,
                  const std::function<std::string(int32_t)>& piece) {
  if (endpoint == Endpoint::kChatCompletions) {
    Json content = Json::array();
    size_t offset = 0;
    for (const TokenLogprob& e : entries) {
      std::string text = piece(e.token);
      if (offset >= text_size) break;
      offset += text.size();
      Json alternatives = Json::array();
      for (const auto& [token, logprob] : e.top) {
        std::string alt = piece(token);
        alternatives.push_back({{"token", TokenString(alt)}, {"logprob", logprob}, {"bytes", Bytes(alt)}});
      }
      content.push_back({{"token", TokenString(text)},
                         {"logprob", e.logprob},
                         {"bytes", Bytes(text)},
                         {"top_logprobs", std::move(alternatives)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  // The legacy completions shape: parallel arrays, alternatives as {token: logprob} objects.
  Json tokens = Json::array(), token_logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  size_t offset = 0;
  for (const TokenLogprob& e : entries) {
    std::string text = piece(e.token);
    if (offset >= text_size) break;
    tokens.push_back(TokenString(text));
    token_logprobs.push_back(e.logprob);
    offsets.push_back(offset);
    offset += text.size();
    if (top > 0) {
      Json alternatives = Json::object();
      // An object cannot hold one key twice, and two tokens can spell the same text (a byte
      // token and the character it encodes, two byte pieces of one character...): the most likely
      // of them keeps the key (the list is most likely first), as each value stays one token's own
      // log probability. Chat's list shape has every alternative, with its bytes.
      for (const auto& [token, logprob] : e.top) alternatives.emplace(TokenString(piece(token)), logprob);
      tops.push_back(std::move(alternatives));
    }
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", top > 0 ? std::move(tops) : Json(nullptr)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace minions::llama_runner
