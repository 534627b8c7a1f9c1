#pragma once
// ModelCatalog: the names the OpenAI API's `model` fields resolve through, per team.
// RegistryModelCatalog serves the team's models in the model registry (`minions models push`),
// each name resolving to its newest bytes pinned by digest (NAME@sha256:…), then the names of a
// fallback catalog the registry does not have. FolderModelCatalog serves the GGUF files of the
// folders the server is given (`minions server --openai-model-dir DIR`, `minions up --models`),
// each named by its file name without ".gguf", and resolves a name to the file's path.
// Threads: implementations are thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/model_store.h"

namespace minions::openai {

struct CatalogModel {
  std::string name;       // what records and /v1/models say
  std::string reference;  // what a job's model becomes: NAME@sha256:… or a GGUF path
  absl::Time created;
};

class ModelCatalog {
 public:
  virtual ~ModelCatalog() = default;
  // Every model `team` may name, by name.
  virtual absl::StatusOr<std::vector<CatalogModel>> List(const std::string& team) = 0;
  // The model named `name`; NotFound (whose message names the models there are) otherwise.
  absl::StatusOr<CatalogModel> Resolve(const std::string& team, const std::string& name);
};

class FolderModelCatalog final : public ModelCatalog {
 public:
  explicit FolderModelCatalog(std::vector<std::string> folders) : folders_(std::move(folders)) {}
  // Read on every call (a folder is small), so a model copied in is served at once. A name found
  // in two folders is the first folder's.
  absl::StatusOr<std::vector<CatalogModel>> List(const std::string& team) override;

 private:
  std::vector<std::string> folders_;
};

class RegistryModelCatalog final : public ModelCatalog {
 public:
  // `store` and `fallback` (may be null) outlive the catalog.
  RegistryModelCatalog(ModelStore* store, ModelCatalog* fallback) : store_(store), fallback_(fallback) {}
  // The team's registry models (each name once: its newest bytes), then the fallback's names
  // the registry lacks, by name.
  absl::StatusOr<std::vector<CatalogModel>> List(const std::string& team) override;

 private:
  ModelStore* store_;
  ModelCatalog* fallback_;
};

}  // namespace minions::openai
