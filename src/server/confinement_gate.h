#pragma once
// ConfinementGate: whether an executor may be leased work, by how it says its runners are
// confined (Capabilities.confinement). A pool that requires confinement
// (ServerOptions::require_confined_executors) leases work only to executors whose runners run
// under Landlock and seccomp (macOS: sandbox-exec); one with seccomp only (a kernel without
// Landlock), with the sandbox off, or that does not say (an older executor) is refused with
// FailedPrecondition saying why, so that no team's prompts reach a runner that fails open.
// What an executor reported is remembered from its registration on this server, or read from
// the store (a server that restarted, or a registration on another server), and read again
// after kRecheck: an executor that registered elsewhere since is judged by what it said there.
// Threads: any; its own lock.

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "store/metadata_store.h"

namespace minions {

class ConfinementGate {
 public:
  ConfinementGate(MetadataStore* store, bool required) : store_(store), required_(required) {}

  // Ok when the executor may be leased work; FailedPrecondition naming what it reported.
  absl::Status Check(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // An executor (re)registered with `confinement` (ExecutorInfo::confinement).
  void Registered(const std::string& executor_id, const std::string& confinement) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr absl::Duration kRecheck = absl::Seconds(30);
  struct Reported {
    std::string confinement;
    absl::Time at;  // wall time it was learnt
  };
  MetadataStore* store_;
  const bool required_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Reported> reported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
