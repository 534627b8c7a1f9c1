#pragma once
// Token text: what a person or a program presents. Opaque random strings with a prefix that says
// the kind, so secret scanners and people can tell them apart, and a checksum, so a mistyped or
// truncated token is refused without a database lookup:
//
//   mns_ + 30 base62 random characters (178 bits) + 6 base62 characters of CRC-32 over the rest
//
//   mna_ admin   mns_ submitter   mnv_ viewer   mnm_ monitor   mne_ executor   mnj_ join
//
// The server keeps only the SHA-256 of the text (a fast hash is right for 178 random bits: there
// is nothing to guess), so a copy of the database grants nothing. Pure functions; any thread.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/identity.h"

namespace minions::token {

struct Minted {
  std::string text;         // shown once, to whoever asked for it; never stored or logged
  std::string secret_hash;  // what the store keeps
};

// A fresh random token of `role`.
Minted Mint(Role role);

// Hex SHA-256 of a token's text.
std::string Hash(std::string_view text);

// The role a token's text claims, after checking its shape and checksum: InvalidArgument when it
// is not a Minions token at all (no prefix, wrong length, bad checksum). Says nothing about
// whether the server knows it.
absl::StatusOr<Role> Parse(std::string_view text);

// "mns_" for Role::kSubmitter.
std::string_view Prefix(Role role);

// A fresh identifier with `prefix` ("tok-", "exe-"): 12 random lower-case hex digits.
std::string NewId(std::string_view prefix);

}  // namespace minions::token
