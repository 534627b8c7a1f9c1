#pragma once
// A whole pool on one machine: a server (with its watchdog) and N executor processes. The verbs
// `up` and `demo` use it; apps/ provides the implementation, since only apps/ knows the concrete
// backends (SQLite, local directory). The pool mints an admin token into its data folder (the
// CLI finds it there) and a join token its executors enrol with.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions::cli {

struct PoolOptions {
  std::string data_dir;                 // database, objects, executor state and logs
  int executors = 2;
  std::string listen = "127.0.0.1:0";   // port 0: any free port
  std::string http_listen = "127.0.0.1:0";  // dashboard and metrics; "" or "off": none
  // TLS: a certificate and key of the operator's, or `tls` alone for a private CA made in
  // DATA_DIR/tls (`minions pki init`). Required to listen anywhere but loopback.
  bool tls = false;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;  // the CA that signed tls_cert (its executors check the server against it)
  absl::Duration lease_ttl = absl::Seconds(9);
  // Folders the pool's executors load models from (they load from nowhere else); empty: the
  // executors' default, ~/.minions/models.
  std::vector<std::string> model_folders;
};

class Pool {
 public:
  virtual ~Pool() = default;  // stops the executors, then the server
  virtual std::string address() const = 0;
  virtual int executor_count() const = 0;
  // "http://host:port/" of the server's web dashboard; "" when it serves no HTTP.
  virtual std::string dashboard_url() const = 0;
  // The admin token the pool minted into its data folder (DATA_DIR/admin-token, mode 0600).
  virtual std::string admin_token() const = 0;
  virtual std::string admin_token_file() const = 0;
  // The CA certificate clients check the server against; "" for a plain-text (loopback) pool.
  virtual std::string ca_file() const = 0;
};

using PoolFactory = std::function<absl::StatusOr<std::unique_ptr<Pool>>(const PoolOptions&)>;

}  // namespace minions::cli
