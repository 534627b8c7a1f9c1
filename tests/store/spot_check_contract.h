#pragma once
// The MetadataStore contract's spot-check scenarios (issue 38, docs/verification.md "Spot
// checks"): verification tasks drawn when chunks commit, leased only to another executor, and
// reported only by the holder of their lease. A backend instantiates SpotCheckContract with a
// factory whose stores have StoreOptions::spot_checks on and SpotCheckOptions' policy.

#include "metadata_store_contract.h"

namespace minions {

// What the factories of SpotCheckContract give their stores: spot checks on, every record of an
// executor's first 1000 drawn (the draws are then certain), at most 3 records a task.
inline StoreOptions SpotCheckOptions() {
  StoreOptions options;
  options.spot_checks = true;
  options.verification.fraction = 0;
  options.verification.all_until_records = 1000;
  options.verification.max_records = 3;
  return options;
}

class SpotCheckContract : public MetadataStoreContract {};

}  // namespace minions
