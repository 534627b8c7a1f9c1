#pragma once
// RateLimiter: a token bucket per team, refilled at the team's requests_per_second and holding
// up to twice that, so a team may burst briefly but not sustain more. In memory, per server
// process: with N servers behind a balancer a team gets up to N times its rate (said in
// docs/operations.md). Time comes from the caller (the Authenticator's clock).
// Threads: thread-safe.

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace minions {

class RateLimiter {
 public:
  // Takes one request from `key`'s bucket; false when it is empty (the request must be refused).
  // `per_second` <= 0 admits everything.
  bool Admit(const std::string& key, int64_t per_second, absl::Time now);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time refilled_at;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
