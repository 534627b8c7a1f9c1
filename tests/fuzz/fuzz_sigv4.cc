// SigV4 on requests made of fuzzed parts (method, path, query, headers: lines of the input), and
// the redaction of secrets from printed strings. Never a crash; encodings stay in their alphabets.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "blob/s3/sigv4.h"
#include "common/redact.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace minions::sigv4;
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  auto line = [&](size_t i) { return i < lines.size() ? lines[i] : std::string(); };
  for (bool keep_slash : {false, true}) {
    for (char c : UriEncode(text, keep_slash)) {
      bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' || c == '~' ||
                c == '%' || (keep_slash && c == '/');
      if (!ok) std::abort();
    }
  }
  Request request;
  request.method = line(0);
  request.path = "/" + line(1);
  for (size_t i = 2; i + 1 < lines.size() && i < 12; i += 2) request.query.emplace_back(lines[i], lines[i + 1]);
  request.headers = {{"host", "bucket.s3.example"}, {"x-amz-date", "20260101T000000Z"}, {"x-amz-content-sha256", std::string(kUnsignedPayload)}};
  for (size_t i = 12; i + 1 < lines.size() && i < 20; i += 2) request.headers.emplace_back(lines[i], lines[i + 1]);
  request.payload_hash = std::string(kUnsignedPayload);
  const Credentials credentials{"AKIDEXAMPLE", line(20), line(21)};
  const absl::Time t = absl::FromUnixSeconds(1767225600);
  (void)AuthorizationHeader(request, credentials, "us-east-1", t);
  Presigned presigned = Presign(request.method, "bucket.s3.example", request.path, request.query, credentials, "us-east-1", t, 3600);
  if (presigned.signature.size() != 64) std::abort();
  (void)minions::RedactSecrets(text);
  return 0;
}
