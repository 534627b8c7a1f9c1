#pragma once
// Authenticator: turns the token a request presents into a Caller, or refuses it; checks scopes
// and the caller's team rate limit. Every gRPC call and every HTTP page but /healthz and /readyz
// goes through it.
//
// The hot path (an executor's heartbeats, leases and completions) must not cost a database round
// trip per call, nor one per credential every few seconds (a fleet of 1,000 idle executors re-read
// theirs about 660 times a second when each was trusted for 2 s). So a looked-up credential is
// kept for `refresh_ttl` (5 min), and revocations are read in one batch: at most once per
// `cache_ttl` (2 s), the first call that finds the last check older asks the store which
// credentials were revoked since (IdentityStore::RevokedTokensSince, looking `revocation_skew`
// further back, for servers whose clocks disagree) and drops them. Revocation therefore takes
// effect:
//   - at once on the server that performed it (Forget), and for executors on every server (the
//     store refuses a revoked executor's leases, heartbeats and reports; IdentityStore);
//   - within cache_ttl (plus one store round trip) on other servers for every other credential;
//     if the batch check cannot reach the store, a cached credential older than cache_ttl is read
//     again on its own, as if there were no cache.
// Other changes to a credential's record or its team's settings (a rate limit) reach a server
// within refresh_ttl. Expiry is checked on every call against the clock. Unknown tokens are
// never cached (they cost a lookup; malformed ones are refused by their checksum without one).
// Last use is written at most once per `use_record_interval` per credential, and the uses due are
// written together, one transaction for all of them at most every `use_flush_interval`.
//
// Ownership: borrows the store and the clock. Threads: thread-safe.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "identity/caller.h"
#include "identity/rate_limiter.h"
#include "store/identity_store.h"

namespace minions {

struct AuthenticatorOptions {
  absl::Duration cache_ttl = absl::Seconds(2);       // how often revocations are read (see above)
  absl::Duration refresh_ttl = absl::Minutes(5);     // how long a cached record is kept
  absl::Duration revocation_skew = absl::Seconds(30);
  absl::Duration use_record_interval = absl::Minutes(1);
  absl::Duration use_flush_interval = absl::Seconds(5);
  size_t max_cached = 100000;
};

class Authenticator {
 public:
  Authenticator(IdentityStore* store, Clock* clock, AuthenticatorOptions options = {});

  // The caller presenting `token_text`. Unauthenticated when it is empty, not a Minions token,
  // unknown, revoked or expired (the message says which, never anything about other
  // credentials); Unavailable when the store cannot be asked.
  absl::StatusOr<Caller> Authenticate(std::string_view token_text);

  // Authenticate, then: PermissionDenied unless the caller holds `scope` (a message that says
  // what the credential is and what it would take); ResourceExhausted when the caller's team is
  // over its rate limit.
  absl::StatusOr<Caller> Authorize(std::string_view token_text, Scope scope);

  // Drops a credential (by id) or an executor's credentials from the cache, so that a revocation
  // made through this server takes effect on the next call.
  void Forget(const std::string& token_id);
  void ForgetExecutor(const std::string& executor_id);

  const AuthenticatorOptions& options() const { return options_; }

 private:
  struct Entry {
    TokenRecord token;
    std::optional<Team> team;  // team roles: their team's settings (rate limit)
    absl::Time fetched_at;
    absl::Time use_recorded_at;
  };

  // Authenticate's checks; the entry carries the team's settings too.
  absl::StatusOr<Entry> Check(std::string_view token_text);
  // The cached entry for `hash`, or a fresh one from the store.
  absl::StatusOr<Entry> Lookup(const std::string& hash, absl::Time now);
  // Reads the revocations since the last check and drops them from the cache, unless that check
  // is younger than cache_ttl. One caller at a time asks the store; the others wait for it.
  void CheckRevocations(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_, check_mu_);
  // Notes a use of `token_id` to record; FlushUses writes the noted ones, all in one store call,
  // when the last write is older than use_flush_interval (any call may do it).
  void NoteUse(const std::string& token_id, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void FlushUses(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_, flush_mu_);

  IdentityStore* store_;
  Clock* clock_;
  const AuthenticatorOptions options_;
  RateLimiter limiter_;
  absl::Mutex check_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held while revocations are read
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held while uses are written
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> by_hash_ ABSL_GUARDED_BY(mu_);
  // When the last revocation check that reached the store began (InfinitePast: none yet).
  absl::Time revocations_checked_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<std::string> uses_due_ ABSL_GUARDED_BY(mu_);  // token ids whose use is to be written
  absl::Time uses_due_since_ ABSL_GUARDED_BY(mu_);          // the first of those uses
  absl::Time uses_flushed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// What a refused caller is told it lacks, e.g. "a viewer token cannot submit or cancel jobs".
std::string DescribeMissingScope(const Caller& caller, Scope scope);

}  // namespace minions
