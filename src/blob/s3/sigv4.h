#pragma once
// AWS Signature Version 4 for S3, as pure functions: no clock, no network. The time of signing is
// an argument, so AWS's published examples can be reproduced exactly (tests/blob/sigv4_test.cc).
//
// Conventions (as S3 defines them):
// - Paths and query names/values are given unencoded; UriEncode percent-encodes every byte except
//   A-Z a-z 0-9 - . _ ~ (and '/' in paths). S3 paths are encoded once, never normalised.
// - Header names are lower-cased, values trimmed with inner runs of spaces collapsed, and every
//   header passed in is signed (the caller decides which headers to pass).

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace minions::sigv4 {

using Pairs = std::vector<std::pair<std::string, std::string>>;

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // sent as x-amz-security-token when not empty
};

inline constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";
// SHA-256 of the empty string.
inline constexpr std::string_view kEmptyPayloadHash =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Hex(std::string_view bytes);
std::string Sha256Hex(std::string_view data);
// Raw (binary) HMAC-SHA256.
std::string HmacSha256(std::string_view key, std::string_view data);
std::string UriEncode(std::string_view s, bool keep_slash);

// "20130524T000000Z" and "20130524", in UTC.
std::string AmzDate(absl::Time t);
std::string DateStamp(absl::Time t);

struct Request {
  std::string method;        // "GET", "PUT", ...
  std::string path;          // unencoded, starting with '/'
  Pairs query;               // unencoded, any order
  Pairs headers;             // must include host; all are signed
  std::string payload_hash;  // hex SHA-256 of the body, or UNSIGNED-PAYLOAD
};

std::string CanonicalQuery(const Pairs& query);
// "host;range;x-amz-date": sorted lower-case names.
std::string SignedHeaders(const Pairs& headers);
std::string CanonicalHeaders(const Pairs& headers);
std::string CanonicalRequest(const Request& request);
// "20130524/us-east-1/s3/aws4_request"
std::string CredentialScope(absl::Time t, std::string_view region, std::string_view service = "s3");
std::string StringToSign(absl::Time t, std::string_view scope, std::string_view canonical_request);
// Raw signing key: HMAC chain over date, region, service, "aws4_request".
std::string SigningKey(std::string_view secret_key, std::string_view date_stamp, std::string_view region,
                       std::string_view service = "s3");
// Hex signature of a string to sign.
std::string Signature(std::string_view signing_key, std::string_view string_to_sign);

// The Authorization header value for `request` (whose headers must already include host,
// x-amz-date and x-amz-content-sha256 as the caller will send them).
std::string AuthorizationHeader(const Request& request, const Credentials& credentials, std::string_view region,
                                absl::Time t, std::string_view service = "s3");

// Presigning (query-string authentication). Returns the full query string to append after '?':
// the request's own query plus the X-Amz-* parameters and X-Amz-Signature, canonically ordered
// and encoded. Only `host` is signed; the payload is UNSIGNED-PAYLOAD.
struct Presigned {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;
  std::string query;  // canonical query + "&X-Amz-Signature=..."
};
Presigned Presign(std::string_view method, std::string_view host, std::string_view path, const Pairs& query,
                  const Credentials& credentials, std::string_view region, absl::Time t, int64_t expires_seconds,
                  std::string_view service = "s3");

// A presigned PUT of bytes known when it is signed (docs/security.md 40.5c): besides `host`,
// `content-length` (`size`) and `x-amz-content-sha256` (`sha256_hex`, lower-case hex) are signed
// headers, and the payload hash is the bytes' own. The uploader must send both headers as signed;
// S3 then refuses a body of any other length (the signature no longer matches) or content (the
// hash does not). The headers to send are returned in `headers`.
struct PresignedUpload {
  Presigned presigned;
  Pairs headers;  // Content-Length and x-amz-content-sha256, as they must be sent
};
PresignedUpload PresignUpload(std::string_view host, std::string_view path, const Credentials& credentials,
                              std::string_view region, absl::Time t, int64_t expires_seconds, int64_t size,
                              std::string_view sha256_hex, std::string_view service = "s3");

}  // namespace minions::sigv4
