#pragma once
// Which tokens of the vocabulary a grammar allows next, found without handing llama.cpp's grammar
// every token of the vocabulary (151,936 for Qwen 2.5: the cost of constrained decoding whenever
// the model's own pick does not fit, see docs/benchmarks.md, "Structured outputs").
//
// The tokens form a forest: a token's parent is the longest other token its text starts with.
// llama.cpp matches a token's text character by character and refuses it at the first character
// no rule admits; so when the grammar refuses a token whose text is whole UTF-8 characters, it
// refuses every token that starts with that text, at the same character. The mask is exact: every
// token is judged by the grammar itself, level by level, except the descendants of a refused
// token of whole characters, which are refused unchecked. At a point where JSON wants `"` or a
// space, a few thousand tokens are checked instead of the whole vocabulary.
//
// Two conditions, which the caller keeps (RecordSampler):
// - the grammar judges by text only: no token references (`<[id]>`), which llama.cpp matches by
//   id (JudgesTextOnly). Grammars compiled from JSON schemas have none; a user's GBNF or a tool
//   grammar may. And it is not lazy (waiting for a trigger, then replaying part of a token).
// - the text accepted so far ends on a whole character (Utf8Remain() == 0): otherwise a token's
//   first bytes finish the character before it, and where its own characters start differs.
//
// Ownership: a GrammarMask owns its forest (built once per vocabulary) and scratch buffers.
// Threads: the engine's one serving thread only (Apply reuses the buffers).

#include <cstdint>
#include <string>
#include <vector>

#include "llama.h"

namespace minions::llama_runner {

class GrammarMask {
 public:
  explicit GrammarMask(const llama_vocab* vocab);
  GrammarMask(const GrammarMask&) = delete;
  GrammarMask& operator=(const GrammarMask&) = delete;

  // Sets to -inf the logit of every token of `cur` that `grammar` (a llama.cpp grammar sampler)
  // refuses in its present state, as llama_sampler_apply(grammar, whole vocabulary) would.
  // `cur` holds the whole vocabulary, cur[i].id == i.
  void Apply(llama_sampler* grammar, std::vector<llama_token_data>& cur);

  size_t checked() const { return checked_; }  // tokens handed to the grammar so far (tests)

  // Whether GBNF text matches by text only: no token reference (`<[id]>`, `<|name|>`, `!<...>`)
  // outside its string literals, character classes and comments. Conservative: only then may a
  // grammar compiled from it be masked here.
  static bool JudgesTextOnly(const std::string& gbnf);

  // How many bytes of an unfinished UTF-8 character are still to come after `piece` follows text
  // that had `remain` to come, decoding as llama.cpp's grammar does; -1 once the text is not
  // valid (or holds a NUL, where llama.cpp stops reading a token), and then forever.
  static int Utf8Remain(int remain, const std::string& piece);

 private:
  std::vector<int32_t> roots_;        // tokens without a parent, then every end-of-generation token
  std::vector<uint32_t> first_child_; // children of token t: children_[first_child_[t], first_child_[t + 1])
  std::vector<int32_t> children_;
  std::vector<uint8_t> whole_;        // per token: its text is whole characters (its refusal prunes)
  // Scratch, reused by every Apply.
  std::vector<int32_t> frontier_, next_;
  std::vector<llama_token_data> batch_;
  std::vector<uint8_t> allowed_;
  size_t checked_ = 0;
};

}  // namespace minions::llama_runner
