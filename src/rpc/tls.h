#pragma once
// TLS for the gRPC port: the server's certificate and key (from the operator, or `minions pki
// init`), and the CA a client checks the server against. A server bound to anything but loopback
// must have TLS; a client refuses to send credentials in plain text to anything but loopback.
// Pure setup; any thread.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/rpc.h"

namespace minions::rpc {

// How a client reaches the server. An empty ca_file means plain text (loopback only).
struct ClientTls {
  std::string ca_file;      // PEM: the CA that signed the server's certificate
  // The name the server's certificate must carry; "": the host of the address dialled. Useful
  // when dialling an IP address the certificate does not list.
  std::string server_name;
  bool enabled() const { return !ca_file.empty(); }
};

// What a server presents. Both or neither.
struct ServerTls {
  std::string cert_file;  // PEM: the server's certificate (then its chain)
  std::string key_file;   // PEM: its private key
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// The contents of a PEM file; InvalidArgument naming `what` when it cannot be read or holds no
// PEM block.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what);

// Server credentials for `listen`: TLS when `tls` is set, plain text only when `listen` is
// 127.0.0.1, [::1] or localhost (FailedPrecondition otherwise, saying how to get a certificate).
// Both take an auth metadata processor (SetAuthMetadataProcessor): plain text is gRPC's local
// credentials, which accept only loopback connections.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const std::string& listen,
                                                                           const ServerTls& tls);

// A channel to `address`: TLS checked against `tls.ca_file`, or plain text to a loopback address
// (FailedPrecondition otherwise: the credential would travel in the clear).
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& address, const ClientTls& tls,
                                                          ChannelUse use = ChannelUse::kClient);

}  // namespace minions::rpc
