#pragma once
// A whole pool on one machine: a server (with its watchdog) and N executor processes. The verbs
// `up` and `demo` use it; apps/ provides the implementation, since only apps/ knows the concrete
// backends (SQLite, local directory).

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
  std::string token;
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
};

using PoolFactory = std::function<absl::StatusOr<std::unique_ptr<Pool>>(const PoolOptions&)>;

}  // namespace minions::cli
