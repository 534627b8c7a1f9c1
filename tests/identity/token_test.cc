// Token text: shape, kind, checksum, hashing.

#include "identity/token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace minions {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(Token, EachKindHasItsPrefixAndTheTextParsesBackToIt) {
  for (Role role : {Role::kAdmin, Role::kSubmitter, Role::kViewer, Role::kMonitor, Role::kExecutor, Role::kJoin}) {
    token::Minted minted = token::Mint(role);
    EXPECT_THAT(minted.text, MatchesRegex("mn[asvmej]_[0-9A-Za-z]{36}"));
    EXPECT_EQ(minted.text.substr(0, 4), token::Prefix(role));
    absl::StatusOr<Role> parsed = token::Parse(minted.text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, role);
    // Only the hash is kept, and it is the hash of the text.
    EXPECT_EQ(minted.secret_hash, token::Hash(minted.text));
    EXPECT_THAT(minted.secret_hash, MatchesRegex("[0-9a-f]{64}"));
  }
}

TEST(Token, TextsAreNeverRepeated) {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) EXPECT_TRUE(seen.insert(token::Mint(Role::kViewer).text).second);
}

TEST(Token, AMistypedOrForeignTokenIsRefusedWithoutALookup) {
  const std::string good = token::Mint(Role::kSubmitter).text;
  // One character changed anywhere after the prefix: the checksum no longer matches.
  for (size_t i = 4; i < good.size(); ++i) {
    std::string typo = good;
    typo[i] = typo[i] == 'a' ? 'b' : 'a';
    absl::StatusOr<Role> parsed = token::Parse(typo);
    EXPECT_FALSE(parsed.ok()) << i;
  }
  // Another kind's prefix on this body: the checksum covers the prefix too.
  std::string relabelled = "mna_" + good.substr(4);
  EXPECT_FALSE(token::Parse(relabelled).ok());
  // Not ours at all.
  for (std::string text : {std::string(""), std::string("hunter2"), good.substr(0, 20), good + "x",
                           std::string("ghp_") + good.substr(4), std::string(good.size(), 'a')}) {
    absl::StatusOr<Role> parsed = token::Parse(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(std::string(token::Parse(good.substr(0, 39) + (good[39] == '0' ? "1" : "0")).status().message()),
              HasSubstr("checksum"));
}

TEST(Token, IdsAreShortRandomHex) {
  EXPECT_THAT(token::NewId("tok-"), MatchesRegex("tok-[0-9a-f]{12}"));
  EXPECT_NE(token::NewId("tok-"), token::NewId("tok-"));
}

}  // namespace
}  // namespace minions
