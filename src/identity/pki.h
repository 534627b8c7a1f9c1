#pragma once
// A private certificate authority for a pool, as `minions pki init` makes it (the way Nomad and
// k3s do): a CA certificate and key, and a server certificate signed by it for the names and
// addresses clients dial. Clients and executors are given the CA certificate (ca.pem) and check
// the server against it. ECDSA P-256 keys; key files are 0600.
//
//   DIR/ca.pem          the CA certificate: give it to clients and executors (--ca, MINIONS_CA)
//   DIR/ca-key.pem      the CA key: keep it on the machine that issues certificates, 0600
//   DIR/server.pem      the server certificate (--tls-cert)
//   DIR/server-key.pem  its key (--tls-key), 0600
// Pure file work; any thread.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions::pki {

struct InitOptions {
  std::string dir;
  // Names and addresses the server certificate is valid for, besides localhost, 127.0.0.1, ::1
  // and this machine's host name: the ones clients and executors dial.
  std::vector<std::string> hosts;
  absl::Duration server_validity = absl::Hours(24 * 825);
  absl::Duration ca_validity = absl::Hours(24 * 3650);
};

struct Files {
  std::string ca_cert;
  std::string ca_key;
  std::string server_cert;
  std::string server_key;
  bool ca_created = false;  // false: an existing CA in `dir` signed the new server certificate
};

// Makes the CA if `dir` has none (an existing one is kept, so certificates it signed stay
// valid), then issues a fresh server certificate for `hosts`. InvalidArgument for a bad host
// name; Internal when OpenSSL fails.
absl::StatusOr<Files> Init(const InitOptions& options, absl::Time now);

// The names a server certificate is made for: `hosts`, then localhost, 127.0.0.1, ::1 and this
// machine's host name, without repeats.
std::vector<std::string> ServerNames(const std::vector<std::string>& hosts);

}  // namespace minions::pki
