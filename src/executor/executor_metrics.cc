#include "executor/executor_metrics.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "http/metrics_endpoints.h"

namespace minions {
namespace {

constexpr ExecutorState kStates[] = {ExecutorState::kAvailable, ExecutorState::kBusy, ExecutorState::kOwnerActive,
                                     ExecutorState::kDraining};

}  // namespace

absl::StatusOr<int64_t> ResidentBytes(pid_t pid) {
  if (pid <= 0) return absl::NotFoundError("no process");
  // statm: size resident shared ... in pages.
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return absl::NotFoundError(absl::StrCat("no /proc/", pid, "/statm"));
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

ExecutorMetrics::ExecutorMetrics() {
  state_ = registry_.AddGaugeFamily(
      "minions_executor_state", "1 for the state this executor is in (available, busy, owner_active, draining), 0 for the others.",
      {"state"});
  for (ExecutorState s : kStates) state_->With({std::string(ExecutorStateName(s))})->Set(s == ExecutorState::kAvailable);
  yield_seconds_ = registry_.AddHistogram(
      "minions_executor_yield_seconds", "Owner came back -> the runner stopped using the machine.",
      {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  tasks_completed_ = registry_.AddCounter("minions_executor_tasks_completed_total",
                                          "Tasks this executor finished and the server accepted.");
  registry_.AddCollector([this](std::vector<metrics::FamilySnapshot>* out) { Collect(out); });
}

ExecutorMetrics::~ExecutorMetrics() {
  if (http_) http_->Stop();
}

void ExecutorMetrics::SetState(ExecutorState state, const std::string& reason) {
  for (ExecutorState s : kStates) state_->With({std::string(ExecutorStateName(s))})->Set(s == state);
}

void ExecutorMetrics::ObserveYieldSeconds(double seconds) { yield_seconds_->Observe(seconds); }

void ExecutorMetrics::Collect(std::vector<metrics::FamilySnapshot>* out) {
  metrics::FamilySnapshot memory{"minions_executor_runner_memory_bytes",
                                 "Resident memory of the runner process (absent while no runner runs).",
                                 metrics::MetricType::kGauge, {}};
  auto rss = ResidentBytes(runner_pid_.load());
  if (rss.ok()) memory.samples.push_back({memory.name, {}, static_cast<double>(*rss)});
  out->push_back(std::move(memory));
}

absl::Status ExecutorMetrics::Serve(const std::string& listen) {
  http_ = std::make_unique<HttpServer>(2);
  InstallMetricsEndpoints(&registry_, http_.get());
  absl::Status s = http_->Start(listen);
  if (!s.ok()) http_.reset();
  return s;
}

}  // namespace minions
