#include "dashboard/status_endpoints.h"

#include "absl/strings/str_cat.h"
#include "http/metrics_endpoints.h"
#include "model/json_codec.h"

namespace minions {
namespace {

HttpResponse JsonResponse(const Json& body, int status = 200) {
  // Live data: never cached by the browser or a proxy.
  return {status, "application/json", DumpJson(body), {{"Cache-Control", "no-store"}}};
}

Json Seconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }
Json OptionalSeconds(const std::optional<absl::Time>& t) { return t ? Seconds(*t) : Json(nullptr); }

Json JobSummary(const Job& job, const ProgressEstimate& p) {
  return Json{{"id", job.id},
              {"team", job.spec.team},
              {"state", JobStateName(job.state)},
              {"model", job.spec.model},
              {"priority", job.spec.priority},
              {"records_total", job.counts.total},
              {"records_succeeded", job.counts.completed},
              {"records_failed", job.counts.failed},
              {"records_in_flight", p.in_flight},
              {"progress", p.fraction},
              {"records_per_second", p.records_per_second},
              {"eta_seconds", p.eta_seconds},
              {"tasks_total", job.n_tasks},
              {"tasks_done", job.tasks_done},
              {"tasks_succeeded", job.tasks_succeeded},
              {"error", job.error},
              {"created_at", Seconds(job.created_at)},
              {"started_at", OptionalSeconds(job.started_at)},
              {"finished_at", OptionalSeconds(job.finished_at)}};
}

template <typename Enum, typename Name>
Json CountsJson(const std::map<Enum, int64_t>& counts, Name name) {
  Json out = Json::object();
  for (const auto& [state, n] : counts) out[std::string(name(state))] = n;
  return out;
}

}  // namespace

Json FleetJson(const FleetSnapshot& s, absl::Time now) {
  Json executors = Json::array();
  for (const Executor& e : s.executors) {
    Json tasks = Json::array();
    if (auto it = s.running_by_executor.find(e.id); it != s.running_by_executor.end()) {
      for (const Task& t : it->second) {
        tasks.push_back({{"job", t.job_id}, {"index", t.index}, {"attempt", t.attempt},
                         {"records_done", t.records_done}, {"records", t.n_records}});
      }
    }
    executors.push_back({{"id", e.id},
                         {"name", e.info.name},
                         {"device", e.info.gpu.empty() ? e.info.chip : e.info.gpu},
                         {"gpu", !e.info.gpu.empty()},
                         {"os", e.info.os},
                         {"memory_bytes", e.info.memory_bytes},
                         {"state", ExecutorStateName(e.state)},
                         {"state_reason", e.state_reason},
                         // The owner is present exactly when the executor stepped aside for them.
                         {"owner", e.state == ExecutorState::kOwnerActive ? "present" : "away"},
                         {"drain_requested", e.drain_requested},
                         {"records_done", e.records_done},
                         {"last_heartbeat_age_seconds", absl::ToDoubleSeconds(now - e.last_heartbeat_at)},
                         {"tasks", std::move(tasks)}});
  }
  return Json{{"now", Seconds(now)},
              {"snapshot_at", Seconds(s.taken_at)},
              {"executors", std::move(executors)},
              {"jobs_by_state", CountsJson(s.jobs_by_state, JobStateName)},
              {"tasks_by_state", CountsJson(s.tasks_by_state, TaskStateName)},
              {"executors_by_state", CountsJson(s.executors_by_state, ExecutorStateName)}};
}

Json JobsJson(const FleetSnapshot& s, absl::Time now, int limit) {
  Json jobs = Json::array();
  for (const Job& job : s.jobs) {
    if (static_cast<int>(jobs.size()) >= limit) break;
    auto it = s.progress.find(job.id);
    jobs.push_back(JobSummary(job, it == s.progress.end() ? ProgressEstimate{} : it->second));
  }
  return Json{{"now", Seconds(now)}, {"jobs", std::move(jobs)}};
}

Json JobJson(const Job& job, const std::vector<Task>& tasks, const ProgressEstimate& progress, absl::Time now) {
  Json list = Json::array();
  Json errors = Json::array();
  for (const Task& t : tasks) {
    list.push_back({{"index", t.index},
                    {"state", TaskStateName(t.state)},
                    {"attempt", t.attempt},
                    {"executor", t.executor_id},
                    {"records", t.n_records},
                    {"records_done", t.records_done},
                    {"records_failed", t.records_failed},
                    {"failures", t.failures},
                    {"preemptions", t.preemptions},
                    {"started_at", OptionalSeconds(t.started_at)},
                    {"finished_at", OptionalSeconds(t.finished_at)},
                    {"last_error", t.last_error}});
    if (!t.last_error.empty()) {
      errors.push_back({{"task", t.index}, {"attempt", t.attempt}, {"state", TaskStateName(t.state)},
                        {"message", t.last_error}});
    }
  }
  return Json{{"now", Seconds(now)}, {"job", JobSummary(job, progress)}, {"tasks", std::move(list)},
              {"errors", std::move(errors)}};
}

void InstallStatusEndpoints(const StatusSources& src, HttpServer* http) {
  InstallMetricsEndpoints(src.registry, http);
  http->Handle("/readyz", [src](const HttpRequest&) {
    if (src.serving && !src.serving()) {
      return HttpResponse{503, "text/plain; charset=utf-8", "not serving: starting or shutting down\n", {}};
    }
    auto probe = src.store->ListJobs(JobFilter{std::nullopt, "", 1});
    if (!probe.ok()) {
      return HttpResponse{503, "text/plain; charset=utf-8",
                          absl::StrCat("the store cannot be read: ", probe.status().message(), "\n"), {}};
    }
    return HttpResponse{200, "text/plain; charset=utf-8", "ready\n", {}};
  });
  http->Handle("/api/fleet", [src](const HttpRequest&) {
    auto s = src.fleet->Get();
    if (!s.ok()) return JsonResponse({{"error", std::string(s.status().message())}}, 503);
    return JsonResponse(FleetJson(**s, src.clock->Now()));
  });
  http->Handle("/api/jobs", [src](const HttpRequest&) {
    auto s = src.fleet->Get();
    if (!s.ok()) return JsonResponse({{"error", std::string(s.status().message())}}, 503);
    return JsonResponse(JobsJson(**s, src.clock->Now(), 200));
  });
  http->Handle("/api/job", [src](const HttpRequest& request) {
    std::string id = request.Param("id");
    if (id.empty()) return JsonResponse({{"error", "say which job: /api/job?id=JOB_ID"}}, 400);
    auto job = src.store->GetJob(id);
    if (!job.ok()) {
      int status = absl::IsNotFound(job.status()) ? 404 : 503;
      return JsonResponse({{"error", std::string(job.status().message())}}, status);
    }
    auto tasks = src.store->ListTasks(id);
    if (!tasks.ok()) return JsonResponse({{"error", std::string(tasks.status().message())}}, 503);
    const absl::Time now = src.clock->Now();
    int64_t in_flight = 0;
    for (const Task& t : *tasks) {
      if (t.state == TaskState::kRunning) in_flight += t.records_done;
    }
    return JsonResponse(JobJson(*job, *tasks, src.progress->Observe(*job, in_flight, now), now));
  });
  for (const WebAsset& asset : WebAssets()) {
    auto serve = [&asset](const HttpRequest&) {
      return HttpResponse{200, asset.content_type, std::string(reinterpret_cast<const char*>(asset.data), asset.size),
                          {}};
    };
    http->Handle(asset.path, serve);
    if (std::string(asset.path) == "/index.html") http->Handle("/", serve);
  }
}

}  // namespace minions
