#pragma once
// UrlPolicy: which object-store URLs this executor follows. The URLs in a lease come from the
// server, and an executor trusts nothing it is sent (issue 17): it reads and writes only where its
// own configuration points, and refuses everything else before any request is made.
//
//   https://host[:port]     the object store's origin (an S3 endpoint, or its virtual-hosted
//                           bucket host); a URL must name exactly this scheme, host and port
//   http://127.0.0.1:port   plain http only on loopback (a test S3 server on this machine)
//   file:///folder          files under this folder, and only when the server is on this machine
//                           (a pool on one machine); ".." and symbolic links cannot leave it
//
// URLs with user information, fragments, other schemes, or bytes outside printable ASCII are
// refused. Hosts are parsed by libcurl's own URL parser, the one that makes the request.
//
// PolicyBlobClient applies a policy in front of another BlobClient.
// Threads: both are thread-safe (immutable after creation).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/blob_client.h"

namespace minions {

struct UrlPolicyOptions {
  // Where objects may be: origins and folders as above.
  std::vector<std::string> allowed;
  // The executor's server is on this machine: file:// folders are allowed at all.
  bool loopback_server = false;
};

class UrlPolicy {
 public:
  // InvalidArgument for an entry that is none of the forms above (or http:// off loopback).
  static absl::StatusOr<UrlPolicy> Create(const UrlPolicyOptions& options);

  // OK when `url` may be read (`write` false) or written; PermissionDenied otherwise, with a
  // message that names the URL's origin (never its query: presigned signatures stay out of logs).
  absl::Status Check(const std::string& url, bool write) const;

  // What it allows, for logs and `executor status`.
  std::string Describe() const;

 private:
  struct Origin {
    std::string scheme, host;
    long port = 0;
  };
  absl::Status CheckFile(const std::string& url, bool write) const;
  std::vector<Origin> origins_;
  std::vector<std::string> folders_;  // real paths, no trailing '/'
};

class PolicyBlobClient : public BlobClient {
 public:
  PolicyBlobClient(UrlPolicy policy, std::unique_ptr<BlobClient> inner)
      : policy_(std::move(policy)), inner_(std::move(inner)) {}
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override;
  absl::Status Put(const std::string& url, std::string_view data) override;

 private:
  UrlPolicy policy_;
  std::unique_ptr<BlobClient> inner_;
};

// The scheme, host and port libcurl sees in `url` ("https", "s3.corp", 443); InvalidArgument for
// what it cannot parse or what carries user information.
struct ParsedUrl {
  std::string scheme, host, path;
  long port = 0;
};
absl::StatusOr<ParsedUrl> ParseObjectUrl(const std::string& url);

}  // namespace minions
