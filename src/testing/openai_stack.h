#pragma once
// OpenAiStack: a fixture of what the OpenAI API runs over, in process (the OpenAI API's tests and
// its attack suite): SQLite in memory, a local object store, real tokens on a fake clock, the job
// service and the model catalogs (a folder of model files, then the registry), with the teams
// "search" and "ads". Header only; tests only; the test's thread.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "blob/local/local_blob_store.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "openai/model_catalog.h"
#include "server/job_service.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/identities.h"
#include "testing/must.h"

namespace minions::testing {

class OpenAiStack : public ::testing::Test {
 protected:
  // A fresh folder `prefix`-PID under the temporary directory holding `models` (file name ->
  // contents) in models/, and the stack over it.
  void SetUpStack(const std::string& prefix, const std::map<std::string, std::string>& models) {
    dir_ = (std::filesystem::temp_directory_path() / absl::StrCat(prefix, "-", getpid())).string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/models");
    for (const auto& [name, contents] : models) std::ofstream(dir_ + "/models/" + name) << contents;
    store_ = Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    blobs_ = Must(LocalBlobStore::Open(dir_ + "/objects"));
    auth_ = std::make_unique<Authenticator>(store_.get(), &clock_);
    identities_ = std::make_unique<IdentityAdmin>(store_.get(), &clock_);
    CreateTeams(*identities_, {"search", "ads"});
    jobs_ = std::make_unique<JobService>(store_.get(), blobs_.get(), &clock_, auth_.get(), ServerOptions{});
    folders_ = std::make_unique<openai::FolderModelCatalog>(std::vector<std::string>{dir_ + "/models"});
    catalog_ = std::make_unique<openai::RegistryModelCatalog>(store_.get(), folders_.get());
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<LocalBlobStore> blobs_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<IdentityAdmin> identities_;
  std::unique_ptr<JobService> jobs_;
  std::unique_ptr<openai::FolderModelCatalog> folders_;
  std::unique_ptr<openai::RegistryModelCatalog> catalog_;
};

}  // namespace minions::testing
