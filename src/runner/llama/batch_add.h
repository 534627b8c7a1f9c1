#pragma once
// A helper the engine's files share (llama_engine.cc, embeddings.cc).

#include "llama.h"

namespace minions::llama_runner {

// Adds one token to a batch (the batch was allocated for enough tokens).
inline void BatchAdd(llama_batch& batch, llama_token token, llama_pos pos, llama_seq_id seq, bool logits) {
  int i = batch.n_tokens++;
  batch.token[i] = token;
  batch.pos[i] = pos;
  batch.n_seq_id[i] = 1;
  batch.seq_id[i][0] = seq;
  batch.logits[i] = logits;
}

}  // namespace minions::llama_runner
