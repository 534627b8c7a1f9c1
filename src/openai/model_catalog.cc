#include "openai/model_catalog.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace minions::openai {

absl::StatusOr<CatalogModel> ModelCatalog::Resolve(const std::string& team, const std::string& name) {
  auto models = List(team);
  if (!models.ok()) return models.status();
  std::vector<std::string> names;
  for (const CatalogModel& m : *models) {
    if (m.name == name) return m;
    names.push_back(m.name);
  }
  return absl::NotFoundError(absl::StrCat("The model '", name.substr(0, 200), "' does not exist on this server; ",
                                          names.empty() ? "it serves no models yet"
                                                        : absl::StrCat("its models are: ", absl::StrJoin(names, ", "))));
}

absl::StatusOr<std::vector<CatalogModel>> FolderModelCatalog::List(const std::string& /*team*/) {
  std::vector<CatalogModel> out;
  std::set<std::string> seen;
  for (const std::string& folder : folders_) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
      std::error_code entry_error;
      if (!entry.is_regular_file(entry_error) || entry.path().extension() != ".gguf") continue;
      std::string name = entry.path().stem().string();
      if (!seen.insert(name).second) continue;
      CatalogModel model{name, std::filesystem::absolute(entry.path()).string(), absl::UnixEpoch()};
      auto written = entry.last_write_time(entry_error);
      if (!entry_error) {
        auto since = std::chrono::file_clock::to_sys(written).time_since_epoch();
        model.created = absl::FromUnixSeconds(std::chrono::duration_cast<std::chrono::seconds>(since).count());
      }
      out.push_back(std::move(model));
    }
  }
  std::sort(out.begin(), out.end(), [](const CatalogModel& a, const CatalogModel& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::vector<CatalogModel>> RegistryModelCatalog::List(const std::string& team) {
  auto records = store_->ListModels(team);  // by name, then newest first
  if (!records.ok()) return records.status();
  std::vector<CatalogModel> out;
  std::set<std::string> seen;
  for (const ModelRecord& r : *records) {
    if (r.team != team || !seen.insert(r.name).second) continue;
    out.push_back({r.name, absl::StrCat(r.name, "@", r.digest), r.created_at});
  }
  if (fallback_ != nullptr) {
    auto more = fallback_->List(team);
    if (!more.ok()) return more.status();
    for (CatalogModel& m : *more) {
      if (seen.insert(m.name).second) out.push_back(std::move(m));
    }
  }
  std::sort(out.begin(), out.end(), [](const CatalogModel& a, const CatalogModel& b) { return a.name < b.name; });
  return out;
}

}  // namespace minions::openai
