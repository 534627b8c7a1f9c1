#pragma once
// How the fleet hears from its executors, all derived from the lease TTL (one place, so the
// server that tells executors how often to beat and the watchdog that waits for them agree).
//
// - An executor holding leases or gang duties heartbeats every TTL/3: each beat renews its leases,
//   and a lease lapses after a TTL without one.
// - The watchdog marks an executor lost after ExecutorTimeoutFor(ttl) without a heartbeat.
// - An executor holding nothing heartbeats every IdleHeartbeatFor(ttl): half the executor
//   timeout, so one lost beat never makes an idle executor lost. Its beat renews nothing, it only
//   says "alive"; in a large idle fleet these beats are most of the server's calls (10,000 idle
//   executors: ~740 a second at 1.5 TTL, against ~1,670 at two thirds of it).
// - Gang placement counts an idle executor silent for SilentAfterFor(ttl) as maybe gone: an idle
//   beat's interval plus a third of a TTL for one that is late.

#include "absl/time/time.h"

namespace minions {

inline absl::Duration ExecutorTimeoutFor(absl::Duration lease_ttl) { return lease_ttl * 3; }
inline absl::Duration IdleHeartbeatFor(absl::Duration lease_ttl) { return ExecutorTimeoutFor(lease_ttl) / 2; }
inline absl::Duration SilentAfterFor(absl::Duration idle_heartbeat, absl::Duration lease_ttl) {
  return idle_heartbeat + lease_ttl / 3;
}

}  // namespace minions
