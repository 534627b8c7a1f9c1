#include "runner/llama/llama_engine.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ggml-backend.h"
#include "common/logging.h"
#include "llama.h"
#include "runner/llama/batch_add.h"
#include "runner/llama/chat_tools.h"
#include "runner/llama/choices.h"
#include "runner/llama/devices.h"
#include "runner/llama/fingerprint.h"
#include "runner/llama/gang_placement.h"
#include "runner/llama/record_sampler.h"

namespace minions::llama_runner {
namespace {

std::mutex g_log_mu;
std::string g_last_llama_error;
void LlamaLog(ggml_log_level level, const char* text, void* /*user_data*/) {
  if (level == GGML_LOG_LEVEL_INFO) NoteLoadLine(text);  // where the weights went (devices.h)
  if (level == GGML_LOG_LEVEL_ERROR) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_last_llama_error = text;
    while (!g_last_llama_error.empty() &&
           (g_last_llama_error.back() == '\n' || g_last_llama_error.back() == ' ')) {
      g_last_llama_error.pop_back();
    }
  }
  if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
    std::string line(text);
    while (!line.empty() && line.back() == '\n') line.pop_back();
    if (!line.empty()) MINIONS_LOG(Warning) << "llama.cpp: " << line;
  }
}

std::string TakeLastLlamaError() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::string error = std::move(g_last_llama_error);
  g_last_llama_error.clear();
  return error;
}

std::string MetaString(const llama_model* model, const std::string& key) {
  char buf[512];
  int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
  if (n < 0) return "";
  return std::string(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
}

int DefaultThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 4 : static_cast<int>(n);
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Checks the file before llama.cpp sees it, so common mistakes get a plain message.
absl::Status CheckModelFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model file '", path, "' does not exist"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("model path '", path, "' is not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {0, 0, 0, 0};
  if (!in.read(magic, 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' is unreadable or shorter than a GGUF header"));
  }
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model file '", path, "' is not a GGUF file (convert it with llama.cpp's convert_hf_to_gguf.py)"));
  }
  return absl::OkStatus();
}

llama_flash_attn_type FlashAttnType(const std::string& option) {
  if (option == "on") return LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (option == "off") return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  // On CPU, flash attention picks different kernels for different batch sizes, so a record's
  // output would depend on what it was batched with; without a GPU, determinism wins. Not
  // llama_supports_gpu_offload(): that is true whenever the RPC backend is compiled in, even on a
  // machine without a GPU (and a gang of CPU rpc-servers runs the same CPU kernels remotely).
  if (LocalAccelerators().empty()) return LLAMA_FLASH_ATTN_TYPE_DISABLED;
  return LLAMA_FLASH_ATTN_TYPE_AUTO;
}

// What the generation and embedding contexts share: the threads and flash attention the load
// options ask for, and no performance counters.
llama_context_params BaseContextParams(const runner_protocol::LoadOptions& options) {
  llama_context_params cparams = llama_context_default_params();
  const int threads = options.n_threads > 0 ? options.n_threads : DefaultThreads();
  cparams.n_threads = threads;
  cparams.n_threads_batch = threads;
  cparams.flash_attn_type = FlashAttnType(options.flash_attn);
  cparams.no_perf = true;
  return cparams;
}

}  // namespace

void InstallLlamaLogging() {
  llama_log_set(LlamaLog, nullptr);
  LoadLlamaBackends();  // a build with dynamically loaded backends (the vulkan variant) loads them here
  llama_backend_init();
}

// One decode slot: a sequence id with its own KV stream, and the record it serves.
struct LlamaEngine::Slot {
  llama_seq_id seq = 0;
  // tokens[0, n_past) are in this slot's KV stream, whether it serves a record or not: a finished
  // record's cells stay until the slot's next record, which keeps what it shares with them.
  std::vector<llama_token> tokens;
  llama_pos n_past = 0;

  bool active = false;  // serving `item`
  WorkItem item;
  size_t n_prompt = 0;   // tokens[0, n_prompt) is the prompt; generated tokens follow
  size_t n_fed = 0;      // prompt tokens in the cache or in the batch being decoded
  size_t n_cached = 0;   // prompt tokens taken from a cache instead of computed
  int waiting_on = -1;   // a slot computing a prefix of this prompt; -1: feeding itself
  int max_tokens = 0;
  int n_generated = 0;
  std::string text;
  bool decoding_pending = false;  // tokens.back() is in the batch being decoded
  int32_t logit_index = -1;       // row of this slot's logits in the last batch, -1 if none
  llama_sampler* sampler = nullptr;  // the plain path's chain (null: greedy argmax)
  std::unique_ptr<RecordSampler> rich;  // instead, for records that ask for more (grammar, logprobs...)
  std::shared_ptr<const RenderedChat> chat;  // rendered by chat_tools.h: its parser splits the answer
};

namespace {

// The source's next record that is not cancelled (each cancelled one it comes to is answered as
// dropped); nullopt when none is ready.
std::optional<WorkItem> NextLive(WorkSource& source) {
  for (std::optional<WorkItem> item = source.Next(); item; item = source.Next()) {
    if (!source.Cancelled(*item)) return item;
    source.OnDropped(*item);
  }
  return std::nullopt;
}

// Length of the common prefix of a[0, na) and b[0, nb).
size_t CommonPrefix(const std::vector<llama_token>& a, size_t na, const std::vector<llama_token>& b, size_t nb) {
  const size_t n = std::min({na, nb, a.size(), b.size()});
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// The fewest prompt tokens worth taking from another slot's cells. llama.cpp copies a KV stream
// whole (every cell of every layer), so a short common prefix is cheaper to compute again.
constexpr size_t kMinSharedTokens = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaEngine>> LlamaEngine::Load(
    const std::string& model_path, const runner_protocol::LoadOptions& options, const runner_protocol::Gang& gang) {
  if (auto status = CheckModelFile(model_path); !status.ok()) return status;
  auto engine = std::unique_ptr<LlamaEngine>(new LlamaEngine());
  engine->model_path_ = model_path;
  engine->options_ = options;

  llama_model_params mparams = llama_model_default_params();
  mparams.n_gpu_layers = options.n_gpu_layers < 0 ? 999 : options.n_gpu_layers;
  GangPlacement placement;
  if (!gang.servers.empty()) {
    ASSIGN_OR_RETURN(placement, PlaceGang(model_path, gang, options.n_gpu_layers));
    mparams.devices = placement.devices.data();
    mparams.tensor_split = placement.split.data();
    mparams.split_mode = LLAMA_SPLIT_MODE_LAYER;
    mparams.n_gpu_layers = placement.n_gpu_layers;
    engine->gang_info_ = placement.info;
  }
  TakeLastLlamaError();
  TakeLoadFacts();
  engine->model_ = llama_model_load_from_file(model_path.c_str(), mparams);
  engine->load_facts_ = TakeLoadFacts();
  if (engine->model_ == nullptr) {
    std::string detail = TakeLastLlamaError();
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load model '", model_path, "': ",
        detail.empty() ? "llama.cpp rejected the file (corrupt, truncated or an unsupported architecture)"
                       : detail));
  }
  std::string name = MetaString(engine->model_, "general.name");
  if (name.empty()) {
    auto slash = model_path.rfind('/');
    name = slash == std::string::npos ? model_path : model_path.substr(slash + 1);
  }
  engine->model_name_ = name;
  engine->fingerprint_ = SystemFingerprint(engine->model_);
  std::string arch = MetaString(engine->model_, "general.architecture");
  std::string pooling = MetaString(engine->model_, arch + ".pooling_type");
  std::string causal = MetaString(engine->model_, arch + ".attention.causal");
  engine->embedding_model_ = (!pooling.empty() && pooling != "0") || causal == "false";
  if (const char* tmpl = llama_model_chat_template(engine->model_, nullptr)) {
    engine->chat_template_ = tmpl;
    if (!engine->embedding_model_) engine->chat_templates_ = ChatTemplates::Create(engine->model_);
  }
  if (engine->embedding_model_) {
    if (auto s = engine->EnsureEmbeddingContext(); !s.ok()) return s;
  } else {
    if (auto s = engine->CreateGenerationContext(); !s.ok()) return s;
  }
  // Prefix sharing keeps and copies KV cells by position: not for recurrent state, nor for
  // sliding-window caches, which drop old positions.
  engine->share_prefixes_ = options.share_prefixes && !engine->embedding_model_ &&
                            !llama_model_is_recurrent(engine->model_) && !llama_model_is_hybrid(engine->model_) &&
                            llama_model_n_swa(engine->model_) == 0;
  return engine;
}

LlamaEngine::~LlamaEngine() {
  for (Slot& slot : slots_) {
    if (slot.sampler) llama_sampler_free(slot.sampler);
    slot.rich.reset();
  }
  grammars_.reset();  // before the model whose vocabulary the grammars use
  if (gen_ctx_) llama_free(gen_ctx_);
  if (embd_ctx_) llama_free(embd_ctx_);
  if (model_) llama_model_free(model_);
}

absl::Status LlamaEngine::CreateGenerationContext() {
  int n_train = llama_model_n_ctx_train(model_);
  int per_seq = options_.n_ctx_per_seq > 0 ? options_.n_ctx_per_seq : std::min(n_train, 4096);
  llama_context_params cparams = BaseContextParams(options_);
  cparams.n_seq_max = static_cast<uint32_t>(options_.n_parallel);
  cparams.n_ctx = static_cast<uint32_t>(per_seq * options_.n_parallel);
  // Every generating sequence adds one token per step, so a batch must hold at least n_parallel.
  const int n_batch = std::max(options_.n_batch, options_.n_parallel);
  cparams.n_batch = static_cast<uint32_t>(n_batch);
  cparams.n_ubatch = static_cast<uint32_t>(std::min(n_batch, 512));
  // Separate KV streams: a sequence attends only to its own cells, which is faster than masking
  // everyone's and keeps each sequence's arithmetic independent of its neighbours (the same cells
  // at the same places whatever the batch). A shared prefix is copied from stream to stream
  // (SharePrefix) rather than held once in a unified cache, for the same reason.
  cparams.kv_unified = false;
  gen_ctx_ = llama_init_from_model(model_, cparams);
  if (gen_ctx_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create a context of ", cparams.n_ctx, " tokens for '", model_path_,
        "': ", TakeLastLlamaError(), " (lower n_parallel or n_ctx_per_seq)"));
  }
  n_ctx_per_seq_ = static_cast<int>(llama_n_ctx_seq(gen_ctx_));
  grammars_ = std::make_unique<GrammarCache>(llama_model_get_vocab(model_));
  slots_.resize(static_cast<size_t>(options_.n_parallel));
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].seq = static_cast<llama_seq_id>(i);
  llama_memory_clear(llama_get_memory(gen_ctx_), true);
  return absl::OkStatus();
}

absl::Status LlamaEngine::EnsureEmbeddingContext() {
  if (embd_ctx_) return absl::OkStatus();
  llama_context_params cparams = BaseContextParams(options_);
  int n_train = llama_model_n_ctx_train(model_);
  // Non-causal models need a whole input inside one micro-batch.
  int n_batch = std::min(std::max(options_.n_batch, 64), std::max(n_train, 64));
  cparams.n_ctx = static_cast<uint32_t>(n_batch);
  cparams.n_batch = static_cast<uint32_t>(n_batch);
  cparams.n_ubatch = static_cast<uint32_t>(n_batch);
  cparams.n_seq_max = static_cast<uint32_t>(std::max(1, options_.n_parallel));
  cparams.embeddings = true;
  // Text models serve /v1/embeddings with mean pooling; embedding models use their own pooling.
  cparams.pooling_type = embedding_model_ ? LLAMA_POOLING_TYPE_UNSPECIFIED : LLAMA_POOLING_TYPE_MEAN;
  cparams.kv_unified = true;
  embd_ctx_ = llama_init_from_model(model_, cparams);
  if (embd_ctx_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create an embedding context for '", model_path_, "': ", TakeLastLlamaError()));
  }
  if (llama_pooling_type(embd_ctx_) == LLAMA_POOLING_TYPE_NONE) {
    return absl::FailedPreconditionError("the model has no pooling; it cannot produce embeddings");
  }
  return absl::OkStatus();
}

size_t LlamaEngine::grammars_compiled() const { return grammars_ ? grammars_->compiled() : 0; }

Json LlamaEngine::Info() const {
  Json info;
  info["name"] = model_name_;
  info["architecture"] = MetaString(model_, "general.architecture");
  info["n_params"] = llama_model_n_params(model_);
  info["size_bytes"] = llama_model_size(model_);
  info["n_ctx_train"] = llama_model_n_ctx_train(model_);
  info["n_embd"] = llama_model_n_embd(model_);
  info["n_vocab"] = llama_vocab_n_tokens(llama_model_get_vocab(model_));
  info["embedding_model"] = embedding_model_;
  info["has_chat_template"] = !chat_template_.empty();
  info["n_parallel"] = options_.n_parallel;
  info["n_ctx_per_seq"] = n_ctx_per_seq_;
  // What the contexts were asked for: "disabled" on a machine without its own accelerator.
  info["flash_attn"] = llama_flash_attn_type_name(FlashAttnType(options_.flash_attn));
  if (!gang_info_.is_null()) info["gang"] = gang_info_;
  // This machine's accelerator and what llama.cpp put on it (docs/runner-protocol.md, "Backends").
  std::vector<ggml_backend_dev_t> accelerators = LocalAccelerators();
  if (!accelerators.empty()) {
    const char* description = ggml_backend_dev_description(accelerators[0]);
    info["device"] = description ? description : ggml_backend_dev_name(accelerators[0]);
  }
  if (load_facts_.is_object()) {
    if (load_facts_.contains("model_buffers")) info["model_buffers"] = load_facts_["model_buffers"];
    // llama.cpp says "offloaded" whenever offload is compiled in (the RPC backend is), even with
    // no device to offload to: only a machine with an accelerator has offloaded layers.
    info["offloaded_layers"] = accelerators.empty() ? 0 : JsonInt(load_facts_, "offloaded_layers");
    if (load_facts_.contains("layers")) info["layers"] = load_facts_["layers"];
  }
  info["endpoints"] = embedding_model_
                          ? Json::array({"/v1/embeddings"})
                          : Json::array({"/v1/completions", "/v1/chat/completions", "/v1/embeddings"});
  return info;
}

bool LlamaEngine::RendersWithChatTemplate(const InferenceRequest& request) const {
  return chat_templates_ && chat_templates_->Handles(request);
}

absl::StatusOr<std::string> LlamaEngine::PromptText(const InferenceRequest& request,
                                                    std::shared_ptr<const RenderedChat>* rendered_chat) const {
  if (request.endpoint == Endpoint::kCompletions) return request.prompt;
  if (chat_templates_ && chat_templates_->Handles(request)) {
    auto rendered = chat_templates_->Render(request);
    if (!rendered.ok()) return rendered.status();
    std::string prompt = rendered->prompt;
    if (rendered_chat) *rendered_chat = std::make_shared<const RenderedChat>(std::move(*rendered));
    return prompt;
  }
  if (UsesTools(request)) return NoTemplateForTools();  // a model without a template of its own
  std::vector<llama_chat_message> chat;
  for (const auto& m : request.messages) chat.push_back({m.role.c_str(), m.content.c_str()});
  // Without a template of its own the model gets ChatML, the most common format.
  const char* tmpl = chat_template_.empty() ? "chatml" : chat_template_.c_str();
  size_t guess = 256;
  for (const auto& m : request.messages) guess += 2 * m.content.size() + 32;
  std::vector<char> buf(guess);
  int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), true, buf.data(),
                                        static_cast<int32_t>(buf.size()));
  if (n > static_cast<int32_t>(buf.size())) {
    buf.resize(static_cast<size_t>(n));
    n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), true, buf.data(), n);
  }
  if (n < 0) {
    return absl::FailedPreconditionError(
        "the model's chat template is not one llama.cpp can apply; use /v1/completions");
  }
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::vector<int32_t> LlamaEngine::Tokenize(const std::string& text, bool parse_special) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  std::vector<llama_token> tokens(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                             static_cast<int32_t>(tokens.size()), true, parse_special);
  if (n < 0) {
    tokens.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                       static_cast<int32_t>(tokens.size()), true, parse_special);
  }
  tokens.resize(static_cast<size_t>(std::max(n, 0)));
  return tokens;
}

std::string LlamaEngine::TokenPiece(int32_t token) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  char buf[256];
  int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, false);
  if (n < 0) {
    std::string big(static_cast<size_t>(-n), '\0');
    n = llama_token_to_piece(vocab, token, big.data(), static_cast<int32_t>(big.size()), 0, false);
    big.resize(static_cast<size_t>(std::max(n, 0)));
    return big;
  }
  return std::string(buf, static_cast<size_t>(n));
}

namespace {

// Serve() over a vector: the whole set is one batch, cancelled as a whole.
class VectorSource : public WorkSource {
 public:
  VectorSource(std::vector<WorkItem> items, const LlamaEngine::ResultCallback& on_result,
               const std::function<bool()>& cancelled)
      : items_(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end())),
        on_result_(on_result),
        cancelled_(cancelled) {}
  std::optional<WorkItem> Next() override {
    if (items_.empty() || cancelled_()) return std::nullopt;
    WorkItem item = std::move(items_.front());
    items_.pop_front();
    return item;
  }
  void OnResult(WorkResult result) override { on_result_(std::move(result)); }
  bool Cancelled(const WorkItem&) override { return cancelled_(); }
  void OnDropped(const WorkItem& item) override { unserved_.push_back(item.index); }
  bool Stopping() override { return false; }
  std::vector<size_t> Unserved() {
    for (const auto& item : items_) unserved_.push_back(item.index);
    return std::move(unserved_);
  }

 private:
  std::deque<WorkItem> items_;
  const LlamaEngine::ResultCallback& on_result_;
  const std::function<bool()>& cancelled_;
  std::vector<size_t> unserved_;
};

}  // namespace

std::vector<size_t> LlamaEngine::Serve(std::vector<WorkItem> items, const ResultCallback& on_result,
                                       const std::function<bool()>& cancelled) {
  VectorSource source(std::move(items), on_result, cancelled);
  ServeStream(source);
  return source.Unserved();
}

namespace {

// Answers the item with an error, unless another choice of its record answered it already.
void Fail(WorkSource& source, const WorkItem& item, std::string_view code, const std::string& message) {
  if (!ClaimAnswer(item)) return;
  source.OnResult({item.batch, item.index, MakeErrorLine(item.request.custom_id, code, message), true, {}});
}

}  // namespace

// One ServeStream call's state: where its records come from and the choices of records with
// n > 1 waiting for a slot (taken before the source's next record).
struct LlamaEngine::Stream {
  WorkSource& source;
  const llama_vocab* vocab = nullptr;
  int64_t created = 0;  // the "created" time of every response body
  std::deque<WorkItem> choices;
};

void LlamaEngine::ServeEmbeddingModel(WorkSource& source) {
  // Serve whatever is ready in packed groups; generation is refused.
  std::vector<WorkItem> embeddings;
  while (!source.Stopping()) {
    std::optional<WorkItem> item = NextLive(source);
    if (!item) break;
    if (item->request.endpoint == Endpoint::kEmbeddings) {
      embeddings.push_back(std::move(*item));
      if (embeddings.size() >= 64) {
        ServeEmbeddings(embeddings, source);
        embeddings.clear();
      }
    } else {
      source.OnResult({item->batch, item->index,
                       MakeErrorLine(item->request.custom_id, kErrorInvalidRequest,
                                     absl::StrCat("model '", model_name_,
                                                  "' is an embedding model; it serves /v1/embeddings only")),
                       true, {}});
    }
  }
  ServeEmbeddings(embeddings, source);
}

void LlamaEngine::Finish(Stream& stream, Slot& slot, const std::string& finish_reason) {
  Usage usage{static_cast<int>(slot.n_prompt), slot.n_generated};
  const auto& req = slot.item.request;
  Json body = req.endpoint == Endpoint::kChatCompletions
                  ? MakeChatCompletionBody(req.custom_id, model_name_, slot.text, finish_reason, usage, stream.created)
                  : MakeCompletionBody(req.custom_id, model_name_, slot.text, finish_reason, usage, stream.created);
  body["system_fingerprint"] = fingerprint_;
  if (slot.chat) {
    usage.reasoning_tokens = ShapeChatAnswer(*slot.chat, slot.text, finish_reason, req.custom_id, slot.item.choice,
                                             stream.vocab, body["choices"][0]);
    body["usage"] = usage.ToJson();
  }
  if (slot.rich && req.logprobs >= 0) {
    body["choices"][0]["logprobs"] = LogprobsJson(slot.rich->logprobs(), req.endpoint, req.logprobs, slot.text.size(),
                                                  [this](int32_t token) { return TokenPiece(token); });
  }
  WorkResult result{slot.item.batch, slot.item.index, MakeResponseLine(req.custom_id, std::move(body)), false, usage};
  result.cached_tokens = static_cast<int>(slot.n_cached);
  if (slot.item.group) {
    if (auto merged = AddChoice(slot.item, std::move(result))) stream.source.OnResult(std::move(*merged));
  } else {
    stream.source.OnResult(std::move(result));
  }
  Release(slot);
}

void LlamaEngine::Drop(WorkSource& source, Slot& slot) {
  if (ClaimAnswer(slot.item)) source.OnDropped(slot.item);
  Release(slot);
}

std::optional<WorkItem> LlamaEngine::NextItem(Stream& stream) {
  while (!stream.choices.empty()) {
    WorkItem item = std::move(stream.choices.front());
    stream.choices.pop_front();
    if (!stream.source.Cancelled(item)) return item;
    if (ClaimAnswer(item)) stream.source.OnDropped(item);
  }
  std::optional<WorkItem> item = NextLive(stream.source);
  if (!item || item->request.n <= 1) return item;
  for (WorkItem& choice : ExpandChoices(std::move(*item))) stream.choices.push_back(std::move(choice));
  return std::nullopt;  // the caller asks again
}

bool LlamaEngine::Admit(Stream& stream, WorkItem item) {
  const auto& req = item.request;
  std::shared_ptr<const RenderedChat> chat;
  auto text = PromptText(req, &chat);
  if (!text.ok()) {
    Fail(stream.source, item, kErrorInvalidRequest, std::string(text.status().message()));
    return false;
  }
  if (chat) {
    for (const std::string& stop : chat->stops) item.request.sampling.stop.push_back(stop);
  }
  std::vector<llama_token> prompt = Tokenize(*text, req.endpoint == Endpoint::kChatCompletions);
  if (prompt.empty()) {
    Fail(stream.source, item, kErrorEmptyPrompt, "the prompt has no tokens");
    return false;
  }
  const int n_prompt = static_cast<int>(prompt.size());
  int default_max = req.endpoint == Endpoint::kCompletions ? 16 : options_.default_max_tokens;
  if (n_prompt >= n_ctx_per_seq_) {
    Fail(stream.source, item, kErrorPromptTooLong,
         absl::StrCat("the prompt is ", n_prompt, " tokens; this runner's context is ", n_ctx_per_seq_,
                      " tokens per sequence (shorten the prompt or load with a larger n_ctx_per_seq)"));
    return false;
  }
  int max_tokens;
  if (req.sampling.max_tokens) {
    max_tokens = *req.sampling.max_tokens;
    if (n_prompt + max_tokens > n_ctx_per_seq_) {
      Fail(stream.source, item, kErrorPromptTooLong,
           absl::StrCat("the prompt (", n_prompt, " tokens) plus max_tokens (", max_tokens,
                        ") exceeds this runner's context of ", n_ctx_per_seq_,
                        " tokens per sequence; lower max_tokens or shorten the prompt"));
      return false;
    }
  } else {
    max_tokens = std::min(default_max, n_ctx_per_seq_ - n_prompt);
  }
  const uint64_t seed = req.sampling.seed.value_or(DefaultSeed(req.custom_id));
  auto rich = RecordSampler::Create(model_, req, seed, max_tokens, *grammars_, chat ? &chat->grammar : nullptr, &prompt);
  if (!rich.ok()) {
    Fail(stream.source, item, kErrorInvalidRequest, std::string(rich.status().message()));
    return false;
  }
  // Keep what the slot's cells already hold of this prompt (at least its last token must be
  // decoded, for its logits); the rest of the cells go.
  size_t index = slots_.size(), keep = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].active) continue;
    const size_t held = share_prefixes_ ? CommonPrefix(prompt, prompt.size() - 1, slots_[i].tokens, slots_[i].n_past) : 0;
    if (index == slots_.size() || held > keep) {
      index = i;
      keep = held;
    }
  }
  Slot& slot = slots_[index];
  ForgetFrom(slot, keep);
  slot.tokens = std::move(prompt);
  slot.active = true;
  slot.n_prompt = slot.tokens.size();
  slot.n_fed = keep;
  slot.n_cached = keep;
  slot.waiting_on = -1;
  slot.max_tokens = max_tokens;
  slot.n_generated = 0;
  slot.text.clear();
  slot.decoding_pending = false;
  slot.logit_index = -1;
  slot.rich = std::move(*rich);
  slot.chat = std::move(chat);
  slot.sampler = slot.rich ? nullptr : RecordSampler::PlainChain(req.sampling, seed);
  slot.item = std::move(item);
  if (share_prefixes_) SharePrefix(index);
  return true;
}

void LlamaEngine::FillSlots(Stream& stream) {
  std::vector<WorkItem> embeddings;
  auto free_slots = [&] {
    return std::count_if(slots_.begin(), slots_.end(), [](const Slot& slot) { return !slot.active; });
  };
  while (free_slots() > 0) {
    std::optional<WorkItem> item = NextItem(stream);
    if (!item && !stream.choices.empty()) item = NextItem(stream);  // a record just expanded into its choices
    if (!item) break;
    if (item->request.endpoint == Endpoint::kEmbeddings) {
      embeddings.push_back(std::move(*item));
    } else {
      Admit(stream, std::move(*item));
    }
  }
  if (!embeddings.empty()) ServeEmbeddings(embeddings, stream.source);
}

void LlamaEngine::FillBatch(llama_batch& batch) {
  // Every generating sequence gets its one token (which keeps their latency flat); prompts
  // share what is left of the batch, the first slot first, in chunks. Tokens go into the batch
  // in sequence order: with separate KV streams llama.cpp computes a batch in micro-batches of
  // consecutive sequences with equally many tokens each, so this order makes one micro-batch
  // of every sequence's first token and one more per prompt, instead of one per gap.
  int budget = static_cast<int>(llama_n_batch(gen_ctx_));
  for (Slot& slot : slots_) {
    if (slot.active && slot.waiting_on < 0 && slot.n_fed == slot.n_prompt) --budget;
  }
  batch.n_tokens = 0;
  for (Slot& slot : slots_) {
    slot.logit_index = -1;
    if (!slot.active || slot.waiting_on >= 0) continue;
    if (slot.n_fed == slot.n_prompt) {
      BatchAdd(batch, slot.tokens[slot.n_past], slot.n_past, slot.seq, true);
      slot.logit_index = batch.n_tokens - 1;
      slot.decoding_pending = true;
      continue;
    }
    for (; slot.n_fed < slot.n_prompt && budget > 0; --budget) {
      bool last = slot.n_fed + 1 == slot.n_prompt;
      BatchAdd(batch, slot.tokens[slot.n_fed], static_cast<llama_pos>(slot.n_fed), slot.seq, last);
      if (last) slot.logit_index = batch.n_tokens - 1;
      ++slot.n_fed;
    }
  }
}

void LlamaEngine::TakeToken(Stream& stream, Slot& slot) {
  llama_token token;
  if (slot.rich) {
    token = slot.rich->Sample(gen_ctx_, slot.logit_index);
    if (token < 0) {  // the grammar allows nothing more: the answer is complete
      Finish(stream, slot, "stop");
      return;
    }
  } else if (slot.sampler) {
    token = llama_sampler_sample(slot.sampler, gen_ctx_, slot.logit_index);
  } else {
    const float* logits = llama_get_logits_ith(gen_ctx_, slot.logit_index);
    token = static_cast<llama_token>(std::max_element(logits, logits + llama_vocab_n_tokens(stream.vocab)) - logits);
  }
  if (llama_vocab_is_eog(stream.vocab, token)) {
    Finish(stream, slot, "stop");
    return;
  }
  if (slot.rich && !slot.rich->Accept(token)) {
    Fail(stream.source, slot.item, kErrorRunnerFailed, "the grammar refused the token the sampler picked");
    Release(slot);
    return;
  }
  slot.text += TokenPiece(token);
  ++slot.n_generated;
  bool stopped_by_string = false;
  for (const auto& stop : slot.item.request.sampling.stop) {
    // Only the tail can contain a new match.
    size_t from = slot.text.size() > stop.size() + 64 ? slot.text.size() - stop.size() - 64 : 0;
    size_t pos = slot.text.find(stop, from);
    if (pos != std::string::npos) {
      slot.text.resize(pos);
      stopped_by_string = true;
      break;
    }
  }
  if (stopped_by_string) {
    Finish(stream, slot, "stop");
  } else if (slot.n_generated >= slot.max_tokens || slot.n_past + 1 >= n_ctx_per_seq_) {
    Finish(stream, slot, "length");
  } else {
    slot.tokens.push_back(token);  // decoded in the next step
  }
}

void LlamaEngine::ServeStream(WorkSource& source) {
  if (embedding_model_ || gen_ctx_ == nullptr) {
    ServeEmbeddingModel(source);
    return;
  }
  Stream stream{source, llama_model_get_vocab(model_), UnixSeconds(), {}};
  llama_batch batch = llama_batch_init(static_cast<int>(llama_n_batch(gen_ctx_)), 0, 1);
  while (true) {
    if (source.Stopping()) {
      for (Slot& slot : slots_) {
        if (slot.active) Drop(source, slot);
      }
      for (const WorkItem& item : stream.choices) {
        if (ClaimAnswer(item)) source.OnDropped(item);
      }
      break;
    }
    for (Slot& slot : slots_) {
      if (slot.active && source.Cancelled(slot.item)) Drop(source, slot);
    }
    // Records waiting for another slot's prefix: take it once it is computed (before free slots
    // are refilled, while every finished record's cells are still there).
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].active && slots_[i].waiting_on >= 0) SharePrefix(i);
    }
    // Fill free slots from the source, whichever batch its records come from. Embedding records
    // are set aside and served whole before the next decode step.
    FillSlots(stream);
    // A slot left free (the source has nothing more now) below a busy one splits the batch.
    CompactSlots();
    FillBatch(batch);
    if (batch.n_tokens == 0) break;  // nothing in flight and nothing ready (a waiting slot always
                                     // waits on one that is feeding its prompt)
    int rc = llama_decode(gen_ctx_, batch);
    if (rc != 0) {
      // Should not happen with per-sequence context sizing; fail the records in flight, go on.
      std::string message = absl::StrCat("llama_decode failed (code ", rc, ") ", TakeLastLlamaError());
      MINIONS_LOG(Error) << message;
      for (Slot& slot : slots_) {
        if (!slot.active) continue;
        Fail(source, slot.item, kErrorRunnerFailed, message);
        Release(slot);
        ForgetFrom(slot, 0);  // what the failed decode left in the cells is unknown
      }
      continue;
    }
    for (Slot& slot : slots_) {
      if (!slot.active || slot.waiting_on >= 0) continue;
      // n_past counts the tokens now in this sequence's cache.
      if (slot.decoding_pending) {
        ++slot.n_past;
        slot.decoding_pending = false;
      } else {
        slot.n_past = static_cast<llama_pos>(slot.n_fed);
      }
      if (slot.logit_index >= 0) TakeToken(stream, slot);
    }
    source.StepDone();
  }
  llama_batch_free(batch);
}

void LlamaEngine::Release(Slot& slot) {
  if (slot.sampler) llama_sampler_free(slot.sampler);
  slot.sampler = nullptr;
  slot.rich.reset();
  slot.chat.reset();
  slot.active = false;
  slot.waiting_on = -1;
  // Without sharing, a finished record's cells are dropped at once, as they always were.
  if (!share_prefixes_) ForgetFrom(slot, 0);
}

void LlamaEngine::CompactSlots() {
  llama_memory_t mem = llama_get_memory(gen_ctx_);
  while (true) {
    size_t hole = 0;
    while (hole < slots_.size() && slots_[hole].active) ++hole;
    size_t last = slots_.size();
    while (last > hole + 1 && !slots_[last - 1].active) --last;
    if (last <= hole + 1) return;
    Slot& from = slots_[last - 1];
    Slot& to = slots_[hole];
    // Whoever waits for `from` (or is `from`, waiting) keeps waiting on the same cells.
    if (from.waiting_on >= 0) return;  // moves after its wait: its cells are about to be replaced
    // The stream is copied whole at the start of the next decode (cells keep their places, so
    // the arithmetic is unchanged); the record's state moves with it.
    llama_memory_seq_cp(mem, from.seq, to.seq, -1, -1);
    std::swap(from.seq, to.seq);
    std::swap(from, to);
    // The vacated slot still holds the cells it had: a cache, when sharing.
    Slot& vacated = slots_[last - 1];
    vacated.tokens = slots_[hole].tokens;
    vacated.n_past = slots_[hole].n_past;
    if (!share_prefixes_) ForgetFrom(vacated, 0);
    for (Slot& slot : slots_) {
      if (slot.waiting_on == static_cast<int>(last - 1)) slot.waiting_on = static_cast<int>(hole);
    }
  }
}

void LlamaEngine::ForgetFrom(Slot& slot, size_t keep) {
  llama_memory_t mem = llama_get_memory(gen_ctx_);
  if (keep == 0 || !llama_memory_seq_rm(mem, slot.seq, static_cast<llama_pos>(keep), -1)) {
    llama_memory_seq_rm(mem, slot.seq, -1, -1);
    keep = 0;
  }
  slot.n_past = static_cast<llama_pos>(std::min<size_t>(keep, static_cast<size_t>(slot.n_past)));
  slot.tokens.resize(std::min(slot.tokens.size(), static_cast<size_t>(slot.n_past)));
}

void LlamaEngine::SharePrefix(size_t index) {
  Slot& target = slots_[index];
  // At least the prompt's last token is decoded here, for its logits.
  const size_t cap = target.n_prompt - 1;
  size_t ready = target.n_past, future = target.n_past;
  int ready_from = -1, future_from = -1;
  for (size_t j = 0; j < slots_.size(); ++j) {
    if (j == index) continue;
    const Slot& other = slots_[j];
    const size_t computed = CommonPrefix(target.tokens, cap, other.tokens, other.n_past);
    if (computed > ready) {
      ready = computed;
      ready_from = static_cast<int>(j);
    }
    // A slot feeding its own prompt will have computed what it shares with this one.
    if (other.active && other.waiting_on < 0 && static_cast<size_t>(other.n_past) < other.n_prompt) {
      const size_t coming = CommonPrefix(target.tokens, cap, other.tokens, other.n_prompt);
      if (coming > future) {
        future = coming;
        future_from = static_cast<int>(j);
      }
    }
  }
  // Wait while a slot is computing more of this prompt than is ready anywhere (computing it
  // twice at once would waste the work), if that is worth a copy at all.
  if (future_from >= 0 && future > ready && future >= static_cast<size_t>(target.n_past) + kMinSharedTokens) {
    target.waiting_on = future_from;
    return;
  }
  target.waiting_on = -1;
  if (ready_from >= 0 && ready >= static_cast<size_t>(target.n_past) + kMinSharedTokens) {
    // Streams are copied whole (the copy runs at the start of the next decode, before the batch
    // is computed); then the cells past the shared prefix go.
    llama_memory_t mem = llama_get_memory(gen_ctx_);
    llama_memory_seq_cp(mem, slots_[ready_from].seq, target.seq, -1, -1);
    target.n_past = static_cast<llama_pos>(ready);
    if (!llama_memory_seq_rm(mem, target.seq, static_cast<llama_pos>(ready), -1)) {
      llama_memory_seq_rm(mem, target.seq, -1, -1);
      target.n_past = 0;
    }
    target.n_fed = target.n_cached = static_cast<size_t>(target.n_past);
  }
}

}  // namespace minions::llama_runner
