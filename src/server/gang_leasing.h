#pragma once
// GangLeasing: the lease path of gang jobs (docs/architecture.md, "Gangs"). A gang job's tasks
// (JobSpec::gang_size >= 2) are never leased to one executor (placement's Fit::kGang keeps them
// out of the store's lease query); this module leases them to whole gangs, composed with the
// ordinary lease path rather than inside it:
//
//   - Each Lease call of an executor checks in here first (CheckIn). An executor a reservation
//     holds takes nothing else; any other goes on to the ordinary lease query, so single-machine
//     work keeps flowing while a gang fills.
//   - When no reservation is in progress, a check-in looks (at most every `look_every`) for the
//     next pending gang task (GangStore::NextGangTask: priority, age, teams at their quota
//     skipped) and for idle executors that can join gangs (available, not draining, a gang
//     address, the job's runner), and begins reserving the fewest (or exactly gang_size) of them
//     whose memory covers the job (ChooseGang, GangReserver: one reservation at a time, all or
//     nothing, released after `reservation_timeout`).
//   - The check-in that completes the reservation grants the task to the gang in one store
//     transaction (GangStore::LeaseToGang: the leader holds the lease; the seats are recorded).
//     The leader's next answer carries the task with its members' endpoints; each member's
//     carries a GangDuty (serve the leader's rpc connections). Both wait here until their
//     executor's next Lease call takes them.
//   - Members report their duties in every heartbeat; EndedDuties answers those whose attempt
//     has ended (the task moved on), so the member stops its rpc-server, and frees their seats.
//
// Ownership: the GangReserver and the deliveries not yet taken. Threads: thread-safe.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "model/liveness.h"
#include "model/types.h"
#include "server/gang_reservation.h"
#include "store/metadata_store.h"

namespace minions {

struct GangLeasingOptions {
  absl::Duration lease_ttl = absl::Seconds(9);            // the leader's lease
  absl::Duration reservation_timeout = absl::Seconds(30);  // an unfilled reservation is released
  absl::Duration look_every = absl::Seconds(1);           // how often idle check-ins look for gang work
  // An idle executor not heard from for this long may be gone: not placed in a gang
  // (model/liveness.h SilentAfterFor: an idle heartbeat's interval and a late beat's grace).
  absl::Duration silent_after = SilentAfterFor(IdleHeartbeatFor(absl::Seconds(9)), absl::Seconds(9));
};

class GangLeasing {
 public:
  GangLeasing(MetadataStore* store, Clock* clock, GangLeasingOptions options)
      : store_(store), options_(options), reserver_(clock, options.reservation_timeout) {}

  struct CheckInAnswer {
    bool held = false;                // reserved for a gang still forming: lease nothing else now
    std::vector<Lease> leases;        // it leads a gang formed meanwhile: this task
    bool formed = false;              // this call formed a gang: wake the others' calls
  };
  // `executor_id` asks for work at `now`.
  absl::StatusOr<CheckInAnswer> CheckIn(const std::string& executor_id, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a member's duty waits for `executor_id`'s next lease answer.
  bool HasDuties(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The duties waiting for it (taken: the answer carries them).
  std::vector<GangDuty> TakeDuties(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A member's heartbeat reports `duties`: those whose attempt has ended (to cancel). Frees the
  // seats of an ended attempt.
  std::vector<AttemptRef> EndedDuties(const std::string& executor_id, const std::vector<AttemptRef>& duties)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The executor cannot serve a gang now (its owner is back, it drains, it was lost): a
  // reservation holding it is released.
  void Withdraw(const std::string& executor_id) { reserver_.Withdraw(executor_id); }
  // The executor's connection to this server closed without a goodbye at `now` (its process
  // died): withdrawn, and chosen for no gang until it is heard from again. Without this, a gang
  // formed right after a member's death could seat the dead member (its last heartbeat is still
  // within the TTL), and its leader would wait for a gate that never answers.
  void Lost(const std::string& executor_id, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a reservation is in progress (tests).
  bool reserving() { return reserver_.busy(); }
  // Tests: called by the check-in that completes a reservation, before it grants it.
  void SetBeforeFormForTesting(std::function<void()> hook) { before_form_ = std::move(hook); }

 private:
  // Begins a reservation for the next gang task when there is one and a gang for it.
  void MaybeBegin(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(form_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The reservation `formed` became a gang: grant it and queue the deliveries.
  absl::Status Form(const GangReserver::Answer& formed, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(form_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);

  MetadataStore* const store_;
  const GangLeasingOptions options_;
  GangReserver reserver_;
  // Held by a check-in from its reservation's answer to its gang's grant (CheckIn); taken before mu_.
  absl::Mutex form_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::function<void()> before_form_;  // set before any check-in (tests)
  absl::Mutex mu_;
  absl::Time next_look_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // What formed gangs hand to their executors at their next Lease call.
  absl::flat_hash_map<std::string, std::vector<Lease>> leader_leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<GangDuty>> duties_ ABSL_GUARDED_BY(mu_);
  // The job of each reservation's task (the key "job/index").
  absl::flat_hash_map<std::string, std::pair<std::string, int64_t>> tasks_ ABSL_GUARDED_BY(mu_);
  // Executors whose connection closed without a goodbye, and when (Lost); forgotten once heard
  // from since, or after a lease TTL (then their silence alone keeps them out).
  absl::flat_hash_map<std::string, absl::Time> lost_ ABSL_GUARDED_BY(mu_);
};

// The host of a "host:port" gang address ("" when it has none).
std::string GangHost(const std::string& address);

}  // namespace minions
