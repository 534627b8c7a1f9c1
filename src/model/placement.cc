#include "model/placement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/model_ref.h"

namespace minions {
namespace {

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

// Whether the executor could take one more task now: in service (not lost, draining, revoked or
// with its owner present), no drain asked for, and a slot of its max_tasks free.
bool HasFreeSlot(const FleetMember& member) {
  const Executor& e = member.executor;
  const bool in_service = e.state == ExecutorState::kAvailable || e.state == ExecutorState::kBusy;
  return in_service && !e.drain_requested && member.running_tasks < std::max(1, e.info.max_tasks);
}

}  // namespace

std::vector<std::string> RunnersOf(const ExecutorInfo& info) {
  std::vector<std::string> runners = info.runners;
  if (runners.empty()) runners.push_back(kDefaultRunnerName);
  return runners;
}

bool OffersRunner(const ExecutorInfo& info, const std::string& runner) {
  const std::vector<std::string> runners = RunnersOf(info);
  return std::find(runners.begin(), runners.end(), runner) != runners.end();
}

bool MeetsConfinement(const ExecutorInfo& info, const Requirements& requirements) {
  return !requirements.confined || info.confinement == kConfinementFull;
}

absl::Status CheckClaimedMemory(const ExecutorInfo& info) {
  if (info.memory_bytes < 0 || info.usable_memory_bytes < 0) {
    return absl::InvalidArgumentError("an executor's memory cannot be negative");
  }
  if (info.memory_bytes > kMaxClaimedMemoryBytes || info.usable_memory_bytes > kMaxClaimedMemoryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an executor may claim at most ", kMaxClaimedMemoryBytes >> 40,
                                                   " TiB of memory (it claimed ",
                                                   std::max(info.memory_bytes, info.usable_memory_bytes), " bytes)"));
  }
  const bool shared = info.accelerator == kAcceleratorCpu || info.accelerator == kAcceleratorMetal;
  if (shared && info.memory_bytes > 0 && info.usable_memory_bytes > info.memory_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("usable memory (", info.usable_memory_bytes,
                                                   " bytes) above the machine's memory (", info.memory_bytes,
                                                   " bytes) on a ", info.accelerator, " executor"));
  }
  return absl::OkStatus();
}

namespace {

// Printed on terminals and in logs: no C0 controls or DEL.
bool PlainText(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) return false;
  return std::none_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

}  // namespace

absl::Status CheckClaimedModels(const std::vector<std::string>& cached, const std::string& loaded) {
  if (cached.size() > kMaxClaimedModels) {
    return absl::InvalidArgumentError(absl::StrCat("an executor lists at most ", kMaxClaimedModels, " cached models"));
  }
  for (const std::string& model : cached) {
    if (model.empty() || !PlainText(model, 4096)) {
      return absl::InvalidArgumentError("a cached model is 1-4096 bytes without control characters");
    }
  }
  if (!PlainText(loaded, 4096)) {
    return absl::InvalidArgumentError("the loaded model is at most 4096 bytes without control characters");
  }
  return absl::OkStatus();
}

absl::Status CheckClaimedCapabilities(const ExecutorInfo& info, const std::vector<std::string>& runner_allowlist) {
  if (absl::Status memory = CheckClaimedMemory(info); !memory.ok()) return memory;
  if (info.max_tasks < 1 || info.max_tasks > kMaxClaimedTasks) {
    return absl::InvalidArgumentError(absl::StrCat("an executor runs 1 to ", kMaxClaimedTasks,
                                                   " tasks at once (it claimed ", info.max_tasks, ")"));
  }
  const bool accelerator_ok =
      !info.accelerator.empty() && info.accelerator.size() <= 32 &&
      std::all_of(info.accelerator.begin(), info.accelerator.end(),
                  [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
  if (!accelerator_ok) {
    return absl::InvalidArgumentError("an executor's accelerator is 1-32 of a-z and 0-9 (cpu, metal, cuda, ...)");
  }
  if (info.runners.size() > kMaxClaimedRunners) {
    return absl::InvalidArgumentError(absl::StrCat("an executor offers at most ", kMaxClaimedRunners, " runners"));
  }
  for (const std::string& runner : info.runners) {
    if (absl::Status valid = ValidateRunnerName(runner); !valid.ok()) return valid;
    if (!runner_allowlist.empty() &&
        std::find(runner_allowlist.begin(), runner_allowlist.end(), runner) == runner_allowlist.end()) {
      return absl::InvalidArgumentError(absl::StrCat("runner '", runner, "' is not one this pool allows (",
                                                     absl::StrJoin(runner_allowlist, ", "),
                                                     "; an admin sets server.runner_allowlist)"));
    }
  }
  if (absl::Status models = CheckClaimedModels(info.models, info.model_loaded); !models.ok()) return models;
  for (const std::string* field : {&info.os, &info.chip, &info.gpu, &info.version}) {
    if (!PlainText(*field, 256)) {
      return absl::InvalidArgumentError(
          "an executor's os, chip, gpu and version are at most 256 bytes without control characters");
    }
  }
  return absl::OkStatus();
}

bool HoldsMemory(const ExecutorInfo& info, const Requirements& requirements) {
  return requirements.min_memory_bytes <= UsableMemory(info);
}

Warmth WarmthOf(const ExecutorInfo& info, const std::string& model_digest) {
  if (model_digest.empty() || model_digest == info.model_loaded) return Warmth::kLoaded;
  if (std::find(info.models.begin(), info.models.end(), model_digest) != info.models.end()) return Warmth::kCached;
  return Warmth::kCold;
}

bool TakesWithoutWait(const ExecutorInfo& info, const std::string& model_digest) {
  switch (WarmthOf(info, model_digest)) {
    case Warmth::kLoaded: return true;
    case Warmth::kCached: return info.model_loaded.empty();
    case Warmth::kCold: return false;
  }
  return false;
}

bool PastWarmWait(const Job& job, absl::Time now, absl::Duration warm_wait) {
  return job.created_at <= now - warm_wait;
}

Fit PlaceOn(const ExecutorInfo& info, const Job& job, absl::Time now, absl::Duration warm_wait) {
  if (job.spec.gang_size >= 2) return Fit::kGang;
  if (!OffersRunner(info, job.spec.requirements.runner)) return Fit::kNoRunner;
  if (!MeetsConfinement(info, job.spec.requirements)) return Fit::kUnconfined;
  if (!HoldsMemory(info, job.spec.requirements)) return Fit::kTooSmall;
  if (!TakesWithoutWait(info, job.spec.model_digest) && !PastWarmWait(job, now, warm_wait)) {
    return Fit::kColdTooEarly;
  }
  return Fit::kFits;
}

Fit FleetFit(const std::vector<Executor>& fleet, const Requirements& requirements, int64_t* largest_bytes) {
  int64_t largest = 0;
  bool any = false, runner_offered = false;
  for (const Executor& e : fleet) {
    if (e.state == ExecutorState::kRevoked) continue;
    any = true;
    if (!OffersRunner(e.info, requirements.runner)) continue;
    runner_offered = true;
    if (HoldsMemory(e.info, requirements)) return Fit::kFits;
    largest = std::max(largest, UsableMemory(e.info));
  }
  if (largest_bytes != nullptr) *largest_bytes = largest;
  if (!any) return Fit::kFits;
  return runner_offered ? Fit::kTooSmall : Fit::kNoRunner;
}

Fit GangFleetFit(const std::vector<Executor>& fleet, const Requirements& requirements, int gang_size,
                 int64_t* total_bytes) {
  std::vector<int64_t> lends;
  bool any = false;
  for (const Executor& e : fleet) {
    if (e.state == ExecutorState::kRevoked) continue;
    any = true;
    if (e.info.gang_address.empty() || !OffersRunner(e.info, requirements.runner)) continue;
    lends.push_back(UsableMemory(e.info));
  }
  if (!any) return Fit::kFits;
  if (lends.empty()) return Fit::kNoRunner;
  std::sort(lends.rbegin(), lends.rend());
  int64_t total = 0;
  for (size_t i = 0; i < lends.size() && i < static_cast<size_t>(std::max(gang_size, 0)); ++i) total += lends[i];
  if (total_bytes != nullptr) *total_bytes = total;
  return static_cast<int>(lends.size()) >= gang_size && total >= requirements.min_memory_bytes ? Fit::kFits
                                                                                               : Fit::kTooSmall;
}

std::string_view WaitCauseName(WaitCause cause) {
  switch (cause) {
    case WaitCause::kNotWaiting: return "";
    case WaitCause::kTeamQuota: return "team_quota";
    case WaitCause::kNoExecutors: return "no_executors";
    case WaitCause::kNoRunner: return "no_runner";
    case WaitCause::kUnconfined: return "unconfined";
    case WaitCause::kTooLarge: return "too_large";
    case WaitCause::kAllBusy: return "all_busy";
    case WaitCause::kWarmWait: return "warm_wait";
    case WaitCause::kInLine: return "in_line";
  }
  return "";
}

WaitExplanation ExplainWait(const Job& job, int64_t pending_tasks, const std::vector<FleetMember>& fleet,
                            const std::vector<TeamUsage>& teams, absl::Time now, absl::Duration warm_wait) {
  if (pending_tasks <= 0 || (job.state != JobState::kQueued && job.state != JobState::kRunning)) return {};
  const JobSpec& spec = job.spec;
  const std::map<std::string, int> ranks = FairShareRanks(teams);
  if (auto rank = ranks.find(spec.team); rank != ranks.end() && rank->second < 0) {
    int64_t quota = 0;
    for (const TeamUsage& t : teams) {
      if (t.team == spec.team) quota = t.max_running_tasks;
    }
    return {WaitCause::kTeamQuota, absl::StrCat("team ", spec.team, " runs its quota of ", quota,
                                                " tasks at once; its tasks wait until one of them ends")};
  }

  std::vector<Executor> executors;
  for (const FleetMember& m : fleet) executors.push_back(m.executor);
  int64_t largest = 0;
  if (spec.gang_size >= 2) {
    // A gang job waits for a whole gang (server/gang_leasing.h), not for one free executor.
    int64_t total = 0;
    if (GangFleetFit(executors, spec.requirements, spec.gang_size, &total) != Fit::kFits) {
      return {WaitCause::kTooLarge,
              absl::StrCat("no gang of ", spec.gang_size, " executors (with a [gang] address) can hold the model: it needs ",
                           GiB(spec.requirements.min_memory_bytes), " and the ", spec.gang_size,
                           " largest lend ", GiB(total))};
    }
    return {WaitCause::kInLine, absl::StrCat("waiting for a gang of ", spec.gang_size,
                                             " free executors, reserved all at once")};
  }
  switch (FleetFit(executors, spec.requirements, &largest)) {
    case Fit::kNoRunner:
      return {WaitCause::kNoRunner, absl::StrCat("no executor offers the runner '", spec.requirements.runner,
                                                 "' (an executor declares it in its config's [runners])")};
    case Fit::kTooSmall:
      return {WaitCause::kTooLarge,
              absl::StrCat("no executor can hold the model: a task needs ", GiB(spec.requirements.min_memory_bytes),
                           " (model, KV cache and margin) and the most usable memory of an executor offering "
                           "runner '",
                           spec.requirements.runner, "' is ", GiB(largest))};
    default:
      break;
  }
  if (spec.requirements.confined &&
      std::none_of(executors.begin(), executors.end(), [&](const Executor& e) {
        return e.state != ExecutorState::kRevoked && OffersRunner(e.info, spec.requirements.runner) &&
               MeetsConfinement(e.info, spec.requirements);
      })) {
    return {WaitCause::kUnconfined,
            absl::StrCat("the job requires confined executors (its submitter or its team asked for them) and no "
                         "executor offering runner '",
                         spec.requirements.runner, "' is fully confined (Landlock and seccomp: `minions executors`)")};
  }
  int able = 0, ready = 0, ready_idle = 0, warm_busy = 0;
  for (const FleetMember& m : fleet) {
    const ExecutorInfo& info = m.executor.info;
    if (m.executor.state == ExecutorState::kRevoked || m.executor.state == ExecutorState::kQuarantined ||
        m.executor.state == ExecutorState::kPending) {
      continue;
    }
    if (!OffersRunner(info, spec.requirements.runner) || !MeetsConfinement(info, spec.requirements) ||
        !HoldsMemory(info, spec.requirements)) {
      continue;
    }
    ++able;
    const bool warm = TakesWithoutWait(info, spec.model_digest);
    if (!HasFreeSlot(m)) {
      if (warm) ++warm_busy;
      continue;
    }
    if (PlaceOn(info, job, now, warm_wait) == Fit::kFits) {
      ++ready;
      ready_idle += m.running_tasks == 0;
    }
  }
  if (able == 0) {
    return {WaitCause::kNoExecutors,
            "no executor has enrolled yet (an admin issues a join token: minions admin join-token -o join.txt; then on "
            "a machine: minions executor --server ADDRESS --join-token-file join.txt)"};
  }
  if (ready_idle > 0) {
    return {WaitCause::kInLine,
            absl::StrCat(ready_idle, " free executor", ready_idle == 1 ? "" : "s",
                         " can run it: its tasks are leased at their next request, in the fleet's order "
                         "(fair share, priority, age)")};
  }
  if (ready > 0) {
    // Room for more, but working: each asks for its next task as the work it holds runs low (an
    // executor holds about a task beyond the one it runs), so these tasks wait for that, not for
    // a free executor the executors' list would contradict.
    return {WaitCause::kInLine,
            absl::StrCat(ready, " executor", ready == 1 ? "" : "s", " that can run it ", ready == 1 ? "is" : "are",
                         " busy and take", ready == 1 ? "s" : "",
                         " its next tasks as the work ", ready == 1 ? "it holds runs" : "they hold run",
                         " low, in the fleet's order (fair share, priority, age)")};
  }
  // No free executor may take it now. Free ones exist that are only too early (cold, within the
  // warm-executor wait)?
  int cold_free = 0;
  for (const FleetMember& m : fleet) {
    if (m.executor.state == ExecutorState::kRevoked || m.executor.state == ExecutorState::kQuarantined ||
        m.executor.state == ExecutorState::kPending || !HasFreeSlot(m)) {
      continue;
    }
    if (PlaceOn(m.executor.info, job, now, warm_wait) == Fit::kColdTooEarly) ++cold_free;
  }
  if (cold_free > 0) {
    return {WaitCause::kWarmWait,
            absl::StrCat("waiting for an executor warm for model ", spec.model,
                         " (one that has it loaded, or cached with no other model loaded)",
                         warm_busy == 0 ? "; none is yet"
                                        : absl::StrCat("; ", warm_busy, warm_busy == 1 ? " is, busy" : " are, busy"),
                         "; a cold one may take it from ", absl::FormatTime(absl::RFC3339_sec, job.created_at + warm_wait, absl::UTCTimeZone()),
                         " (the warm-executor wait)")};
  }
  return {WaitCause::kAllBusy, absl::StrCat("all ", able, " executor", able == 1 ? "" : "s",
                                            " that can run it are busy (or their owners are present)")};
}

}  // namespace minions
