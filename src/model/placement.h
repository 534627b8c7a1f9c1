#pragma once
// Placement: which executors may run a job's tasks, and why a queued job waits. This is the one
// statement of the rules (docs/architecture.md "Placement"):
// - the executor's usable memory (UsableMemory) holds the job's requirements.min_memory_bytes;
// - it offers the job's runner (an executor that names none runs the default, "llama");
// - its runners are fully confined when the job (or its team) requires it (MeetsConfinement);
// - it takes the job's registry model without dropping another (it has it loaded, or cached with
//   no model loaded), or the job was submitted at least the warm-executor wait ago (delay
//   scheduling): an executor never unloads one model for another while an executor that has the
//   job's model loaded may come free in time, so a fleet running two models does not swap them
//   back and forth;
// - the job's team is not at its running-task quota (fair_share.h rank -1).
// Each store's lease query selects its candidates in SQL (an index over these rules, for speed)
// and grants a candidate only when PlaceOn says kFits; the server's submit-time check
// (FleetFit) and a job's wait reason (ExplainWait) ask the same functions, so what `minions
// status` says and what the lease does cannot disagree. Pure; any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/fair_share.h"
#include "model/types.h"

namespace minions {

// The runner of a job that names none, and of an executor that lists none.
inline constexpr char kDefaultRunnerName[] = "llama";

// The runners an executor runs: those it lists, or the default when it lists none.
std::vector<std::string> RunnersOf(const ExecutorInfo& info);
bool OffersRunner(const ExecutorInfo& info, const std::string& runner);
// Its runners are confined as the job asks (Requirements::confined: fully, kConfinementFull; an
// executor that says nothing counts as not confined).
bool MeetsConfinement(const ExecutorInfo& info, const Requirements& requirements);
// Its usable memory holds what one task of the job needs.
bool HoldsMemory(const ExecutorInfo& info, const Requirements& requirements);

// The most memory one executor may claim (docs/security.md, 40.1c): more than any one machine of
// a pool has. Memory decides where work goes and which executor leads a gang (the largest), so a
// claim of "10 TiB" must not win every placement.
inline constexpr int64_t kMaxClaimedMemoryBytes = int64_t{4} << 40;  // 4 TiB
// InvalidArgument when an executor's claimed memory is not what a machine can have: negative,
// above kMaxClaimedMemoryBytes, or usable memory above the machine's memory where they are the
// same memory (CPU, and Metal's unified memory). A discrete GPU's memory is its own (not bounded
// by the host's).
absl::Status CheckClaimedMemory(const ExecutorInfo& info);

// Bounds on the rest of what an executor says of itself (docs/security.md, 40.3): it is stored,
// shown to every team and used to place work, so it is checked, not taken as sent.
inline constexpr int kMaxClaimedTasks = 256;      // tasks at once (Capabilities.max_tasks)
inline constexpr size_t kMaxClaimedRunners = 32;  // runner names offered
inline constexpr size_t kMaxClaimedModels = 4096; // model digests (or paths) said to be cached
// InvalidArgument, saying what, unless: CheckClaimedMemory holds; max_tasks is 1 to
// kMaxClaimedTasks; the accelerator is 1-32 of [a-z0-9]; the runners are at most
// kMaxClaimedRunners valid runner names (model_ref.h) and, when `runner_allowlist` is not empty,
// each one of it (an executor claiming a team's runner name would be sent that team's work);
// the cached models at most kMaxClaimedModels of at most 4096 bytes each; os, chip, gpu and
// version at most 256 bytes and, like the models, without control characters.
absl::Status CheckClaimedCapabilities(const ExecutorInfo& info, const std::vector<std::string>& runner_allowlist);
// The models part of it, which heartbeats replace too (ModelHoldings): at most kMaxClaimedModels
// cached, each and the loaded one at most 4096 bytes without control characters.
absl::Status CheckClaimedModels(const std::vector<std::string>& cached, const std::string& loaded);

// How warm an executor is for a job's registry model (the lease order: loaded, cached, cold). A
// job without a registry model (a path) is kLoaded everywhere: it waits for no one.
enum class Warmth { kLoaded = 0, kCached = 1, kCold = 2 };
Warmth WarmthOf(const ExecutorInfo& info, const std::string& model_digest);
// Whether the executor may take the job's tasks within the warm-executor wait: it has the model
// loaded, or cached while it has no model loaded (a load that unloads nothing). One with another
// model loaded, or without the bytes, waits.
bool TakesWithoutWait(const ExecutorInfo& info, const std::string& model_digest);
// Whether a cold executor may take the job's tasks at `now` (submitted at least `warm_wait` ago).
bool PastWarmWait(const Job& job, absl::Time now, absl::Duration warm_wait);

// Whether `info` may run a task of `job` at `now` (the executor's own state aside: store_rules
// MayLease; the team's quota aside: fair share).
// kGang: a gang job's tasks are never leased to one executor alone (server/gang_leasing.h
// reserves whole gangs for them).
// kUnconfined: the job requires confined executors and this one is not (MeetsConfinement).
enum class Fit { kFits, kNoRunner, kUnconfined, kTooSmall, kColdTooEarly, kGang };
Fit PlaceOn(const ExecutorInfo& info, const Job& job, absl::Time now, absl::Duration warm_wait);

// Whether some executor of `fleet` (revoked ones aside) could ever run the job: kFits when one
// offers its runner with the memory, else kNoRunner (none offers the runner) or kTooSmall (some
// do, none with the memory; `largest_bytes` then says the most usable memory among them).
// An empty fleet fits (machines may enrol later).
Fit FleetFit(const std::vector<Executor>& fleet, const Requirements& requirements, int64_t* largest_bytes = nullptr);

// Gangs (docs/architecture.md, "Gangs"): whether `gang_size` executors of `fleet` that can join
// gangs (a gang address, the runner, not revoked) could together hold `requirements`
// (min_memory_bytes is the whole gang's need): kFits, kNoRunner, or kTooSmall with
// `total_bytes` the most those `gang_size` largest lend. An empty fleet fits.
Fit GangFleetFit(const std::vector<Executor>& fleet, const Requirements& requirements, int gang_size,
                 int64_t* total_bytes = nullptr);

// Why a job with pending tasks is not running them, worked out from the same rules.
enum class WaitCause {
  kNotWaiting,   // the job has no pending task (or has ended)
  kTeamQuota,    // its team runs its max_running_tasks already
  kNoExecutors,  // no executor has enrolled (revoked ones aside)
  kNoRunner,     // no executor offers the job's runner
  kUnconfined,   // the job requires confined executors and none offering its runner is confined
  kTooLarge,     // none offering the runner can hold the model (size + KV cache + margin)
  kAllBusy,      // executors can run it but none has a free slot (busy, owner present, draining, lost)
  kWarmWait,     // free executors are cold for its model: delay scheduling waits for a warm one
  kInLine,       // a free executor can run it: it is leased at that executor's next request, in
                 // the fleet's order (fair share, priority, age)
};
std::string_view WaitCauseName(WaitCause cause);  // "team_quota", "too_large", ...

struct WaitExplanation {
  WaitCause cause = WaitCause::kNotWaiting;
  std::string message;  // one sentence for people, with the figures ("" when not waiting)
};

// What ExplainWait reads about the fleet: each executor and how many tasks it runs now.
struct FleetMember {
  Executor executor;
  int64_t running_tasks = 0;
};

// Why `job` (with `pending_tasks` pending) waits at `now`. `teams` is the fair share's reading
// (MetadataStore::ListTeamUsage); `warm_wait` the store's delay-scheduling wait.
WaitExplanation ExplainWait(const Job& job, int64_t pending_tasks, const std::vector<FleetMember>& fleet,
                            const std::vector<TeamUsage>& teams, absl::Time now, absl::Duration warm_wait);

}  // namespace minions
