#include "server/model_registry.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/memory_estimate.h"
#include "model/model_ref.h"
#include "model/placement.h"

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

absl::Status CheckFleetCanHold(const std::vector<Executor>& fleet, const JobSpec& spec) {
  int64_t largest = 0;
  switch (FleetFit(fleet, spec.requirements, &largest)) {
    case Fit::kNoRunner:
      return absl::FailedPreconditionError(absl::StrCat(
          "no executor of the fleet offers the runner '", spec.requirements.runner,
          "': name one they run (--runner), or configure it on executors"));
    case Fit::kTooSmall: {
      constexpr double kGiB = 1024.0 * 1024 * 1024;
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

}  // namespace minions
