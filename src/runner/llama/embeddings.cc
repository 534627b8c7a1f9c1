// LlamaEngine's embeddings: inputs packed several to a decode, pooled by the model (mean pooling for
// a text model) and L2-normalised. Split from llama_engine.cc, which serves generation.

#include <cmath>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"
#include "llama.h"
#include "runner/llama/batch_add.h"
#include "runner/llama/llama_engine.h"

namespace minions::llama_runner {
namespace {

void L2Normalize(std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  double norm = std::sqrt(sum);
  if (norm <= 0) return;
  for (float& x : v) x = static_cast<float>(x / norm);
}

}  // namespace

void LlamaEngine::ServeEmbeddings(std::vector<WorkItem>& items, WorkSource& source) {
  if (items.empty()) return;
  auto on_result = [&](WorkResult result) { source.OnResult(std::move(result)); };
  if (auto s = EnsureEmbeddingContext(); !s.ok()) {
    for (auto& item : items) {
      on_result({item.batch, item.index, MakeErrorLine(item.request.custom_id, kErrorRunnerFailed, std::string(s.message())), true, {}});
    }
    return;
  }
  const int n_batch = static_cast<int>(llama_n_batch(embd_ctx_));
  const int n_seq_max = static_cast<int>(llama_n_seq_max(embd_ctx_));
  const int n_embd = llama_model_n_embd_out(model_);
  const bool use_encode = llama_model_has_encoder(model_) && !llama_model_has_decoder(model_);

  // One input of one request.
  struct Piece {
    size_t item;
    size_t input;
    std::vector<llama_token> tokens;
  };
  struct Pending {
    std::vector<std::vector<float>> vectors;
    size_t remaining = 0;
    int prompt_tokens = 0;
    bool failed = false;
  };
  std::vector<Pending> pending(items.size());
  std::deque<Piece> queue;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& request = items[i].request;
    pending[i].vectors.resize(request.inputs.size());
    pending[i].remaining = request.inputs.size();
    for (size_t k = 0; k < request.inputs.size() && !pending[i].failed; ++k) {
      auto tokens = Tokenize(request.inputs[k], false);
      if (static_cast<int>(tokens.size()) > n_batch) {
        pending[i].failed = true;
        on_result({items[i].batch, items[i].index,
                   MakeErrorLine(request.custom_id, kErrorPromptTooLong,
                                 absl::StrCat("body.input[", k, "] is ", tokens.size(),
                                              " tokens; this model embeds at most ", n_batch,
                                              " tokens per input")),
                   true, {}});
      } else if (tokens.empty()) {
        pending[i].failed = true;
        on_result({items[i].batch, items[i].index,
                   MakeErrorLine(request.custom_id, kErrorEmptyPrompt,
                                 absl::StrCat("body.input[", k, "] has no tokens")),
                   true, {}});
      } else {
        pending[i].prompt_tokens += static_cast<int>(tokens.size());
        queue.push_back({i, k, std::move(tokens)});
      }
    }
  }

  llama_batch batch = llama_batch_init(n_batch, 0, 1);
  std::vector<Piece> group;
  while (!queue.empty()) {
    group.clear();
    batch.n_tokens = 0;
    int used = 0;
    while (!queue.empty() && static_cast<int>(group.size()) < n_seq_max &&
           used + static_cast<int>(queue.front().tokens.size()) <= n_batch) {
      Piece piece = std::move(queue.front());
      queue.pop_front();
      if (pending[piece.item].failed) continue;
      llama_seq_id seq = static_cast<llama_seq_id>(group.size());
      for (size_t t = 0; t < piece.tokens.size(); ++t) {
        BatchAdd(batch, piece.tokens[t], static_cast<llama_pos>(t), seq, true);
      }
      used += static_cast<int>(piece.tokens.size());
      group.push_back(std::move(piece));
    }
    if (group.empty()) continue;
    if (llama_memory_t mem = llama_get_memory(embd_ctx_)) llama_memory_clear(mem, true);
    int rc = use_encode ? llama_encode(embd_ctx_, batch) : llama_decode(embd_ctx_, batch);
    for (size_t g = 0; g < group.size(); ++g) {
      Piece& piece = group[g];
      Pending& p = pending[piece.item];
      if (p.failed) continue;
      const float* embd = rc == 0 ? llama_get_embeddings_seq(embd_ctx_, static_cast<llama_seq_id>(g)) : nullptr;
      if (embd == nullptr) {
        p.failed = true;
        on_result({items[piece.item].batch, items[piece.item].index,
                   MakeErrorLine(items[piece.item].request.custom_id, kErrorRunnerFailed,
                                 absl::StrCat("llama.cpp failed to embed the input (code ", rc, ")")),
                   true, {}});
        continue;
      }
      std::vector<float> v(embd, embd + n_embd);
      L2Normalize(v);
      p.vectors[piece.input] = std::move(v);
      if (--p.remaining == 0) {
        Usage usage{p.prompt_tokens, 0};
        on_result({items[piece.item].batch, items[piece.item].index,
                   MakeResponseLine(items[piece.item].request.custom_id,
                                    MakeEmbeddingBody(model_name_, p.vectors, p.prompt_tokens)),
                   false, usage});
      }
    }
  }
  llama_batch_free(batch);
}

}  // namespace minions::llama_runner
