// GrammarMask (grammar_mask.h): along random walks through grammars, on a SentencePiece and a
// byte-level BPE vocabulary (Qwen 2.5's, the benchmark's), the mask equals llama.cpp's own
// judgement of every token of the vocabulary, wherever the answer so far ends on a whole
// character (where RecordSampler uses it); and it judges far fewer tokens than the vocabulary.

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "llama.h"
#include "runner/llama/grammar_mask.h"
#include "runner/llama/record_sampler.h"

namespace minions::llama_runner {
namespace {

std::string Piece(const llama_vocab* vocab, int32_t token) {
  char buf[512];
  int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, true);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

std::vector<llama_token_data> Vocabulary(int n) {
  std::vector<llama_token_data> cur(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) cur[i] = llama_token_data{i, 0.0f, 0.0f};
  return cur;
}

// The grammars walked: JSON schemas through llama.cpp's converter (as RecordSampler masks them)
// and hand-written text-only GBNF with non-ASCII characters, negated classes among them (where a
// token's unfinished last character would mislead a pruning by prefix).
std::vector<std::string> Grammars() {
  std::vector<std::string> out;
  for (const char* schema : {
           R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},"city":{"enum":["Paris","Oslo","Zürich"]},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},"required":["name","age","city","tags"],"additionalProperties":false})",
           R"({"type":"array","items":{"type":"string","maxLength":5},"minItems":1,"maxItems":4})",
           R"({"type":"object"})"}) {
    auto gbnf = SchemaToGrammar(schema);
    EXPECT_TRUE(gbnf.ok()) << gbnf.status();
    if (gbnf.ok()) out.push_back(*gbnf);
  }
  out.push_back("root ::= \"«\" [^»\"]{0,8} \"»\" ( [α-ω]{1,4} | \"日本語\" ) \" \" [^é\\n]{0,6} \".\"\n");
  out.push_back("root ::= ( \"ü\" | [^ü-ÿ] ){1,10} \"!\"\n");
  return out;
}

// One random walk: returns how many tokens the mask judged at its first step.
size_t Walk(const llama_vocab* vocab, GrammarMask& mask, const std::string& gbnf, std::mt19937& rng, int steps) {
  const int n = llama_vocab_n_tokens(vocab);
  llama_sampler* grammar = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
  EXPECT_NE(grammar, nullptr) << gbnf;
  if (grammar == nullptr) return 0;
  int remain = 0;
  size_t first_checked = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<llama_token_data> full = Vocabulary(n);
    llama_token_data_array all{full.data(), full.size(), -1, false};
    llama_sampler_apply(grammar, &all);
    if (remain == 0) {
      std::vector<llama_token_data> masked = Vocabulary(n);
      const size_t before = mask.checked();
      mask.Apply(grammar, masked);
      if (step == 0) first_checked = mask.checked() - before;
      for (int t = 0; t < n; ++t) {
        if ((full[t].logit == -INFINITY) != (masked[t].logit == -INFINITY)) {
          ADD_FAILURE() << "step " << step << ": token " << t << " '" << Piece(vocab, t) << "' is "
                        << (full[t].logit == -INFINITY ? "refused" : "allowed") << " by llama.cpp but not by the mask";
          llama_sampler_free(grammar);
          return first_checked;
        }
      }
    }
    // The next token: any allowed one, and often an allowed lone byte of a multi-byte character
    // (so the walk passes through unfinished characters).
    std::vector<int32_t> allowed, bytes;
    for (int t = 0; t < n; ++t) {
      if (full[t].logit == -INFINITY || llama_vocab_is_eog(vocab, t)) continue;
      allowed.push_back(t);
      const std::string piece = Piece(vocab, t);
      if (piece.size() == 1 && static_cast<unsigned char>(piece[0]) >= 0x80) bytes.push_back(t);
    }
    if (allowed.empty()) break;
    const std::vector<int32_t>& from = !bytes.empty() && rng() % 3 == 0 ? bytes : allowed;
    const int32_t token = from[rng() % from.size()];
    llama_sampler_accept(grammar, token);
    remain = GrammarMask::Utf8Remain(remain, Piece(vocab, token));
  }
  llama_sampler_free(grammar);
  return first_checked;
}

void ExpectExact(const std::string& vocab_file, int walks, int steps) {
  engine_test::VocabModel m(vocab_file, "", "grammar-mask");
  ASSERT_NE(m.model, nullptr);
  GrammarMask mask(m.vocab());
  std::mt19937 rng(7);
  const std::vector<std::string> grammars = Grammars();
  ASSERT_EQ(grammars.size(), 5u);
  for (size_t g = 0; g < grammars.size(); ++g) {
    SCOPED_TRACE(::testing::Message() << vocab_file << ", grammar " << g);
    for (int w = 0; w < walks; ++w) {
      const size_t first = Walk(m.vocab(), mask, grammars[g], rng, steps);
      // At the start the first four grammars want one of a few characters: most of the vocabulary
      // is refused through its ancestors, unchecked. (The last admits nearly any character.)
      if (g < 4) EXPECT_LT(first, static_cast<size_t>(llama_vocab_n_tokens(m.vocab())) / 4);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(GrammarMask, EqualsLlamaCppOnASentencePieceVocabulary) { ExpectExact("ggml-vocab-llama-spm.gguf", 4, 40); }

TEST(GrammarMask, EqualsLlamaCppOnQwensByteLevelVocabulary) { ExpectExact("ggml-vocab-qwen2.gguf", 2, 25); }

TEST(GrammarMask, TracksUnfinishedCharacters) {
  EXPECT_EQ(GrammarMask::Utf8Remain(0, "abc"), 0);
  EXPECT_EQ(GrammarMask::Utf8Remain(0, "\xc3"), 1);           // the first byte of é
  EXPECT_EQ(GrammarMask::Utf8Remain(1, "\xa9z"), 0);          // ...and its last, then z
  EXPECT_EQ(GrammarMask::Utf8Remain(0, "\xe6\x97"), 1);       // two bytes of 日
  EXPECT_EQ(GrammarMask::Utf8Remain(0, "\xf0\x9f\x98"), 1);   // three of an emoji
  EXPECT_EQ(GrammarMask::Utf8Remain(1, "a"), -1);             // not a continuation byte
  EXPECT_EQ(GrammarMask::Utf8Remain(0, "\x80"), -1);          // a continuation byte first
  EXPECT_EQ(GrammarMask::Utf8Remain(0, std::string("a\0b", 3)), -1);  // llama.cpp stops at NUL
  EXPECT_EQ(GrammarMask::Utf8Remain(-1, "abc"), -1);          // and stays lost
}

TEST(GrammarMask, OnlyGrammarsWithoutTokenReferencesAreMasked) {
  // llama.cpp matches <[id]>, <|name|> and !<...> by token id, not text: the forest would be wrong.
  EXPECT_FALSE(GrammarMask::JudgesTextOnly("root ::= <[12]> \"a\"\n"));
  EXPECT_FALSE(GrammarMask::JudgesTextOnly("root ::= \"a\" !<|im_end|>\n"));
  EXPECT_FALSE(GrammarMask::JudgesTextOnly("root ::= \"a\" # <x>\nb ::= <|tool_call|>\n"));
  // A < or ! inside a literal, a class or a comment is text.
  EXPECT_TRUE(GrammarMask::JudgesTextOnly("root ::= \"<tool_call>\" [<!] \"!\\\"<\" # <[1]> !\n"));
  EXPECT_TRUE(GrammarMask::JudgesTextOnly("root ::= [\\]<] \"x\"\n"));
  auto schema = SchemaToGrammar(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^<[a-z]!$"}}})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_TRUE(GrammarMask::JudgesTextOnly(*schema)) << *schema;
}

}  // namespace
}  // namespace minions::llama_runner
