// Object URLs and model names as a malicious server may send them, through the executor's URL
// policy and model folders. Never a crash; whatever is allowed is on an allowed origin or under an
// allowed folder.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "executor/model_access.h"
#include "executor/url_policy.h"

namespace {
struct Setup {
  std::string root;
  minions::UrlPolicy policy;
  minions::ModelAccess models;
};
Setup& Get() {
  static Setup* setup = [] {
    std::string root = std::filesystem::temp_directory_path() / ("minions-fuzz-url-" + std::to_string(getpid()));
    std::filesystem::create_directories(root + "/objects/jobs");
    std::filesystem::create_directories(root + "/models");
    std::filesystem::create_directories(root + "/outside");
    std::ofstream(root + "/models/m.gguf") << "GGUF";
    std::ofstream(root + "/outside/secret") << "x";
    std::error_code ec;
    std::filesystem::create_directory_symlink(root + "/outside", root + "/objects/jobs/link", ec);
    std::filesystem::create_symlink(root + "/outside/secret", root + "/models/link.gguf", ec);
    auto policy = minions::UrlPolicy::Create({{"https://s3.example:9000", "http://127.0.0.1:4569", root + "/objects"}, true});
    auto models = minions::ModelAccess::Create({{root + "/models"}, ""});
    if (!policy.ok() || !models.ok()) std::abort();
    return new Setup{root, *policy, *models};
  }();
  return *setup;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Setup& s = Get();
  std::string text(reinterpret_cast<const char*>(data), size);
  // Relative to the test folders half of the time, so that the file rules are reached.
  std::string url = size > 0 && data[0] % 2 ? "file://" + s.root + "/" + text : text;
  for (bool write : {false, true}) {
    if (!s.policy.Check(url, write).ok()) continue;
    if (absl::StartsWithIgnoreCase(url, "file:")) {
      std::error_code ec;
      std::string real = std::filesystem::weakly_canonical(url.substr(7), ec).string();
      if (!ec && !absl::StartsWith(real, std::filesystem::canonical(s.root + "/objects").string() + "/")) std::abort();
    } else {
      auto parsed = minions::ParseObjectUrl(url);
      if (!parsed.ok() || !((parsed->host == "s3.example" && parsed->port == 9000 && parsed->scheme == "https") ||
                            (parsed->host == "127.0.0.1" && parsed->port == 4569 && parsed->scheme == "http"))) {
        std::abort();
      }
    }
  }
  for (const std::string& model : {text, s.root + "/models/" + text}) {
    auto resolved = s.models.Resolve(model);
    if (resolved.ok() && !absl::StartsWith(*resolved, std::filesystem::canonical(s.root + "/models").string() + "/")) {
      std::abort();
    }
  }
  return 0;
}
