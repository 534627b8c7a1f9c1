#include "server/gang_leasing.h"

#include <openssl/rand.h>

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "model/placement.h"

namespace minions {
namespace {

std::string KeyOf(const std::string& job_id, int64_t index) { return absl::StrCat(job_id, "/", index); }

// 64 hex digits of the system's randomness: a gang attempt's secret (executor/gang_handshake.h).
std::string NewGangSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

std::string GangHost(const std::string& address) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port).ok()) return "";
  return host;
}

absl::StatusOr<GangLeasing::CheckInAnswer> GangLeasing::CheckIn(const std::string& executor_id, absl::Time now) {
  CheckInAnswer answer;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = leader_leases_.find(executor_id); it != leader_leases_.end()) {
      answer.leases = std::move(it->second);
      leader_leases_.erase(it);
      return answer;
    }
    if (duties_.contains(executor_id)) {
      answer.held = true;  // its duty is its answer
      return answer;
    }
  }
  // A reservation that completes is granted (Form: the gang seated in the store) before any other
  // check-in may begin the next: begun in between, it would see the new gang's executors as not
  // yet seated and its task as still pending, and reserve the same executors for the same task
  // again, to form the moment the leader next checks in (after its attempt ended, with a member
  // that may have left since).
  absl::MutexLock forming(&form_mu_);
  GangReserver::Answer reserved = reserver_.CheckIn(executor_id);
  if (reserved.verdict == GangReserver::Verdict::kFree && !reserver_.busy()) {
    MaybeBegin(now);
    reserved = reserver_.CheckIn(executor_id);
  }
  switch (reserved.verdict) {
    case GangReserver::Verdict::kFree:
      return answer;
    case GangReserver::Verdict::kHeld:
      answer.held = true;
      return answer;
    case GangReserver::Verdict::kFormed:
      break;
  }
  if (before_form_) before_form_();
  if (absl::Status formed = Form(reserved, now); !formed.ok()) {
    MINIONS_LOG(Info) << "gang for task " << reserved.request.key << " not formed: " << formed.message();
    return answer;
  }
  answer.formed = true;
  absl::MutexLock lock(&mu_);
  if (auto it = leader_leases_.find(executor_id); it != leader_leases_.end()) {
    answer.leases = std::move(it->second);
    leader_leases_.erase(it);
  } else {
    answer.held = duties_.contains(executor_id);
  }
  return answer;
}

void GangLeasing::Lost(const std::string& executor_id, absl::Time now) {
  reserver_.Withdraw(executor_id);
  absl::MutexLock lock(&mu_);
  lost_[executor_id] = now;
}

void GangLeasing::MaybeBegin(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (now < next_look_) return;
    next_look_ = now + options_.look_every;
  }
  absl::StatusOr<std::optional<GangTaskRef>> next = store_->NextGangTask(now);
  if (!next.ok() || !next->has_value()) return;
  const Job& job = (*next)->job;
  const int64_t index = (*next)->task_index;
  const std::string key = KeyOf(job.id, index);
  if (!reserver_.CanBegin(key)) return;
  absl::StatusOr<std::vector<Executor>> fleet = store_->ListExecutors();
  if (!fleet.ok()) return;
  absl::StatusOr<std::vector<GangLease>> gangs = store_->ListGangs();
  if (!gangs.ok()) return;
  // Executors serving a gang whose attempt still runs join no other.
  std::set<std::string> seated;
  for (const GangLease& gang : *gangs) {
    absl::StatusOr<Task> task = store_->GetTask(gang.job_id, gang.task_index);
    if (task.ok() && task->state == TaskState::kRunning && task->attempt == gang.attempt) {
      for (const GangSeat& seat : gang.members) seated.insert(seat.executor_id);
    }
  }
  absl::flat_hash_map<std::string, absl::Time> lost;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = lost_.begin(); it != lost_.end();) {
      if (now - it->second > options_.lease_ttl) {
        lost_.erase(it++);
      } else {
        ++it;
      }
    }
    lost = lost_;
  }
  std::vector<GangCandidate> candidates;
  for (const Executor& e : *fleet) {
    if (e.state != ExecutorState::kAvailable || e.drain_requested || e.info.gang_address.empty()) continue;
    if (seated.contains(e.id) || !OffersRunner(e.info, job.spec.requirements.runner)) continue;
    if (!MeetsConfinement(e.info, job.spec.requirements)) continue;  // every member runs its model
    if (now - e.last_heartbeat_at > options_.silent_after) continue;  // silent: maybe gone
    if (auto gone = lost.find(e.id); gone != lost.end() && e.last_heartbeat_at <= gone->second) continue;  // died
    candidates.push_back({e.id, UsableMemory(e.info), e.info.gang_address});
  }
  GangRequest request{key, job.spec.requirements.min_memory_bytes, job.spec.gang_size};
  absl::StatusOr<std::vector<GangCandidate>> chosen = ChooseGang(request, candidates);
  if (!chosen.ok()) return;  // not enough idle executors now: a later look tries again
  if (!reserver_.Begin(request, *chosen).ok()) return;
  std::string names;
  for (const GangCandidate& c : *chosen) absl::StrAppend(&names, names.empty() ? "" : ", ", c.executor_id);
  MINIONS_LOG(Info) << "job=" << job.id << " task=" << index << " reserving a gang of " << chosen->size() << ": "
                    << names;
  absl::MutexLock lock(&mu_);
  tasks_[key] = {job.id, index};
}

absl::Status GangLeasing::Form(const GangReserver::Answer& formed, absl::Time now) {
  std::pair<std::string, int64_t> task;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(formed.request.key);
    if (it == tasks_.end()) return absl::NotFoundError("the reservation's task is unknown here");
    task = it->second;
    tasks_.erase(it);
  }
  GangLease gang;
  gang.job_id = task.first;
  gang.task_index = task.second;
  for (const GangCandidate& member : formed.members) {
    gang.members.push_back({member.executor_id, member.gang_address, member.memory_bytes});
  }
  absl::StatusOr<Lease> lease = store_->LeaseToGang(gang, options_.lease_ttl, now);
  if (!lease.ok()) return lease.status();
  const AttemptRef ref{lease->task.job_id, lease->task.index, lease->task.attempt};
  const std::string leader_host = GangHost(gang.members.front().endpoint);
  // One secret per attempt, for the leader and each member alone; never stored: a later attempt
  // (a new gang) gets a new one, and a stale attempt's leader is refused by the new gates.
  lease->gang_secret = NewGangSecret();
  MINIONS_LOG(Info) << Describe(ref) << " leased to a gang of " << gang.members.size() << " led by executor="
                    << gang.leader();
  absl::MutexLock lock(&mu_);
  for (size_t i = 1; i < gang.members.size(); ++i) {
    duties_[gang.members[i].executor_id].push_back(
        GangDuty{ref, leader_host, gang.members[i].endpoint, lease->gang_secret});
  }
  leader_leases_[gang.leader()].push_back(*std::move(lease));
  return absl::OkStatus();
}

bool GangLeasing::HasDuties(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  return duties_.contains(executor_id);
}

std::vector<GangDuty> GangLeasing::TakeDuties(const std::string& executor_id) {
  absl::MutexLock lock(&mu_);
  auto it = duties_.find(executor_id);
  if (it == duties_.end()) return {};
  std::vector<GangDuty> duties = std::move(it->second);
  duties_.erase(it);
  return duties;
}

std::vector<AttemptRef> GangLeasing::EndedDuties(const std::string& executor_id,
                                                 const std::vector<AttemptRef>& duties) {
  std::vector<AttemptRef> ended;
  for (const AttemptRef& ref : duties) {
    absl::StatusOr<Task> task = store_->GetTask(ref.job_id, ref.task_index);
    if (task.ok() && task->state == TaskState::kRunning && task->attempt == ref.attempt) {
      absl::StatusOr<GangLease> gang = store_->GangOf(executor_id);
      if (gang.ok() && gang->job_id == ref.job_id && gang->task_index == ref.task_index &&
          gang->attempt == ref.attempt) {
        continue;  // still serving its gang
      }
    } else if (task.ok() || absl::IsNotFound(task.status())) {
      (void)store_->EndGang(ref.job_id, ref.task_index, ref.attempt);  // NotFound when ended already
    } else {
      continue;  // the store cannot say now: ask again next beat
    }
    ended.push_back(ref);
  }
  return ended;
}

}  // namespace minions
