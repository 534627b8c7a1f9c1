#include "runner/llama/grammar_mask.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace minions::llama_runner {
namespace {

// The token's text as llama.cpp's grammar sees it (its piece cache: special tokens spelled out,
// no space stripped).
std::string Piece(const llama_vocab* vocab, int32_t token) {
  std::string piece(64, '\0');
  int32_t n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
  if (n < 0) {
    piece.resize(static_cast<size_t>(-n));
    n = llama_token_to_piece(vocab, token, piece.data(), static_cast<int32_t>(piece.size()), 0, true);
  }
  piece.resize(static_cast<size_t>(std::max(n, 0)));
  return piece;
}

// Whether `piece` is whole UTF-8 characters as llama.cpp's grammar decodes them, none of which
// decodes to 0 (an overlong zero such as C0 80, which llama.cpp would read as the text's end).
bool WholeCharacters(const std::string& piece) {
  static const int kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
  size_t i = 0;
  while (i < piece.size()) {
    const unsigned char lead = static_cast<unsigned char>(piece[i]);
    const int length = kLength[lead >> 4];
    if (length == 0 || lead == 0 || i + static_cast<size_t>(length) > piece.size()) return false;
    uint32_t value = lead & ((1u << (8 - length)) - 1);  // as llama.cpp masks it
    for (int k = 1; k < length; ++k) {
      const unsigned char c = static_cast<unsigned char>(piece[i + static_cast<size_t>(k)]);
      if ((c >> 6) != 2) return false;
      value = (value << 6) + (c & 0x3F);
    }
    if (value == 0) return false;
    i += static_cast<size_t>(length);
  }
  return true;
}

}  // namespace

bool GrammarMask::JudgesTextOnly(const std::string& gbnf) {
  // Skips what cannot hold a reference: "..." literals and [...] classes (with their backslash
  // escapes) and # comments; anything else starting with < or ! is one.
  auto skip_to = [&](size_t i, char close) {
    for (++i; i < gbnf.size() && gbnf[i] != close; ++i) {
      if (gbnf[i] == '\\') ++i;
    }
    return i;
  };
  for (size_t i = 0; i < gbnf.size(); ++i) {
    const char c = gbnf[i];
    if (c == '"') {
      i = skip_to(i, '"');
    } else if (c == '[') {
      i = skip_to(i, ']');
    } else if (c == '#') {
      while (i < gbnf.size() && gbnf[i] != '\n' && gbnf[i] != '\r') ++i;
    } else if (c == '<' || c == '!') {
      return false;
    }
  }
  return true;
}

int GrammarMask::Utf8Remain(int remain, const std::string& piece) {
  // llama.cpp's decode_utf8: a lead byte's high nibble gives the length, 0x8-0xB cannot lead.
  static const int kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
  for (unsigned char c : piece) {
    if (remain < 0 || c == 0) return -1;
    if (remain > 0) {
      if ((c >> 6) != 2) return -1;
      --remain;
    } else {
      remain = kLength[c >> 4] - 1;
    }
  }
  return remain;
}

GrammarMask::GrammarMask(const llama_vocab* vocab) {
  const int32_t n = llama_vocab_n_tokens(vocab);
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<int32_t> members;  // the forest: every token the grammar judges by its text
  whole_.assign(static_cast<size_t>(n), 0);
  members.reserve(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    if (llama_vocab_is_eog(vocab, t)) {
      // Judged by whether the grammar may end, not by its text: never a parent.
      roots_.push_back(t);
      continue;
    }
    pieces[t] = Piece(vocab, t);
    // An empty text, or one starting with NUL, is refused whatever the grammar (as llama.cpp does).
    if (pieces[t].empty() || pieces[t][0] == '\0') continue;
    members.push_back(t);
    whole_[t] = WholeCharacters(pieces[t]);
  }
  // In byte order every token comes right before the tokens that start with its text; a stack of
  // the open prefixes gives each token its longest proper prefix (a duplicate text's parent is its
  // twin, which the grammar judges alike).
  std::sort(members.begin(), members.end(),
            [&](int32_t a, int32_t b) { return pieces[a] < pieces[b] || (pieces[a] == pieces[b] && a < b); });
  std::vector<int32_t> parent(static_cast<size_t>(n), -1), open;
  for (int32_t t : members) {
    while (!open.empty() && pieces[t].compare(0, pieces[open.back()].size(), pieces[open.back()]) != 0) open.pop_back();
    parent[t] = open.empty() ? -1 : open.back();
    open.push_back(t);
  }
  first_child_.assign(static_cast<size_t>(n) + 1, 0);
  for (int32_t t : members) {
    if (parent[t] >= 0) ++first_child_[parent[t] + 1];
  }
  for (int32_t t = 0; t < n; ++t) first_child_[t + 1] += first_child_[t];
  children_.resize(first_child_[n]);
  std::vector<uint32_t> fill(first_child_.begin(), first_child_.end() - 1);
  std::vector<int32_t> roots;
  for (int32_t t : members) {
    if (parent[t] >= 0) {
      children_[fill[parent[t]]++] = t;
    } else {
      roots.push_back(t);
    }
  }
  roots_.insert(roots_.begin(), roots.begin(), roots.end());
}

void GrammarMask::Apply(llama_sampler* grammar, std::vector<llama_token_data>& cur) {
  allowed_.assign(cur.size(), 0);
  frontier_ = roots_;
  while (!frontier_.empty()) {
    // One grammar pass per level of the forest: it judges each token on its own.
    batch_.clear();
    for (int32_t t : frontier_) batch_.push_back(llama_token_data{t, 0.0f, 0.0f});
    llama_token_data_array level{batch_.data(), batch_.size(), -1, false};
    llama_sampler_apply(grammar, &level);
    checked_ += batch_.size();
    next_.clear();
    for (const llama_token_data& c : batch_) {
      if (c.logit == -INFINITY) {
        if (whole_[c.id]) continue;  // and so is every token that starts with its text
      } else {
        allowed_[static_cast<size_t>(c.id)] = 1;
      }
      next_.insert(next_.end(), children_.begin() + first_child_[c.id], children_.begin() + first_child_[c.id + 1]);
    }
    frontier_.swap(next_);
  }
  for (size_t i = 0; i < cur.size(); ++i) {
    if (!allowed_[i]) cur[i].logit = -INFINITY;
  }
}

}  // namespace minions::llama_runner
