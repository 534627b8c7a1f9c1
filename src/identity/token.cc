#include "identity/token.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <array>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace minions::token {
namespace {

constexpr std::string_view kAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
constexpr size_t kRandomChars = 30;
constexpr size_t kChecksumChars = 6;
constexpr size_t kPrefixChars = 4;  // "mns_"
constexpr size_t kTokenChars = kPrefixChars + kRandomChars + kChecksumChars;

struct PrefixEntry {
  Role role;
  std::string_view prefix;
};
constexpr PrefixEntry kPrefixes[] = {
    {Role::kAdmin, "mna_"},    {Role::kSubmitter, "mns_"}, {Role::kViewer, "mnv_"},
    {Role::kMonitor, "mnm_"},  {Role::kExecutor, "mne_"},  {Role::kJoin, "mnj_"},
};

// Cryptographically random bytes; a machine that cannot give them cannot issue credentials.
void RandomBytes(unsigned char* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) std::abort();
}

uint32_t Crc32(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// CRC-32 as 6 base62 digits (62^6 > 2^32), most significant first.
std::string Checksum(std::string_view data) {
  uint64_t value = Crc32(data);
  std::string out(kChecksumChars, '0');
  for (size_t i = kChecksumChars; i-- > 0;) {
    out[i] = kAlphabet[value % 62];
    value /= 62;
  }
  return out;
}

}  // namespace

std::string_view Prefix(Role role) {
  for (const auto& entry : kPrefixes) {
    if (entry.role == role) return entry.prefix;
  }
  return "";
}

Minted Mint(Role role) {
  std::string text(Prefix(role));
  // Rejection sampling keeps every character uniform: bytes >= 248 (4 * 62) are drawn again.
  while (text.size() < kPrefixChars + kRandomChars) {
    std::array<unsigned char, 64> bytes;
    RandomBytes(bytes.data(), bytes.size());
    for (unsigned char b : bytes) {
      if (b < 248 && text.size() < kPrefixChars + kRandomChars) text += kAlphabet[b % 62];
    }
  }
  text += Checksum(text);
  return {text, Hash(text)};
}

std::string Hash(std::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * SHA256_DIGEST_LENGTH);
  for (unsigned char b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

absl::StatusOr<Role> Parse(std::string_view text) {
  const auto not_ours = [] {
    return absl::InvalidArgumentError(
        "this is not a Minions token (they look like mns_ followed by 36 letters and digits)");
  };
  if (text.size() != kTokenChars) return not_ours();
  std::optional<Role> role;
  for (const auto& entry : kPrefixes) {
    if (text.substr(0, kPrefixChars) == entry.prefix) role = entry.role;
  }
  if (!role) return not_ours();
  for (char c : text.substr(kPrefixChars)) {
    if (kAlphabet.find(c) == std::string_view::npos) return not_ours();
  }
  const size_t body = kPrefixChars + kRandomChars;
  if (Checksum(text.substr(0, body)) != text.substr(body)) {
    return absl::InvalidArgumentError("the token's checksum does not match: it was mistyped or cut short");
  }
  return *role;
}

std::string NewId(std::string_view prefix) {
  unsigned char bytes[6];
  RandomBytes(bytes, sizeof(bytes));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(prefix);
  for (unsigned char b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace minions::token
