#pragma once
// ModelCatalog: the names the OpenAI API's `model` fields resolve through. The seam for the model
// registry (the models issue): until it lands, FolderModelCatalog serves the GGUF files of the
// folders the server is given (`minions server --openai-model-dir DIR`), each named by its file
// name without ".gguf", and resolves a name to the file's path (what a job's model is today).
// Threads: implementations are thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace minions::openai {

struct CatalogModel {
  std::string name;       // what records and /v1/models say
  std::string reference;  // what a job's model becomes (a GGUF path, for now)
  absl::Time created;
};

class ModelCatalog {
 public:
  virtual ~ModelCatalog() = default;
  // Every model, by name.
  virtual absl::StatusOr<std::vector<CatalogModel>> List() = 0;
  // The model named `name`; NotFound (whose message names the models there are) otherwise.
  absl::StatusOr<CatalogModel> Resolve(const std::string& name);
};

class FolderModelCatalog final : public ModelCatalog {
 public:
  explicit FolderModelCatalog(std::vector<std::string> folders) : folders_(std::move(folders)) {}
  // Read on every call (a folder is small), so a model copied in is served at once. A name found
  // in two folders is the first folder's.
  absl::StatusOr<std::vector<CatalogModel>> List() override;

 private:
  std::vector<std::string> folders_;
};

}  // namespace minions::openai
