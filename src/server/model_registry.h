#pragma once
// What a job's model reference means on this server: a registry model of the job's team (its
// digest, size and the memory a task of it needs) or a path executors open. Used at submit.
// Threads: any (the store is thread-safe).

#include <vector>

#include "absl/status/status.h"
#include "model/types.h"
#include "store/model_store.h"

namespace minions {

// Resolves spec.model (model/model_ref.h): a registry name (the newest of that name) or
// NAME@sha256:… becomes spec.model = NAME with model_digest, model_size_bytes, and
// requirements.estimate_bytes (model/memory_estimate.h, from the GGUF facts and
// spec.runner_options); requirements.min_memory_bytes becomes the larger of the submitter's floor
// and the estimate. A path is left as it is. InvalidArgument for an unknown model, listing the
// names the team has.
absl::Status ResolveJobModel(ModelStore& store, JobSpec& spec);

// Placement at submit: FailedPrecondition, saying why, when no executor of `fleet` (revoked ones
// aside) could ever run a job of `spec` (its usable memory holds requirements.min_memory_bytes
// and it offers requirements.runner). A fleet with no executor yet takes any job: machines may
// enrol later.
absl::Status CheckFleetCanHold(const std::vector<Executor>& fleet, const JobSpec& spec);

}  // namespace minions
