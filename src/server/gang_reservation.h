#pragma once
// Gang reservation (docs/architecture.md, "Gangs"): a task whose model no single executor can hold
// runs on a gang, a leader and members lending it their memory over llama.cpp's RPC backend. A
// gang is reserved all or nothing:
//
//   - ChooseGang picks the fewest executors whose memory covers the model (or exactly N of them
//     for `--gang N`), largest first; the first is the leader.
//   - GangReserver holds ONE reservation at a time. The executors it names are held as they ask
//     for work (they take nothing else meanwhile); when the last one asks, the gang is formed and
//     handed to the caller, which leases the task to all of them at once. A reservation that does
//     not fill within its timeout is released, every held executor is free again, and the gang
//     waits out the same time before it is tried again.
//
// Why one at a time: two reservations filling at once can each hold part of the fleet and wait
// for the rest forever (two gangs of 3 on a fleet of 4). One reservation cannot deadlock, and its
// timeout bounds what it holds. Executors it does not name keep leasing single-machine work
// throughout, so single work flows while a gang forms.
//
// Ownership: the reservation in progress and the gangs backing off. Threads: thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace minions {

// What a gang task needs.
struct GangRequest {
  std::string key;     // the task it is for ("job/index")
  int64_t bytes = 0;   // memory the model needs (the models estimate)
  int members = 0;     // --gang N: exactly N executors; 0: the fewest whose memory covers `bytes`
};

// An executor that could join: idle, and reporting a gang network address.
struct GangCandidate {
  std::string executor_id;
  int64_t memory_bytes = 0;   // usable memory it declares
  std::string gang_address;   // its address on the gang network
  bool operator==(const GangCandidate&) const = default;
};

// The fewest candidates whose memory covers request.bytes (with request.members: exactly that
// many, the largest), largest first, ties by id. NotFound when the candidates cannot; a
// candidate without a gang address is never chosen.
absl::StatusOr<std::vector<GangCandidate>> ChooseGang(const GangRequest& request,
                                                      std::vector<GangCandidate> candidates);

class GangReserver {
 public:
  GangReserver(Clock* clock, absl::Duration timeout) : clock_(clock), timeout_(timeout) {}

  // Starts reserving `members` (members[0] leads) for `request`. FailedPrecondition while another
  // reservation is in progress or this gang is backing off after a timeout.
  absl::Status Begin(const GangRequest& request, std::vector<GangCandidate> members) ABSL_LOCKS_EXCLUDED(mu_);

  enum class Verdict {
    kFree,    // not reserved: lease single-machine work as usual
    kHeld,    // reserved for a gang still forming: take nothing else, ask again
    kFormed,  // this call completed the gang: lease `request.key` to `members`, all at once
  };
  struct Answer {
    Verdict verdict = Verdict::kFree;
    GangRequest request;                 // kHeld, kFormed
    std::vector<GangCandidate> members;  // kFormed: the whole gang, the leader first
  };
  // An executor asking for work. Releases a reservation whose time is up first.
  Answer CheckIn(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);
  // An executor that went away (lost, its owner back, stopping): a reservation holding it is
  // released at once, as a timeout would.
  void Withdraw(const std::string& executor_id) ABSL_LOCKS_EXCLUDED(mu_);

  bool busy() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `key` may Begin now (no reservation in progress, not backing off).
  bool CanBegin(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Reservations released unfilled so far (metrics, tests).
  int64_t released() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  struct Reservation {
    GangRequest request;
    std::vector<GangCandidate> members;
    absl::flat_hash_set<std::string> checked_in;
    absl::Time deadline;
  };
  std::optional<Reservation> current_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> backoff_until_ ABSL_GUARDED_BY(mu_);
  int64_t released_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
