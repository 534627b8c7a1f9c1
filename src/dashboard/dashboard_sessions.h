#pragma once
// DashboardSessions: the dashboard's sign-ins. The session cookie holds a random session id, never
// the token (docs/security.md, 40.7d'): a cookie that leaks (a browser profile, a proxy log) is
// worth one server's session until it ends, not the credential itself. Each session remembers the
// token it was opened with, so revoking the token ends it at the next request. Sessions live in
// this server's memory: a restart, or another server behind the same name, asks to sign in again.
// Each session also has a CSRF secret of its own (random, never in a cookie): the page reads it
// from the JSON it fetches and sends it back in a header with every change it asks for (a
// cancel), which a page of another site can neither read nor forge.
//
// Ownership: owns its table. Threads: thread-safe.

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace minions {

class DashboardSessions {
 public:
  // At most `max_sessions` at once (the oldest to end goes first), each lasting `lifetime`.
  DashboardSessions(absl::Duration lifetime, size_t max_sessions) : lifetime_(lifetime), max_sessions_(max_sessions) {}

  // A new session for `token` (already checked by the caller): its id, 64 hex digits from a
  // cryptographic random source.
  std::string Open(const std::string& token, absl::Time now);
  // The token of session `id`; "" when there is none or it has ended.
  std::string TokenOf(const std::string& id, absl::Time now);
  // The CSRF secret of session `id` (64 hex digits); "" when there is none or it has ended.
  std::string CsrfOf(const std::string& id, absl::Time now);
  // Whether `given` is the CSRF secret of the live session `id` (compared in constant time).
  bool CsrfMatches(const std::string& id, std::string_view given, absl::Time now);
  void Close(const std::string& id);
  size_t size() const;

 private:
  struct Session {
    std::string token;
    std::string csrf;
    absl::Time ends;
  };
  // The live session `id` (erased and null when it has ended).
  const Session* Find(const std::string& id, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lifetime_;
  const size_t max_sessions_;
  mutable absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace minions
