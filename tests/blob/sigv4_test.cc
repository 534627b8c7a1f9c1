// SigV4 against AWS's published examples. Sources:
// - S3 API Reference, "Signature Calculations for the Authorization Header: Transferring Payload
//   in a Single Chunk (AWS Signature Version 4)" (sig-v4-header-based-auth), section "Examples:
//   Signature Calculations": GET Object, PUT Object, GET Bucket Lifecycle, Get Bucket (List Objects).
// - S3 API Reference, "Authenticating Requests: Using Query Parameters (AWS Signature Version 4)"
//   (sigv4-query-string-auth), "An Example": the presigned GET of test.txt.
// - AWS General Reference, "Examples of how to derive a signing key for Signature Version 4".
// Each example is reproduced stage by stage: canonical request text, string to sign, signature.

#include "blob/s3/sigv4.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/http_client.h"
#include "common/json_util.h"
#include "common/subprocess.h"

namespace minions::sigv4 {
namespace {

const Credentials kExample{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
const absl::Time kMay24 = absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0), absl::UTCTimeZone());
constexpr char kHost[] = "examplebucket.s3.amazonaws.com";
constexpr char kScope[] = "20130524/us-east-1/s3/aws4_request";

struct Example {
  Request request;
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;
};

void ExpectReproduced(const Example& e) {
  EXPECT_EQ(CanonicalRequest(e.request), e.canonical_request);
  EXPECT_EQ(StringToSign(kMay24, kScope, e.canonical_request), e.string_to_sign);
  std::string key = SigningKey(kExample.secret_key, "20130524", "us-east-1", "s3");
  EXPECT_EQ(Signature(key, e.string_to_sign), e.signature);
  EXPECT_EQ(AuthorizationHeader(e.request, kExample, "us-east-1", kMay24),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=" +
                SignedHeaders(e.request.headers) + ", Signature=" + e.signature);
}

TEST(SigV4, Helpers) {
  EXPECT_EQ(Sha256Hex(""), kEmptyPayloadHash);
  EXPECT_EQ(Sha256Hex("Welcome to Amazon S3."), "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  EXPECT_EQ(AmzDate(kMay24), "20130524T000000Z");
  EXPECT_EQ(DateStamp(kMay24), "20130524");
  EXPECT_EQ(UriEncode("test$file.text", false), "test%24file.text");
  EXPECT_EQ(UriEncode("/a b/c~d_e-f.g", true), "/a%20b/c~d_e-f.g");
  EXPECT_EQ(UriEncode("a/b+c=", false), "a%2Fb%2Bc%3D");
  EXPECT_EQ(UriEncode("\xc3\xa9", false), "%C3%A9");
  // The canonical query string example of the same page: sorted, each name and value encoded.
  EXPECT_EQ(CanonicalQuery({{"prefix", "somePrefix"}, {"marker", "someMarker"}, {"max-keys", "20"}}),
            "marker=someMarker&max-keys=20&prefix=somePrefix");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}}), "uploads=");
  // Header values are trimmed and inner runs of spaces collapsed; names lower-cased and sorted.
  EXPECT_EQ(CanonicalHeaders({{"X-Amz-Meta", "  a   b  "}, {"Host", "h"}}), "host:h\nx-amz-meta:a b\n");
}

TEST(SigV4, DerivesTheSigningKeyOfTheGeneralReferenceExample) {
  EXPECT_EQ(Hex(SigningKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(SigV4, GetObjectExample) {
  Example e;
  e.request = {"GET", "/test.txt", {},
               {{"Host", kHost}, {"Range", "bytes=0-9"}, {"x-amz-content-sha256", std::string(kEmptyPayloadHash)},
                {"x-amz-date", "20130524T000000Z"}},
               std::string(kEmptyPayloadHash)};
  e.canonical_request =
      "GET\n"
      "/test.txt\n"
      "\n"
      "host:examplebucket.s3.amazonaws.com\n"
      "range:bytes=0-9\n"
      "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
      "x-amz-date:20130524T000000Z\n"
      "\n"
      "host;range;x-amz-content-sha256;x-amz-date\n"
      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  e.string_to_sign =
      "AWS4-HMAC-SHA256\n"
      "20130524T000000Z\n"
      "20130524/us-east-1/s3/aws4_request\n"
      "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972";
  e.signature = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";
  ExpectReproduced(e);
}

TEST(SigV4, PutObjectExample) {
  const std::string payload_hash = Sha256Hex("Welcome to Amazon S3.");
  Example e;
  e.request = {"PUT", "/test$file.text", {},
               {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"Host", kHost}, {"x-amz-date", "20130524T000000Z"},
                {"x-amz-storage-class", "REDUCED_REDUNDANCY"}, {"x-amz-content-sha256", payload_hash}},
               payload_hash};
  e.canonical_request =
      "PUT\n"
      "/test%24file.text\n"
      "\n"
      "date:Fri, 24 May 2013 00:00:00 GMT\n"
      "host:examplebucket.s3.amazonaws.com\n"
      "x-amz-content-sha256:44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
      "x-amz-date:20130524T000000Z\n"
      "x-amz-storage-class:REDUCED_REDUNDANCY\n"
      "\n"
      "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
      "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";
  e.string_to_sign =
      "AWS4-HMAC-SHA256\n"
      "20130524T000000Z\n"
      "20130524/us-east-1/s3/aws4_request\n"
      "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d";
  e.signature = "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd";
  ExpectReproduced(e);
}

// The bucket examples: a GET of "/" with an empty payload, differing in the query (its canonical
// form given), the canonical request's hash in the string to sign, and the signature.
Example BucketGetExample(Pairs query, const std::string& canonical_query, const std::string& canonical_request_hash,
                         const std::string& signature) {
  Example e;
  e.request = {"GET", "/", std::move(query),
               {{"Host", kHost}, {"x-amz-date", "20130524T000000Z"},
                {"x-amz-content-sha256", std::string(kEmptyPayloadHash)}},
               std::string(kEmptyPayloadHash)};
  e.canonical_request =
      "GET\n"
      "/\n" +
      canonical_query +
      "\n"
      "host:examplebucket.s3.amazonaws.com\n"
      "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
      "x-amz-date:20130524T000000Z\n"
      "\n"
      "host;x-amz-content-sha256;x-amz-date\n"
      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  e.string_to_sign =
      "AWS4-HMAC-SHA256\n"
      "20130524T000000Z\n"
      "20130524/us-east-1/s3/aws4_request\n" +
      canonical_request_hash;
  e.signature = signature;
  return e;
}

TEST(SigV4, GetBucketLifecycleExample) {
  ExpectReproduced(BucketGetExample({{"lifecycle", ""}}, "lifecycle=",
                                    "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
                                    "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"));
}

TEST(SigV4, ListObjectsExample) {
  // Given out of order: the canonical query sorts them.
  ExpectReproduced(BucketGetExample({{"prefix", "J"}, {"max-keys", "2"}}, "max-keys=2&prefix=J",
                                    "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
                                    "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

TEST(SigV4, PresignedUrlExample) {
  Presigned p = Presign("GET", kHost, "/test.txt", {}, kExample, "us-east-1", kMay24, 86400);
  EXPECT_EQ(p.canonical_request,
            "GET\n"
            "/test.txt\n"
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2F"
            "aws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "\n"
            "host\n"
            "UNSIGNED-PAYLOAD");
  EXPECT_EQ(p.string_to_sign,
            "AWS4-HMAC-SHA256\n"
            "20130524T000000Z\n"
            "20130524/us-east-1/s3/aws4_request\n"
            "3bfa292879f6447bbcda7001decf97f4a54dc650c8942174ae0a9121cf58ad04");
  EXPECT_EQ(p.signature, "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
  EXPECT_EQ(p.query,
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2F"
            "aws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}

TEST(SigV4, PresignedUrlCarriesTheSessionToken) {
  Credentials with_token = kExample;
  with_token.session_token = "tok/en+=";
  Presigned p = Presign("PUT", kHost, "/a b", {}, with_token, "us-east-1", kMay24, 60);
  EXPECT_NE(p.query.find("X-Amz-Security-Token=tok%2Fen%2B%3D"), std::string::npos) << p.query;
  EXPECT_NE(p.canonical_request.find("PUT\n/a%20b\n"), std::string::npos) << p.canonical_request;
  EXPECT_NE(p.signature, Presign("PUT", kHost, "/a b", {}, kExample, "us-east-1", kMay24, 60).signature);
}

// 40.5c: an upload signed for its size and hash signs both as headers and the payload as its hash,
// so neither a longer body nor other bytes of the same length carry the signature.
TEST(SigV4, AnUploadSignedForItsSizeSignsTheLengthAndTheHash) {
  const std::string hash = Sha256Hex("hello");
  PresignedUpload up = PresignUpload(kHost, "/chunk", kExample, "us-east-1", kMay24, 600, 5, hash);
  EXPECT_EQ(up.presigned.canonical_request,
            absl::StrCat("PUT\n/chunk\n"
                         "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1"
                         "%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=600"
                         "&X-Amz-SignedHeaders=content-length%3Bhost%3Bx-amz-content-sha256\n"
                         "content-length:5\nhost:examplebucket.s3.amazonaws.com\nx-amz-content-sha256:",
                         hash, "\n\ncontent-length;host;x-amz-content-sha256\n", hash));
  EXPECT_EQ(up.headers, (Pairs{{"Content-Length", "5"}, {"x-amz-content-sha256", hash}}));
  // Another length, or other bytes, is another signature: what was signed does not cover them.
  EXPECT_NE(up.presigned.signature,
            PresignUpload(kHost, "/chunk", kExample, "us-east-1", kMay24, 600, 6, hash).presigned.signature);
  EXPECT_NE(up.presigned.signature,
            PresignUpload(kHost, "/chunk", kExample, "us-east-1", kMay24, 600, 5, Sha256Hex("hellx")).presigned.signature);
  // The host-only presigned PUT signs neither.
  const Presigned host_only = Presign("PUT", kHost, "/chunk", {}, kExample, "us-east-1", kMay24, 600);
  EXPECT_EQ(host_only.canonical_request.find("content-length"), std::string::npos);
}

// The S3 test server never checks signatures, and AWS's examples are few: every header signature
// and presigned URL of a few hundred randomised requests (odd keys and query values, unicode,
// spaces and tabs in headers, session tokens, regions, dates) must equal what the AWS SDK's own
// signer (@smithy/signature-v4 from npm, tests/js/sigv4_check.mjs) computes. No network.
TEST(SigV4, AgreesWithTheAwsSdkSignerOnRandomisedRequests) {
  uint64_t seed = 20260101;
  if (const char* env = std::getenv("MINIONS_SIGV4_SEED"); env && *env) seed = std::strtoull(env, nullptr, 10);
  std::mt19937_64 rng(seed);
  auto pick = [&](const std::vector<std::string>& from) { return from[rng() % from.size()]; };
  auto text = [&](const std::vector<std::string>& alphabet, size_t max_len) {
    std::string out;
    for (size_t n = rng() % (max_len + 1); n > 0; --n) out += pick(alphabet);
    return out;
  };
  const std::vector<std::string> key_chars = {"a", "b", "Z", "0", "9", "-", "_", ".", "~", " ", "+", "=", "&", "%",
                                              "!", "'", "(", ")", "*", ":", "@", "$", ",", ";", "\xc3\xa9",
                                              "\xe6\x97\xa5", "?", "#", "[", "]"};
  const std::vector<std::string> name_chars = {"a", "b", "x", "-", "_", ".", "~", "1", "Z", " ", "%", "="};
  const std::vector<std::string> value_chars = {"a", "Z", "0", " ", "/", "+", "=", "&", "%", "~", "\xc3\xbc", ":", "*"};
  const std::vector<std::string> header_chars = {"a", "B", "1", " ", "  ", "\t", "-", "/", ";", "=", ","};
  const std::string path = testing::TempDir() + "/sigv4-requests.jsonl";
  std::ofstream out(path, std::ios::trunc);
  const int kRequests = 300;
  for (int i = 0; i < kRequests; ++i) {
    Credentials credentials{"AKIA" + text({"A", "B", "7", "Q"}, 16), text({"a", "Z", "/", "+", "9"}, 40) + "k",
                            rng() % 3 == 0 ? "FwoGZX" + text({"a", "/", "+", "="}, 60) : ""};
    const std::string region = pick({"us-east-1", "eu-west-3", "ap-southeast-2", "us-gov-west-1"});
    const absl::Time t = absl::FromUnixSeconds(1'500'000'000 + static_cast<int64_t>(rng() % 400'000'000));
    const std::string host = pick({"bucket.s3.amazonaws.com", "s3.eu-west-3.amazonaws.com", "minio.corp.example",
                                   "b-" + text({"a", "1", "-"}, 10) + "x.s3.amazonaws.com"});
    Request request;
    request.method = pick({"GET", "PUT", "HEAD", "DELETE", "POST"});
    request.path = "/";
    for (size_t segments = 1 + rng() % 4, k = 0; k < segments; ++k) {
      request.path += text(key_chars, 12) + (k + 1 < segments ? "/" : "");
    }
    std::set<std::string> names;
    for (size_t k = rng() % 5; k > 0; --k) {
      std::string name = "q" + text(name_chars, 8);
      if (names.insert(name).second) request.query.emplace_back(name, text(value_chars, 16));
    }
    request.payload_hash = rng() % 2 ? std::string(kUnsignedPayload) : Sha256Hex(text(value_chars, 30));
    request.headers = {{"host", host}, {"x-amz-date", AmzDate(t)}, {"x-amz-content-sha256", request.payload_hash}};
    if (!credentials.session_token.empty()) request.headers.emplace_back("x-amz-security-token", credentials.session_token);
    for (size_t k = rng() % 4; k > 0; --k) {
      std::string name = pick({"content-type", "X-Amz-Meta-Owner", "x-amz-meta-note", "Content-MD5", "range"});
      bool seen = false;
      for (const auto& [n, v] : request.headers) seen |= absl::AsciiStrToLower(n) == absl::AsciiStrToLower(name);
      if (seen) continue;
      // Leading, trailing and inner runs of spaces and tabs: the signer trims and collapses them.
      request.headers.emplace_back(name, pick({"", " ", "\t"}) + "v" + text(header_chars, 14) + "w" + pick({"", "  ", "\t "}));
    }
    const int64_t expires = 1 + static_cast<int64_t>(rng() % 604800);
    Presigned presigned = Presign(request.method, host, request.path, request.query, credentials, region, t, expires);
    Json line = {{"method", request.method},
                 {"host", host},
                 {"path", request.path},
                 {"query", Json::array()},
                 {"headers", Json::array()},
                 {"access_key", credentials.access_key},
                 {"secret_key", credentials.secret_key},
                 {"session_token", credentials.session_token},
                 {"region", region},
                 {"time_ms", absl::ToUnixMillis(t)},
                 {"expires", expires},
                 {"ours", {{"encoded_path", UriEncode(request.path, /*keep_slash=*/true)},
                           {"authorization", AuthorizationHeader(request, credentials, region, t)},
                           {"presigned_signature", presigned.signature},
                           {"presigned_credential", absl::StrCat(credentials.access_key, "/", CredentialScope(t, region))}}}};
    for (const auto& [k, v] : request.query) line["query"].push_back({k, v});
    for (const auto& [k, v] : request.headers) line["headers"].push_back({k, v});
    out << DumpJson(line) << "\n";
  }
  out.close();
  std::string command = absl::StrCat(MINIONS_TEST_NODE, " ", MINIONS_TEST_JS_DIR, "/sigv4_check.mjs ", path, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string result;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) result.append(buffer, n);
  int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "seed " << seed << ":\n" << result.substr(0, 20000);
  EXPECT_NE(result.find(absl::StrCat("checked ", kRequests, " requests, 0 mismatches")), std::string::npos) << result;
}

// 40.5c, against an S3 server that checks signatures (tests/js/s3_strict_server.mjs): an upload
// signed for its size is taken at that size and refused larger, while a host-only presigned PUT
// (what chunk URLs still are) takes any size. Real S3 also checks the body against the signed
// x-amz-content-sha256; this server checks only the signature.
TEST(SigV4, AnS3ServerThatChecksSignaturesRefusesAnUploadLargerThanSigned) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/strict-s3-", getpid());
  std::filesystem::create_directories(dir);
  Subprocess::Options options;
  options.argv = {MINIONS_TEST_NODE, std::string(MINIONS_TEST_JS_DIR) + "/s3_strict_server.mjs", dir};
  absl::StatusOr<std::unique_ptr<Subprocess>> server = Subprocess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> endpoint = (*server)->ReadLine(absl::Seconds(60));
  ASSERT_TRUE(endpoint.ok()) << "the S3 server did not start (npm ci in tests/js?): " << endpoint.status();
  const std::string host = endpoint->substr(std::string("http://").size());
  const Credentials keys{"S3RVER", "S3RVER", ""};
  RealClock clock;
  HttpClient http(&clock, HttpClient::Options{.max_attempts = 1});
  auto put = [&](const std::string& query, const std::string& body, const std::string& hash) {
    HttpClient::Request request;
    request.method = "PUT";
    request.url = absl::StrCat(*endpoint, "/minions-test/chunk?", query);
    request.body = body;
    if (!hash.empty()) request.headers = {"x-amz-content-sha256: " + hash};
    return http.Exchange(request);
  };
  const std::string chunk = "five!";
  const PresignedUpload signed_for_five =
      PresignUpload(host, "/minions-test/chunk", keys, "us-east-1", absl::Now(), 600, 5, Sha256Hex(chunk));
  const std::string larger = chunk + std::string(1 << 20, 'x');
  HttpClient::Response refused = put(signed_for_five.presigned.query, larger, Sha256Hex(chunk));
  ASSERT_TRUE(refused.reached) << refused.transport_error;
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_NE(refused.body.find("SignatureDoesNotMatch"), std::string::npos) << refused.body;
  HttpClient::Response taken = put(signed_for_five.presigned.query, chunk, Sha256Hex(chunk));
  EXPECT_EQ(taken.status, 200) << taken.body;
  // A host-only presigned PUT carries no size: the server takes the larger body.
  const Presigned host_only = Presign("PUT", host, "/minions-test/chunk", {}, keys, "us-east-1", absl::Now(), 600);
  EXPECT_EQ(put(host_only.query, larger, "").status, 200);
  (*server)->CloseStdin();
  EXPECT_TRUE((*server)->Wait(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace minions::sigv4
