#include "server/model_registry.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/memory_estimate.h"
#include "model/model_ref.h"
#include "model/placement.h"
#include "store/gang_store.h"

namespace minions {

absl::Status ResolveJobModel(ModelStore& store, JobSpec& spec) {
  ASSIGN_OR_RETURN(ModelRef ref, ParseModelRef(spec.model));
  if (ref.is_path) {
    spec.model_digest.clear();
    spec.model_size_bytes = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<ModelRecord> model = store.GetModel(spec.team, ref.name, ref.digest);
  if (absl::IsNotFound(model.status())) {
    ASSIGN_OR_RETURN(std::vector<ModelRecord> models, store.ListModels(spec.team));
    std::set<std::string> names;
    for (const ModelRecord& m : models) names.insert(m.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "team ", spec.team, " has no model ", spec.model,
        names.empty() ? "; it has no models yet (minions models push FILE --name NAME)"
                      : absl::StrCat("; its models: ", absl::StrJoin(names, ", ")),
        " (a GGUF path on the executors needs a '/' or the .gguf ending)"));
  }
  RETURN_IF_ERROR(model.status());
  ASSIGN_OR_RETURN(MemoryEstimateOptions options, MemoryEstimateOptionsFrom(spec.runner_options));
  spec.model = model->name;
  spec.model_digest = model->digest;
  spec.model_size_bytes = model->size_bytes;
  spec.requirements.estimate_bytes = EstimateTaskMemory(model->size_bytes, model->facts, options);
  spec.requirements.min_memory_bytes =
      std::max(spec.requirements.min_memory_bytes, spec.requirements.estimate_bytes);
  return absl::OkStatus();
}

void PlanAutomaticGang(const std::vector<Executor>& fleet, JobSpec& spec) {
  if (spec.gang_size != 0 || FleetFit(fleet, spec.requirements) != Fit::kTooSmall) return;
  std::vector<int64_t> lends;
  for (const Executor& e : fleet) {
    if (e.state == ExecutorState::kRevoked || e.info.gang_address.empty()) continue;
    if (!OffersRunner(e.info, spec.requirements.runner)) continue;
    lends.push_back(UsableMemory(e.info));
  }
  std::sort(lends.rbegin(), lends.rend());
  int64_t total = 0;
  for (size_t n = 1; n <= lends.size() && n <= kMaxGangSize; ++n) {
    total += lends[n - 1];
    if (n >= 2 && total >= spec.requirements.min_memory_bytes) {
      spec.gang_size = static_cast<int>(n);
      return;
    }
  }
}

absl::Status CheckModelPathInFolders(const std::vector<Executor>& fleet, const JobSpec& spec) {
  if (spec.model.empty() || spec.model[0] != '/' || !spec.model_digest.empty()) return absl::OkStatus();
  std::string path = std::filesystem::path(spec.model).lexically_normal().string();
  std::set<std::string> folders;
  for (const Executor& e : fleet) {
    if (e.state == ExecutorState::kRevoked) continue;
    for (const std::string& folder : e.info.model_folders) {
      if (absl::StartsWith(path, folder == "/" ? "/" : folder + "/")) return absl::OkStatus();
      folders.insert(folder);
    }
  }
  if (folders.empty()) return absl::OkStatus();  // nobody says: the executors decide
  std::vector<std::string> shown(folders.begin(), folders.end());
  if (shown.size() > 8) shown.resize(8);
  return absl::InvalidArgumentError(absl::StrCat(
      "model file '", spec.model.substr(0, 300), "' is in none of the executors' model folders (",
      absl::StrJoin(shown, ", "), folders.size() > shown.size() ? ", ..." : "",
      "), so no executor would load it: move it into one of them, or push it to the team's models and "
      "submit with its name: minions models push ", spec.model.substr(0, 300), " --name NAME, then --model NAME"));
}

absl::Status CheckFleetCanHold(const std::vector<Executor>& fleet, const JobSpec& spec) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (spec.gang_size >= 2) {
    int64_t total = 0;
    switch (GangFleetFit(fleet, spec.requirements, spec.gang_size, &total)) {
      case Fit::kNoRunner:
        return absl::FailedPreconditionError(absl::StrCat(
            "no executor of the fleet can join a gang with runner '", spec.requirements.runner,
            "' (an executor joins gangs once its config names its [gang] address)"));
      case Fit::kTooSmall:
        return absl::FailedPreconditionError(absl::StrFormat(
            "no gang of %d executors of the fleet can hold this job: it needs %.2f GiB and the %d largest "
            "executors that join gangs lend %.2f GiB together; ask for a larger gang (--gang) or add machines",
            spec.gang_size, static_cast<double>(spec.requirements.min_memory_bytes) / kGiB, spec.gang_size,
            static_cast<double>(total) / kGiB));
      default:
        return absl::OkStatus();
    }
  }
  int64_t largest = 0;
  switch (FleetFit(fleet, spec.requirements, &largest)) {
    case Fit::kNoRunner:
      return absl::FailedPreconditionError(absl::StrCat(
          "no executor of the fleet offers the runner '", spec.requirements.runner,
          "': name one they run (--runner), or configure it on executors"));
    case Fit::kTooSmall: {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no executor of the fleet can hold this job: a task needs %.2f GiB (model, KV cache and margin) and the "
          "most usable memory of an executor offering runner '%s' is %.2f GiB; use a smaller model or context "
          "(n_ctx, n_parallel), or add a larger machine",
          static_cast<double>(spec.requirements.min_memory_bytes) / kGiB, spec.requirements.runner,
          static_cast<double>(largest) / kGiB));
    }
    default:
      return absl::OkStatus();
  }
}

std::map<std::string, int64_t> ModelBytesByTeam(const std::vector<ModelRecord>& models) {
  std::map<std::string, int64_t> bytes;
  std::set<std::pair<std::string, std::string>> seen;  // (team, digest)
  for (const ModelRecord& model : models) {
    if (seen.insert({model.team, model.digest}).second) bytes[model.team] += model.size_bytes;
  }
  return bytes;
}

}  // namespace minions
