#pragma once

#include <string>

#include "absl/time/time.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "rpc/tls.h"

namespace minions {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // gRPC address
  // HTTP address for /metrics, /healthz, /readyz and the web dashboard; "" serves no HTTP.
  std::string http_listen;
  // The HTTP port's limits and deadlines (its TLS files are `tls`'s).
  HttpServerOptions http;
  // The certificate both ports present. Required unless both listen on loopback.
  rpc::ServerTls tls;
  // Credentials: every call carries one (identity/authenticator.h); how long a looked-up one is
  // trusted before the store is asked again bounds how soon a revocation made through another
  // server bites.
  AuthenticatorOptions auth;
  absl::Duration lease_ttl = absl::Seconds(9);  // executors heartbeat every ttl/3
  int64_t default_shard_size = 100;
  int64_t max_input_bytes = int64_t{1} << 30;
  // Refuse a job whose model is a path that does not exist on this machine (right for a pool on
  // one machine; a fleet whose executors fetch models elsewhere turns it off).
  bool check_model_paths = true;
  absl::Duration url_ttl = absl::Hours(1);  // of the URLs handed to executors
};

}  // namespace minions
