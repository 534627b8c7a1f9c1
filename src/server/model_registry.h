#pragma once
// What a job's model reference means on this server: a registry model of the job's team (its
// digest, size and the memory a task of it needs) or a path executors open. Used at submit.
// Threads: any (the store is thread-safe).

#include <map>
#include <string>
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

// The model bytes each team keeps (Team::max_model_bytes bounds them): the sizes of the digests
// its registry names, each digest once, from `models` (ModelStore::ListModels).
std::map<std::string, int64_t> ModelBytesByTeam(const std::vector<ModelRecord>& models);

// Placement at submit: FailedPrecondition, saying why, when no executor of `fleet` (revoked ones
// aside) could ever run a job of `spec` (its usable memory holds requirements.min_memory_bytes
// and it offers requirements.runner). A fleet with no executor yet takes any job: machines may
// enrol later.
// A gang job (spec.gang_size >= 2) is checked against the gang instead (model/placement.h
// GangFleetFit: its gang_size largest executors with a gang address together).
absl::Status CheckFleetCanHold(const std::vector<Executor>& fleet, const JobSpec& spec);

// Automatic gangs (docs/architecture.md, "Gangs"): a job that asks for no gang and that no single
// executor of `fleet` can hold gets spec.gang_size = the fewest executors that can join gangs
// whose usable memory together holds it (largest first), when some do (2..kMaxGangSize of them);
// otherwise spec is left as it is (and CheckFleetCanHold refuses it).
void PlanAutomaticGang(const std::vector<Executor>& fleet, JobSpec& spec);

// A model named by an absolute path must lie in a model folder of some executor of `fleet`
// (ExecutorInfo::model_folders; revoked executors and those that report none aside): otherwise
// InvalidArgument naming the folders the fleet has and suggesting `minions models push`, so the
// job fails at submit, not on every executor later. Anything else (a registry model, a path
// relative to the folders, a fleet that reports no folder) passes.
absl::Status CheckModelPathInFolders(const std::vector<Executor>& fleet, const JobSpec& spec);

}  // namespace minions
