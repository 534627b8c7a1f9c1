// Every hint is true: each `minions VERB ... --flag` that a message of the program suggests names a
// verb the CLI has and flags that verb takes. The hints are collected from the string literals of
// src/ and apps/ (adjacent literals joined, as the compiler joins them); the CLI's verbs and flags
// are read from the built program's own --help screens, so a renamed flag or verb fails here.

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "testing/run_program.h"

namespace minions::testing {
namespace {

namespace fs = std::filesystem;

const std::string kMinions = std::string(MINIONS_TEST_BIN_DIR) + "/minions";
const std::string kSource = MINIONS_SOURCE_DIR;

// One verb of the CLI: its flags and its sub-verbs, read from `minions PATH --help`.
struct Verb {
  std::set<std::string> flags;
  std::map<std::string, Verb> verbs;
};

std::string HelpOf(const std::vector<std::string>& path) {
  Subprocess::Options options;
  options.argv = {kMinions};
  options.argv.insert(options.argv.end(), path.begin(), path.end());
  options.argv.push_back("--help");
  return RunProgram(options, absl::Minutes(1)).out;
}

// Reads a CLI11 help screen: every --flag it shows, and the names its SUBCOMMANDS section lists.
Verb ReadVerb(const std::vector<std::string>& path, int depth = 0) {
  Verb verb;
  const std::string help = HelpOf(path);
  static const std::regex flag(R"((^|[\s,])(--[a-z0-9][a-z0-9-]*))");
  bool in_verbs = false;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    std::string text(line);
    std::string lower = absl::AsciiStrToLower(text);
    if (!text.empty() && text[0] != ' ') in_verbs = absl::StartsWith(lower, "subcommands");
    for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) verb.flags.insert((*it)[2]);
    if (in_verbs && absl::StartsWith(text, "  ")) {
      std::string name(absl::StripLeadingAsciiWhitespace(text));
      name = name.substr(0, name.find(' '));
      if (!name.empty() && depth < 3) {
        std::vector<std::string> sub = path;
        sub.push_back(name);
        verb.verbs[name] = ReadVerb(sub, depth + 1);
      }
    }
  }
  return verb;
}

// The top level: a bare `minions` guide lists the verbs ("  NAME  description" under group titles).
Verb ReadCli() {
  Verb cli;
  const std::string guide = HelpOf({});
  for (absl::string_view line : absl::StrSplit(guide, '\n')) {
    if (!absl::StartsWith(line, "  ") || absl::StartsWith(line, "   ")) continue;
    std::string name(absl::StripLeadingAsciiWhitespace(line));
    name = name.substr(0, name.find(' '));
    if (!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz-") == std::string::npos) {
      cli.verbs[name] = ReadVerb({name});
    }
  }
  return cli;
}

// The text of every string literal of a C++ file, adjacent literals joined (escapes kept as
// written: a hint never needs them).
std::vector<std::string> Literals(const std::string& code) {
  std::vector<std::string> out;
  std::string current;
  bool joining = false;
  for (size_t i = 0; i < code.size(); ++i) {
    char c = code[i];
    if (c == '/' && i + 1 < code.size() && code[i + 1] == '/') {  // a comment: to the line's end
      i = code.find('\n', i);
      if (i == std::string::npos) break;
      continue;
    }
    if (c == '\'') {  // a character literal
      i += code[i + 1] == '\\' ? 3 : 2;
      continue;
    }
    if (c == '"') {
      size_t j = i + 1;
      std::string text;
      while (j < code.size() && code[j] != '"') {
        if (code[j] == '\\' && j + 1 < code.size()) text += code[j++];
        text += code[j++];
      }
      if (!joining) current.clear();
      current += text;
      joining = true;
      i = j;
      continue;
    }
    if (joining && !absl::ascii_isspace(static_cast<unsigned char>(c))) {
      out.push_back(current);
      joining = false;
    }
  }
  if (joining) out.push_back(current);
  return out;
}

struct Hint {
  std::string file;
  std::string text;  // "minions VERB ... --flag ..."
};

// Every "minions WORD..." in the literals of src/ and apps/: the words up to the end of the hint
// (a ';', ')', ',', '`', a quote or the end of the literal).
std::vector<Hint> CollectHints() {
  std::vector<Hint> hints;
  static const std::regex hint(R"((^|[^A-Za-z0-9_/.-])minions ([a-z][^;),`'"\\]*))");
  for (const char* root : {"src", "apps"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kSource + "/" + root)) {
      const std::string path = entry.path().string();
      if (!entry.is_regular_file() || !(path.ends_with(".cc") || path.ends_with(".h"))) continue;
      std::ifstream in(path);
      std::stringstream code;
      code << in.rdbuf();
      for (const std::string& literal : Literals(code.str())) {
        for (std::sregex_iterator it(literal.begin(), literal.end(), hint), end; it != end; ++it) {
          hints.push_back({fs::relative(path, kSource).string(), absl::StrCat("minions ", (*it)[2].str())});
        }
      }
    }
  }
  return hints;
}

// Why `hint` is false against `cli`, or "" when it is true: its first word must be a verb; the
// words after walk down sub-verbs while they name one (a word that does not ends the verb path:
// an argument, or prose); every --flag after must be one the verb reached (or a verb above it,
// whose flags its sub-verbs share) takes.
std::string Check(const Verb& cli, const std::string& hint) {
  std::vector<std::string> words = absl::StrSplit(hint.substr(std::string("minions ").size()), ' ', absl::SkipEmpty());
  // A word's trailing punctuation is the sentence's ("minions up: 127.0.0.1:7070").
  for (std::string& word : words) {
    while (!word.empty() && (word.back() == ':' || word.back() == '.')) word.pop_back();
  }
  std::erase_if(words, [](const std::string& word) { return word.empty(); });
  if (words.empty()) return "";
  auto top = cli.verbs.find(words[0]);
  if (top == cli.verbs.end()) return absl::StrCat("no verb '", words[0], "'");
  std::vector<const Verb*> reached = {&top->second};
  size_t i = 1;
  for (; i < words.size(); ++i) {
    auto sub = reached.back()->verbs.find(words[i]);
    if (sub == reached.back()->verbs.end()) break;
    reached.push_back(&sub->second);
  }
  for (; i < words.size(); ++i) {
    std::string word = words[i];
    if (!word.starts_with("--")) continue;
    word = word.substr(0, word.find('='));
    while (!word.empty() && !absl::ascii_isalnum(static_cast<unsigned char>(word.back()))) word.pop_back();
    bool known = false;
    for (const Verb* v : reached) known |= v->flags.count(word) > 0;
    if (!known) return absl::StrCat("no flag ", word, " for this verb");
  }
  return "";
}

TEST(Hints, EveryCommandAMessageSuggestsExistsWithItsFlags) {
  const Verb cli = ReadCli();
  ASSERT_GT(cli.verbs.size(), 10u) << "the bare `minions` guide lists no verbs";
  ASSERT_TRUE(cli.verbs.count("submit") && cli.verbs.at("submit").flags.count("--model")) << "cannot read --help";
  const std::vector<Hint> hints = CollectHints();
  ASSERT_GT(hints.size(), 20u) << "no hints found under " << kSource;
  std::vector<std::string> false_hints;
  for (const Hint& h : hints) {
    if (std::string why = Check(cli, h.text); !why.empty()) {
      false_hints.push_back(absl::StrCat(h.file, ": \"", h.text, "\": ", why));
    }
  }
  EXPECT_TRUE(false_hints.empty()) << false_hints.size() << " hints name what the CLI does not have:\n  "
                                   << absl::StrJoin(false_hints, "\n  ");
}

// The checker itself: it catches a flag that does not exist (the `--join TOKEN` hint this test was
// written for) and a verb that does not.
TEST(Hints, TheCheckerCatchesAMissingFlagAndAMissingVerb) {
  const Verb cli = ReadCli();
  EXPECT_EQ(Check(cli, "minions executor --join-token-file join.txt"), "");
  EXPECT_EQ(Check(cli, "minions executor --join TOKEN"), "no flag --join for this verb");
  EXPECT_EQ(Check(cli, "minions models push FILE --name NAME"), "");
  EXPECT_EQ(Check(cli, "minions frobnicate it"), "no verb 'frobnicate'");
  EXPECT_EQ(Check(cli, "minions admin join-token -o join.txt"), "");
}

}  // namespace
}  // namespace minions::testing
