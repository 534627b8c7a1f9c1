#pragma once
// LlamaEngine: one loaded GGUF model and the contexts that serve it. Text generation decodes up to
// n_parallel sequences per llama_decode call and refills a sequence's slot as soon as it finishes
// (continuous batching); embeddings pack several inputs into one decode.
//
// Shared prefixes (load option share_prefixes, on by default): a slot keeps its last record's KV
// cells, and a new record keeps what its prompt shares with them; a longer prefix computed by
// another slot is copied from that slot's stream, and a prefix another slot is still computing
// is waited for rather than computed twice. Outputs are the same with sharing as without: the
// reused cells hold exactly what the record would have computed, at the same places.
//
// Ownership: owns the llama_model, its contexts, the decode slots (and the KV cells they keep
// between ServeStream calls) and samplers; unloading is destroying the engine.
// Threads: not thread-safe; one thread calls Serve(). The `cancelled` callback passed to Serve may
// read state set by other threads.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_util.h"
#include "runner/batch_record.h"
#include "runner/protocol.h"

struct llama_model;
struct llama_context;
struct llama_sampler;
struct llama_batch;

namespace minions::llama_runner {

class GrammarCache;
class ChatTemplates;
struct RenderedChat;

struct ChoiceGroup;

struct WorkItem {
  std::string batch;  // the caller's batch; echoed in the result
  size_t index = 0;   // the record's position in its batch; echoed in the result
  InferenceRequest request;
  // n > 1: which choice this item generates, and the record's other choices (choices.h).
  int choice = 0;
  std::shared_ptr<ChoiceGroup> group;
};

struct WorkResult {
  std::string batch;
  size_t index = 0;
  Json output;  // one OpenAI Batch output line (a response or an error)
  bool is_error = false;
  Usage usage;
  int cached_tokens = 0;  // prompt tokens whose KV cells came from a cache, not computed
};

// Where a streaming engine gets its work and puts its results. All calls come from the thread
// that runs ServeStream.
class WorkSource {
 public:
  virtual ~WorkSource() = default;
  // The next record to serve, if one is ready; never blocks.
  virtual std::optional<WorkItem> Next() = 0;
  virtual void OnResult(WorkResult result) = 0;
  // True when the item's batch was cancelled: the engine drops it and calls OnDropped.
  virtual bool Cancelled(const WorkItem& item) = 0;
  virtual void OnDropped(const WorkItem& item) = 0;
  // True when everything must stop now (shutdown): active items are dropped.
  virtual bool Stopping() = 0;
  // After each decode step's results: a good moment to flush buffered output.
  virtual void StepDone() {}
};

class LlamaEngine {
 public:
  using ResultCallback = std::function<void(WorkResult)>;

  // Loads the model; a missing, unreadable, truncated or non-GGUF file is an error, not a crash.
  // With a gang, the model's layers are spread over this machine and the gang's rpc-servers in
  // proportion to the memory each offers (the first layers here, the rest in the servers' order);
  // a server that cannot be reached is an Unavailable error.
  static absl::StatusOr<std::unique_ptr<LlamaEngine>> Load(
      const std::string& model_path, const runner_protocol::LoadOptions& options,
      const runner_protocol::Gang& gang = {});
  ~LlamaEngine();
  LlamaEngine(const LlamaEngine&) = delete;
  LlamaEngine& operator=(const LlamaEngine&) = delete;

  // Facts about the model for the `loaded` message (architecture, sizes, chat template, ...).
  Json Info() const;
  bool is_embedding_model() const { return embedding_model_; }
  // Distinct grammars compiled so far (structured outputs compile each schema once).
  size_t grammars_compiled() const;

  // Serves records as the source hands them out, keeping every decode slot busy across the
  // caller's batches: a slot freed by one batch's record takes the next record, whatever its
  // batch. Returns when the source has nothing ready and no record is in flight, or when it says
  // Stopping().
  void ServeStream(WorkSource& source);

  // Serves a fixed set of items, calling `on_result` once per item as soon as it finishes (not
  // in input order). Between decode steps it polls `cancelled`; once that returns true it stops
  // and returns the indexes of the items that got no result.
  std::vector<size_t> Serve(std::vector<WorkItem> items, const ResultCallback& on_result,
                            const std::function<bool()>& cancelled);

 private:
  // Re-scores claimed answers with this engine's model and generation context, between
  // ServeStream calls (runner/llama/rescorer.h).
  friend class Rescorer;
  struct Slot;
  LlamaEngine() = default;

  absl::Status CreateGenerationContext();
  absl::Status EnsureEmbeddingContext();
  // Prompt text for a completion or chat request (chat: the model's template; through llama.cpp's
  // Jinja engine for tools and reasoning templates, chat_tools.h, whose grammar and parser go to
  // `chat` when given).
  absl::StatusOr<std::string> PromptText(const InferenceRequest& request,
                                         std::shared_ptr<const RenderedChat>* chat = nullptr) const;
  // True when the model's own template renders the request (tools, tool history, reasoning): its
  // answer is split by a parser and decoded under a tool-call grammar, which re-scoring does not replay.
  bool RendersWithChatTemplate(const InferenceRequest& request) const;
  std::vector<int32_t> Tokenize(const std::string& text, bool parse_special) const;
  std::string TokenPiece(int32_t token) const;

  // Embeds every item (embedding requests are short: served whole, between generation steps).
  void ServeEmbeddings(std::vector<WorkItem>& items, WorkSource& source);

  // ServeStream's parts. An embedding model serves embeddings alone, in packed groups.
  struct Stream;
  void ServeEmbeddingModel(WorkSource& source);
  // Answers a slot's record with what it generated and frees the slot.
  void Finish(Stream& stream, Slot& slot, const std::string& finish_reason);
  // Frees a slot whose record was cancelled or stopped, telling the source it was dropped.
  void Drop(WorkSource& source, Slot& slot);
  // The next record or choice to admit; nullopt when none is ready or a record with n > 1 was
  // just expanded into its choices (ask again).
  std::optional<WorkItem> NextItem(Stream& stream);
  // Admits an item into the free slot whose cells hold the most of its prompt. False if the item
  // was answered with an error instead.
  bool Admit(Stream& stream, WorkItem item);
  // Admits ready records into the free slots; serves the embedding records among them whole.
  void FillSlots(Stream& stream);
  // Puts the next decode step's tokens into `batch` (empty when nothing is in flight).
  void FillBatch(llama_batch& batch);
  // After a decode step: samples the slot's next token and finishes its record when it is done.
  void TakeToken(Stream& stream, Slot& slot);

  // Ends a slot's record (its cells stay for the next one when prefixes are shared).
  void Release(Slot& slot);
  // Moves the records of the highest busy slots into free slots below them (copying their KV
  // streams), so that the busy sequences are consecutive.
  void CompactSlots();
  // Drops the slot's cells from position `keep` on (all of them when keep is 0).
  void ForgetFrom(Slot& slot, size_t keep);
  // For an admitted slot whose prompt is not fed yet: takes the longest prefix of its prompt that
  // another slot has computed (copying that slot's stream) when it is worth a copy, or waits for
  // a slot that is computing a longer one.
  void SharePrefix(size_t index);

  std::string model_path_;
  std::string model_name_;  // reported as "model" in response bodies
  std::string fingerprint_;  // reported as "system_fingerprint" (fingerprint.h)
  runner_protocol::LoadOptions options_;
  llama_model* model_ = nullptr;
  llama_context* gen_ctx_ = nullptr;   // text generation (absent for embedding models)
  llama_context* embd_ctx_ = nullptr;  // embeddings, created on first use for text models
  bool embedding_model_ = false;
  std::string chat_template_;
  int n_ctx_per_seq_ = 0;
  bool share_prefixes_ = false;
  Json gang_info_;  // where the layers went when a gang shares the model (null otherwise)
  // What llama.cpp said it did while loading: offloaded_layers, layers, model_buffers (bytes by
  // buffer name: "Vulkan0", "CPU_Mapped", ...); null when it said nothing.
  Json load_facts_;
  std::vector<Slot> slots_;  // generation slots; slot i decodes sequence i
  std::unique_ptr<GrammarCache> grammars_;  // compiled structured-output grammars, by schema
  std::unique_ptr<ChatTemplates> chat_templates_;  // the model's own template (null: it has none)
};

// Sets llama.cpp's log callback: warnings and errors go to stderr through our logging, and the
// last error is kept for load-failure messages. Call once per process.
void InstallLlamaLogging();

}  // namespace minions::llama_runner
