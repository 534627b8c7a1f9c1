#include "server/gang_reservation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace minions {

absl::StatusOr<std::vector<GangCandidate>> ChooseGang(const GangRequest& request,
                                                      std::vector<GangCandidate> candidates) {
  if (request.members < 0 || request.members == 1 || request.bytes < 0) {
    return absl::InvalidArgumentError("a gang has at least two executors and needs a non-negative size");
  }
  std::erase_if(candidates, [](const GangCandidate& c) { return c.gang_address.empty() || c.memory_bytes <= 0; });
  std::sort(candidates.begin(), candidates.end(), [](const GangCandidate& a, const GangCandidate& b) {
    return a.memory_bytes != b.memory_bytes ? a.memory_bytes > b.memory_bytes : a.executor_id < b.executor_id;
  });
  std::vector<GangCandidate> gang;
  int64_t total = 0;
  for (GangCandidate& candidate : candidates) {
    // Largest first: the fewest that cover the need (any smaller set has less memory).
    const bool enough = request.members > 0 ? static_cast<int>(gang.size()) >= request.members
                                            : gang.size() >= 2 && total >= request.bytes;
    if (enough) break;
    total += candidate.memory_bytes;
    gang.push_back(std::move(candidate));
  }
  const bool covered = total >= request.bytes && gang.size() >= 2 &&
                       (request.members == 0 || static_cast<int>(gang.size()) == request.members);
  if (!covered) {
    return absl::NotFoundError(absl::StrCat("no gang of the idle executors covers ", request.bytes, " bytes",
                                            request.members > 0 ? absl::StrCat(" with ", request.members, " members")
                                                                : std::string(),
                                            " (", candidates.size(), " candidates with a gang network)"));
  }
  return gang;
}

absl::Status GangReserver::Begin(const GangRequest& request, std::vector<GangCandidate> members) {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  if (current_) {
    return absl::FailedPreconditionError(
        absl::StrCat("gang ", current_->request.key, " is being reserved; one reservation at a time"));
  }
  if (auto it = backoff_until_.find(request.key); it != backoff_until_.end() && clock_->Now() < it->second) {
    return absl::FailedPreconditionError(absl::StrCat("gang ", request.key, " timed out recently; it waits"));
  }
  if (members.size() < 2) return absl::InvalidArgumentError("a gang has at least two executors");
  current_ = Reservation{request, std::move(members), {}, clock_->Now() + timeout_};
  return absl::OkStatus();
}

GangReserver::Answer GangReserver::CheckIn(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  Answer answer;
  if (!current_) return answer;
  auto& members = current_->members;
  if (std::none_of(members.begin(), members.end(),
                   [&](const GangCandidate& m) { return m.executor_id == executor_id; })) {
    return answer;  // not named: single-machine work as usual
  }
  current_->checked_in.insert(executor_id);
  answer.request = current_->request;
  if (current_->checked_in.size() < members.size()) {
    answer.verdict = Verdict::kHeld;
    return answer;
  }
  answer.verdict = Verdict::kFormed;
  answer.members = std::move(members);
  backoff_until_.erase(current_->request.key);
  current_.reset();
  return answer;
}

void GangReserver::Withdraw(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  if (!current_) return;
  for (const GangCandidate& m : current_->members) {
    if (m.executor_id == executor_id) {
      ReleaseLocked();
      return;
    }
  }
}

bool GangReserver::busy() {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  return current_.has_value();
}

bool GangReserver::CanBegin(const std::string& key) {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  if (current_) return false;
  auto it = backoff_until_.find(key);
  return it == backoff_until_.end() || clock_->Now() >= it->second;
}

int64_t GangReserver::released() {
  absl::MutexLock lock(&mu_);
  return released_;
}

void GangReserver::ExpireLocked() {
  if (current_ && clock_->Now() >= current_->deadline) ReleaseLocked();
}

void GangReserver::ReleaseLocked() {
  // The gang backs off for one timeout, so that another gang (or single work) gets its turn.
  const absl::Time now = clock_->Now();
  absl::erase_if(backoff_until_, [now](const auto& entry) { return entry.second <= now; });
  backoff_until_[current_->request.key] = now + timeout_;
  current_.reset();
  ++released_;
}

}  // namespace minions
