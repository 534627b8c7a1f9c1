#pragma once
// IdGenerator: fresh row ids, a prefix ("job-", "exe-") and 12 random lowercase hex digits (48
// bits: a clash is unlikely, and an insert that meets one tries another id, InsertWithFreshId).
// Owns its random source (seeded from std::random_device). Thread-safe.

#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace minions {

class IdGenerator {
 public:
  IdGenerator() : random_(std::random_device{}()) {}
  IdGenerator(const IdGenerator&) = delete;
  IdGenerator& operator=(const IdGenerator&) = delete;

  std::string NewId(const char* prefix) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
