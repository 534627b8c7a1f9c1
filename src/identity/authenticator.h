#pragma once
// Authenticator: turns the token a request presents into a Caller, or refuses it; checks scopes
// and the caller's team rate limit. Every gRPC call and every HTTP page but /healthz and /readyz
// goes through it.
//
// The hot path (an executor's lease and completion calls) must not cost a database round trip
// per call, so a looked-up credential is trusted for `cache_ttl` (2 s by default) before the
// store is asked again. Revocation therefore takes effect:
//   - at once on the server that performed it (Forget), and for executors on every server (the
//     store refuses a revoked executor's leases, heartbeats and reports; IdentityStore);
//   - within cache_ttl on other servers for every other credential.
// Expiry is checked on every call against the clock. Unknown tokens are never cached (they cost a
// lookup; malformed ones are refused by their checksum without one). Last use is written at most
// once per `use_record_interval` per credential.
//
// Ownership: borrows the store and the clock. Threads: thread-safe.

#include <optional>
#include <string>
#include <string_view>

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
  absl::Duration cache_ttl = absl::Seconds(2);
  absl::Duration use_record_interval = absl::Minutes(1);
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

  IdentityStore* store_;
  Clock* clock_;
  const AuthenticatorOptions options_;
  RateLimiter limiter_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> by_hash_ ABSL_GUARDED_BY(mu_);
};

// What a refused caller is told it lacks, e.g. "a viewer token cannot submit or cancel jobs".
std::string DescribeMissingScope(const Caller& caller, Scope scope);

}  // namespace minions
