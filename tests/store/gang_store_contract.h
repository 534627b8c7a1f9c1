#pragma once
// The GangStore contract (gang_store_contract.cc): the MetadataStore contract's fixture with a
// helper for gangs. A backend instantiates it next to the MetadataStore contract, with the same
// factories:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, GangStoreContract, ::testing::Values(...));

#include "metadata_store_contract.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "testing/even_tasks.h"

namespace minions {

// For the backends' upgrade tests: begins at `now`, for the default team, one task of a new gang
// job on a gang of three new executors and one task of a new single-machine job on a fourth.
inline absl::Status RunAGangOfThreeAndOneSingleTask(MetadataStore& store, absl::Time now, absl::Duration ttl) {
  auto submit = [&](int gang_size) -> absl::StatusOr<std::string> {
    JobSpec spec;
    spec.model = "m.gguf";
    spec.gang_size = gang_size;
    absl::StatusOr<Job> job = store.CreateJob(spec, now);
    if (!job.ok()) return job.status();
    if (absl::Status added = store.AddTasks(job->id, testing::EvenTasks(1, 1), 1, now); !added.ok()) return added;
    return job->id;
  };
  auto enrol = [&](const std::string& name) -> absl::StatusOr<std::string> {
    ExecutorInfo info;
    info.name = name;
    info.memory_bytes = int64_t{8} << 30;
    absl::StatusOr<Executor> executor = store.RegisterExecutor("", info, now);
    if (!executor.ok()) return executor.status();
    return executor->id;
  };
  GangLease gang;
  ASSIGN_OR_RETURN(gang.job_id, submit(3));
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(std::string id, enrol(absl::StrCat("m", i)));
    gang.members.push_back({id, i == 0 ? "" : "10.9.0.1:50052", int64_t{1} << 30});
  }
  RETURN_IF_ERROR(store.LeaseToGang(gang, ttl, now).status());
  RETURN_IF_ERROR(submit(0).status());
  ASSIGN_OR_RETURN(std::string single, enrol("single"));
  ASSIGN_OR_RETURN(std::vector<Lease> leases, store.LeaseTasks(single, 1, ttl, now));
  if (leases.size() != 1) return absl::InternalError("the single task was not leased");
  return absl::OkStatus();
}

class GangStoreContract : public MetadataStoreContract {
 protected:
  // A gang for attempt `attempt` of (job_id, index): the first executor leads, the others serve
  // on 10.9.0.<n>:50052 and lend n GiB.
  GangLease Gang(const std::string& job_id, int64_t index, int attempt, const std::vector<std::string>& executors) {
    GangLease gang;
    gang.job_id = job_id;
    gang.task_index = index;
    gang.attempt = attempt;
    gang.formed_at = now_;
    for (size_t i = 0; i < executors.size(); ++i) {
      gang.members.push_back({executors[i], i == 0 ? "" : "10.9.0." + std::to_string(i) + ":50052",
                              static_cast<int64_t>(i + 1) << 30});
    }
    return gang;
  }
};

}  // namespace minions
