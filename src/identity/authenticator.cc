#include "identity/authenticator.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "identity/token.h"

namespace minions {
namespace {

// What a scope allows, and which credential carries it, in words for a refusal.
struct ScopeWords {
  const char* allows;
  const char* needs;
};

ScopeWords WordsFor(Scope scope) {
  switch (scope) {
    case Scope::kAdmin:
      return {"administer the pool (teams, tokens, executors)", "an admin token"};
    case Scope::kJobsRead:
      return {"read jobs", "a team's viewer or submitter token"};
    case Scope::kJobsWrite:
      return {"submit or cancel jobs", "a team's submitter token"};
    case Scope::kFleetRead:
      return {"see the fleet", "a viewer, monitor or admin token"};
    case Scope::kMetricsRead:
      return {"read metrics", "a viewer, monitor or admin token"};
    case Scope::kExecutor:
      return {"act as an executor", "an executor's own credential (from enrolment with a join token)"};
    case Scope::kEnrol:
      return {"enrol executors", "a join token"};
  }
  return {"do that", ""};
}

}  // namespace

std::string DescribeMissingScope(const Caller& caller, Scope scope) {
  const ScopeWords words = WordsFor(scope);
  return absl::StrCat("a ", std::string(RoleName(caller.role)), " token cannot ", words.allows, "; that takes ",
                      words.needs);
}

Authenticator::Authenticator(IdentityStore* store, Clock* clock, AuthenticatorOptions options)
    : store_(store), clock_(clock), options_(options) {}

void Authenticator::CheckRevocations(absl::Time now) {
  auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return now >= revocations_checked_at_ && now - revocations_checked_at_ < options_.cache_ttl;
  };
  {
    absl::MutexLock lock(&mu_);
    if (fresh()) return;
  }
  absl::MutexLock checking(&check_mu_);
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    if (fresh()) return;  // another caller checked meanwhile
    // The first check looks back as far as the oldest entry the cache may hold.
    since = (revocations_checked_at_ == absl::InfinitePast() || revocations_checked_at_ > now
                 ? now - options_.refresh_ttl
                 : revocations_checked_at_) -
            options_.revocation_skew;
  }
  absl::StatusOr<std::vector<std::string>> revoked = store_->RevokedTokensSince(since);
  if (!revoked.ok()) {
    // Entries older than cache_ttl are read again one by one until a check succeeds.
    MINIONS_LOG(Warning) << "revocations not read: " << revoked.status().message();
    return;
  }
  absl::flat_hash_set<std::string> ids(revoked->begin(), revoked->end());
  absl::MutexLock lock(&mu_);
  // An entry read after its revocation already says so; the others go.
  absl::erase_if(by_hash_, [&](const auto& item) {
    return !item.second.token.revoked_at.has_value() && ids.contains(item.second.token.id);
  });
  revocations_checked_at_ = now;
}

absl::StatusOr<Authenticator::Entry> Authenticator::Lookup(const std::string& hash, absl::Time now) {
  CheckRevocations(now);
  {
    absl::MutexLock lock(&mu_);
    auto it = by_hash_.find(hash);
    if (it != by_hash_.end() && now >= it->second.fetched_at) {
      const absl::Duration age = now - it->second.fetched_at;
      // Younger than cache_ttl: good whatever the checks say. Older: good while the revocation
      // checks are current (they would have dropped it) and it is younger than refresh_ttl.
      // (Each check reads from where the last successful one began, less the skew, so together
      // they cover every revocation since the oldest entry was read.)
      const bool checked = now >= revocations_checked_at_ && now - revocations_checked_at_ < options_.cache_ttl;
      if (age < options_.cache_ttl || (checked && age < options_.refresh_ttl)) return it->second;
    }
  }
  absl::StatusOr<TokenRecord> token = store_->FindToken(hash);
  if (absl::IsNotFound(token.status())) {
    return absl::UnauthenticatedError("unknown token: it was never issued here, or its pool's data was reset");
  }
  if (!token.ok()) return token.status();
  Entry entry{*std::move(token), std::nullopt, now, absl::InfinitePast()};
  if (!entry.token.team.empty()) {
    absl::StatusOr<Team> team = store_->GetTeam(entry.token.team);
    if (team.ok()) {
      entry.team = *std::move(team);
    } else if (!absl::IsNotFound(team.status())) {
      return team.status();
    }
  }
  absl::MutexLock lock(&mu_);
  if (by_hash_.size() >= options_.max_cached) {
    // Bounded: old entries go first; if every entry is fresh, start over (correct, just slower).
    absl::erase_if(by_hash_, [&](const auto& item) { return now - item.second.fetched_at >= options_.refresh_ttl; });
    if (by_hash_.size() >= options_.max_cached) by_hash_.clear();
  }
  // A refreshed entry keeps when its use was last written.
  if (auto old = by_hash_.find(hash); old != by_hash_.end()) entry.use_recorded_at = old->second.use_recorded_at;
  by_hash_.insert_or_assign(hash, entry);
  return entry;
}

absl::StatusOr<Caller> Authenticator::Authenticate(std::string_view token_text) {
  absl::StatusOr<Entry> entry = Check(token_text);
  if (!entry.ok()) return entry.status();
  return Caller::From(entry->token);
}

absl::StatusOr<Authenticator::Entry> Authenticator::Check(std::string_view token_text) {
  if (token_text.empty()) {
    return absl::UnauthenticatedError(
        "this server needs a token: pass --token, set MINIONS_TOKEN or MINIONS_TOKEN_FILE (see `minions admin`)");
  }
  absl::StatusOr<Role> claimed = token::Parse(token_text);
  if (!claimed.ok()) return absl::UnauthenticatedError(claimed.status().message());
  const absl::Time now = clock_->Now();
  const std::string hash = token::Hash(token_text);
  absl::StatusOr<Entry> entry = Lookup(hash, now);
  if (!entry.ok()) return entry.status();
  // The prefix is part of the hashed text, so a mismatch means a record edited behind our back.
  if (entry->token.role != *claimed) return absl::UnauthenticatedError("the token's kind does not match its record");
  if (absl::Status usable = CheckUsable(entry->token, now); !usable.ok()) return usable;
  if (now - entry->use_recorded_at >= options_.use_record_interval) {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = by_hash_.find(hash); it != by_hash_.end()) it->second.use_recorded_at = now;
    }
    NoteUse(entry->token.id, now);
  }
  FlushUses(now);
  return entry;
}

void Authenticator::NoteUse(const std::string& token_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (uses_due_.empty()) uses_due_since_ = now;
  uses_due_.push_back(token_id);
}

void Authenticator::FlushUses(absl::Time now) {
  std::vector<std::string> due;
  absl::Time used_at;
  {
    absl::MutexLock lock(&mu_);
    if (uses_due_.empty()) return;
    if (now >= uses_flushed_at_ && now - uses_flushed_at_ < options_.use_flush_interval) return;
    uses_flushed_at_ = now;
    due.swap(uses_due_);
    used_at = uses_due_since_;
  }
  absl::MutexLock flushing(&flush_mu_);  // one write at a time; the next batch waits for it
  // Each was used at or after the batch's first use: the time written never claims a use that
  // had not happened by then. Last use is bookkeeping: a store that cannot write it does not
  // refuse the caller.
  if (absl::Status recorded = store_->RecordTokenUse(due, used_at); !recorded.ok()) {
    MINIONS_LOG(Warning) << due.size() << " credentials' last use not recorded: " << recorded.message();
  }
}

absl::StatusOr<Caller> Authenticator::Authorize(std::string_view token_text, Scope scope) {
  absl::StatusOr<Entry> entry = Check(token_text);
  if (!entry.ok()) return entry.status();
  Caller caller = Caller::From(entry->token);
  if (!caller.Has(scope)) return absl::PermissionDeniedError(DescribeMissingScope(caller, scope));
  const int64_t per_second = entry->team ? entry->team->requests_per_second : 0;
  if (!caller.team.empty() && !limiter_.Admit(caller.team, per_second, clock_->Now())) {
    return absl::ResourceExhaustedError(absl::StrCat("team ", caller.team, " is over its rate limit of ", per_second,
                                                     " requests per second; retry in a moment (an admin raises it: `minions admin team set ",
                                                     caller.team, " --requests-per-second N`)"));
  }
  return caller;
}

void Authenticator::Forget(const std::string& token_id) {
  absl::MutexLock lock(&mu_);
  absl::erase_if(by_hash_, [&](const auto& item) { return item.second.token.id == token_id; });
}

void Authenticator::ForgetExecutor(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  absl::erase_if(by_hash_, [&](const auto& item) { return ExecutorIdOf(item.second.token) == executor_id; });
}

}  // namespace minions
