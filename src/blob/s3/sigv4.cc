#include "blob/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace minions::sigv4 {

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(std::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), digest, &length);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

std::string AmzDate(absl::Time t) { return absl::FormatTime("%Y%m%dT%H%M%SZ", t, absl::UTCTimeZone()); }
std::string DateStamp(absl::Time t) { return absl::FormatTime("%Y%m%d", t, absl::UTCTimeZone()); }

std::string CanonicalQuery(const Pairs& query) {
  // Sorted by encoded name, then by encoded value (not as "name=value" strings: "a-b=1" sorts
  // before "a=1", while the name "a" sorts before "a-b"; found by the cross-check against the AWS
  // SDK's signer, tests/blob/sigv4_test.cc).
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) encoded.emplace_back(UriEncode(name, false), UriEncode(value, false));
  std::sort(encoded.begin(), encoded.end());
  std::vector<std::string> parts;
  parts.reserve(encoded.size());
  for (const auto& [name, value] : encoded) parts.push_back(absl::StrCat(name, "=", value));
  return absl::StrJoin(parts, "&");
}

namespace {

// Lower-cased names with trimmed, space-collapsed values, sorted by name.
Pairs NormalisedHeaders(const Pairs& headers) {
  Pairs out;
  out.reserve(headers.size());
  for (const auto& [name, value] : headers) {
    std::string v;
    bool space = false;
    for (char c : absl::StripAsciiWhitespace(value)) {
      if (c == ' ' || c == '\t') {
        space = true;
        continue;
      }
      if (space) v.push_back(' ');
      space = false;
      v.push_back(c);
    }
    out.emplace_back(absl::AsciiStrToLower(name), std::move(v));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace

std::string SignedHeaders(const Pairs& headers) {
  std::vector<std::string> names;
  for (const auto& [name, value] : NormalisedHeaders(headers)) names.push_back(name);
  return absl::StrJoin(names, ";");
}

std::string CanonicalHeaders(const Pairs& headers) {
  std::string out;
  for (const auto& [name, value] : NormalisedHeaders(headers)) absl::StrAppend(&out, name, ":", value, "\n");
  return out;
}

std::string CanonicalRequest(const Request& request) {
  return absl::StrCat(request.method, "\n", UriEncode(request.path, true), "\n", CanonicalQuery(request.query), "\n",
                      CanonicalHeaders(request.headers), "\n", SignedHeaders(request.headers), "\n",
                      request.payload_hash);
}

std::string CredentialScope(absl::Time t, std::string_view region, std::string_view service) {
  return absl::StrCat(DateStamp(t), "/", std::string(region), "/", std::string(service), "/aws4_request");
}

std::string StringToSign(absl::Time t, std::string_view scope, std::string_view canonical_request) {
  return absl::StrCat(std::string(kAlgorithm), "\n", AmzDate(t), "\n", std::string(scope), "\n",
                      Sha256Hex(canonical_request));
}

std::string SigningKey(std::string_view secret_key, std::string_view date_stamp, std::string_view region,
                       std::string_view service) {
  std::string key = HmacSha256(absl::StrCat("AWS4", std::string(secret_key)), date_stamp);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  return HmacSha256(key, "aws4_request");
}

std::string Signature(std::string_view signing_key, std::string_view string_to_sign) {
  return Hex(HmacSha256(signing_key, string_to_sign));
}

std::string AuthorizationHeader(const Request& request, const Credentials& credentials, std::string_view region,
                                absl::Time t, std::string_view service) {
  std::string scope = CredentialScope(t, region, service);
  std::string to_sign = StringToSign(t, scope, CanonicalRequest(request));
  std::string signature = Signature(SigningKey(credentials.secret_key, DateStamp(t), region, service), to_sign);
  return absl::StrCat(std::string(kAlgorithm), " Credential=", credentials.access_key, "/", scope,
                      ", SignedHeaders=", SignedHeaders(request.headers), ", Signature=", signature);
}

Presigned Presign(std::string_view method, std::string_view host, std::string_view path, const Pairs& query,
                  const Credentials& credentials, std::string_view region, absl::Time t, int64_t expires_seconds,
                  std::string_view service) {
  std::string scope = CredentialScope(t, region, service);
  Request request;
  request.method = std::string(method);
  request.path = std::string(path);
  request.query = query;
  request.query.emplace_back("X-Amz-Algorithm", std::string(kAlgorithm));
  request.query.emplace_back("X-Amz-Credential", absl::StrCat(credentials.access_key, "/", scope));
  request.query.emplace_back("X-Amz-Date", AmzDate(t));
  request.query.emplace_back("X-Amz-Expires", absl::StrCat(expires_seconds));
  if (!credentials.session_token.empty()) request.query.emplace_back("X-Amz-Security-Token", credentials.session_token);
  request.query.emplace_back("X-Amz-SignedHeaders", "host");
  request.headers = {{"host", std::string(host)}};
  request.payload_hash = std::string(kUnsignedPayload);
  Presigned out;
  out.canonical_request = CanonicalRequest(request);
  out.string_to_sign = StringToSign(t, scope, out.canonical_request);
  out.signature = Signature(SigningKey(credentials.secret_key, DateStamp(t), region, service), out.string_to_sign);
  out.query = absl::StrCat(CanonicalQuery(request.query), "&X-Amz-Signature=", out.signature);
  return out;
}

PresignedUpload PresignUpload(std::string_view host, std::string_view path, const Credentials& credentials,
                              std::string_view region, absl::Time t, int64_t expires_seconds, int64_t size,
                              std::string_view sha256_hex, std::string_view service) {
  const std::string scope = CredentialScope(t, region, service);
  Request request;
  request.method = "PUT";
  request.path = std::string(path);
  request.headers = {{"host", std::string(host)},
                     {"content-length", absl::StrCat(size)},
                     {"x-amz-content-sha256", std::string(sha256_hex)}};
  request.query = {{"X-Amz-Algorithm", std::string(kAlgorithm)},
                   {"X-Amz-Credential", absl::StrCat(credentials.access_key, "/", scope)},
                   {"X-Amz-Date", AmzDate(t)},
                   {"X-Amz-Expires", absl::StrCat(expires_seconds)},
                   {"X-Amz-SignedHeaders", SignedHeaders(request.headers)}};
  if (!credentials.session_token.empty()) request.query.emplace_back("X-Amz-Security-Token", credentials.session_token);
  request.payload_hash = std::string(sha256_hex);
  PresignedUpload out;
  out.presigned.canonical_request = CanonicalRequest(request);
  out.presigned.string_to_sign = StringToSign(t, scope, out.presigned.canonical_request);
  out.presigned.signature =
      Signature(SigningKey(credentials.secret_key, DateStamp(t), region, service), out.presigned.string_to_sign);
  out.presigned.query = absl::StrCat(CanonicalQuery(request.query), "&X-Amz-Signature=", out.presigned.signature);
  out.headers = {{"Content-Length", absl::StrCat(size)}, {"x-amz-content-sha256", std::string(sha256_hex)}};
  return out;
}

}  // namespace minions::sigv4
