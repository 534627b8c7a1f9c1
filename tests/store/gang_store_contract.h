#pragma once
// The GangStore contract (gang_store_contract.cc): the MetadataStore contract's fixture with a
// helper for gangs. A backend instantiates it next to the MetadataStore contract, with the same
// factories:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, GangStoreContract, ::testing::Values(...));

#include "metadata_store_contract.h"

namespace minions {

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
