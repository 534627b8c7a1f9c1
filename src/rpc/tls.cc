#include "rpc/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "rpc/rpc.h"

namespace minions::rpc {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  std::string pem = contents.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " ", path, " is not a PEM file"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const std::string& listen,
                                                                           const ServerTls& tls) {
  if (!tls.enabled()) {
    if (!IsLoopbackAddress(listen)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to serve plain text on ", listen,
          ", which other machines can reach: give the server a certificate (--tls-cert and --tls-key; "
          "`minions pki init` makes a private CA and one), or listen on 127.0.0.1"));
    }
    // Plain text through gRPC's local credentials, not its insecure ones: the bytes on the wire
    // are the same, but only these take an auth metadata processor, which refuses a call without
    // a credential from its headers, before its message is read (server/call_auth.h). They accept
    // connections only to 127.0.0.1 or ::1 (gRPC's check of the socket's own address).
    std::string host;
    int port = 0;
    if (SplitHostPort(listen, &host, &port).ok()) {
      host = absl::AsciiStrToLower(host);
      if (host != "127.0.0.1" && host != "::1" && host != "localhost") {
        return absl::FailedPreconditionError(absl::StrCat(
            "plain text listens on 127.0.0.1, [::1] or localhost only, not ", listen,
            ": listen on one of them, or give the server a certificate (--tls-cert and --tls-key)"));
      }
    }
    return grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)");
  }
  absl::StatusOr<std::string> cert = ReadPem(tls.cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key_file, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& address, const ClientTls& tls,
                                                          ChannelUse use) {
  if (!tls.enabled()) {
    if (!IsLoopbackAddress(address)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to talk plain text to ", address,
          ": credentials would cross the network in the clear. Pass the pool's CA certificate "
          "(--ca FILE or MINIONS_CA) to use TLS"));
    }
    return MakeChannel(address, use);
  }
  absl::StatusOr<std::string> ca = ReadPem(tls.ca_file, "CA certificate");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  grpc::ChannelArguments args = ChannelArgs(use);
  if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

}  // namespace minions::rpc
