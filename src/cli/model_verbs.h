#pragma once
// The model verbs: `minions models push FILE --name NAME`, `models list`, `models show NAME`,
// `models rm NAME[@sha256:…]`. Each prints for people by default and JSON with --json; each
// returns the process exit code.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/client_verbs.h"
#include "minions/v1/minions.grpc.pb.h"

namespace minions::cli {

// A thin, status-returning wrapper of the Models service.
class ModelsClient {
 public:
  explicit ModelsClient(const Connection& connection);
  // Pushes the GGUF file at `path` as `name` of `team` ("" : the credential's): hashes it, asks
  // the server which parts it lacks (none when the team has the bytes; those of a push that
  // stopped), sends them, and finishes. `progress` is told the bytes hashed, then sent.
  absl::StatusOr<v1::Model> Push(const std::string& path, const std::string& name, const std::string& team,
                                 const std::function<void(const std::string& phase, int64_t done, int64_t total)>&
                                     progress = nullptr);
  absl::StatusOr<std::vector<v1::Model>> List(const std::string& team);
  absl::StatusOr<v1::Model> Get(const std::string& team, const std::string& model);
  absl::StatusOr<std::vector<v1::Model>> Remove(const std::string& team, const std::string& model);

 private:
  ServiceClient<v1::Models> client_;
};

struct ModelOptions {
  std::string path;   // push: the GGUF file
  std::string name;   // push: --name; show/rm: NAME or NAME@sha256:…
  std::string team;
  bool json = false;
};

int PushModel(const Connection& connection, const ModelOptions& options);
int ListModels(const Connection& connection, const ModelOptions& options);
int ShowModel(const Connection& connection, const ModelOptions& options);
int RemoveModel(const Connection& connection, const ModelOptions& options);

// "4.7 GB", "812 MB", "0 B".
std::string HumanBytes(int64_t bytes);

}  // namespace minions::cli
