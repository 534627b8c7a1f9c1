#include "dashboard/status_endpoints.h"

#include <any>
#include <functional>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"
#include "http/metrics_endpoints.h"
#include "model/json_codec.h"
#include "model/model_ref.h"
#include "runner/batch_record.h"

namespace minions {
namespace {

constexpr char kPlain[] = "text/plain; charset=utf-8";
constexpr int64_t kMaxErrorsShown = 100;
constexpr int kMaxRecordErrorsShown = 20;

HttpResponse JsonResponse(const Json& body, int status = 200) {
  // Live data: never cached by the browser or a proxy.
  return {status, "application/json", DumpJson(body), {{"Cache-Control", "no-store"}}};
}

Json Seconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }
Json OptionalSeconds(const std::optional<absl::Time>& t) { return t ? Seconds(*t) : Json(nullptr); }

std::string HtmlEscape(const std::string& text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&#39;"}});
}

// A refused credential, as HTTP says it.
HttpResponse Refusal(const absl::Status& status) {
  int code = 503;
  if (absl::IsUnauthenticated(status)) code = 401;
  if (absl::IsPermissionDenied(status)) code = 403;
  if (absl::IsResourceExhausted(status)) code = 429;
  HttpResponse response = JsonResponse({{"error", std::string(status.message())}, {"login", "/login"}}, code);
  if (code == 401) response.headers["WWW-Authenticate"] = "Bearer realm=\"minions\"";
  return response;
}

Json JobSummary(const Job& job, const ProgressEstimate& p) {
  return Json{{"id", job.id},
              {"team", job.spec.team},
              {"owner", job.spec.owner},
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
  for (const auto& [state, n] : counts) {
    if (n != 0) out[std::string(name(state))] = out.value(std::string(name(state)), int64_t{0}) + n;
  }
  return out;
}

Json PageJson(int64_t total, Page page) {
  const int64_t next = page.offset + page.limit;
  return Json{{"total", total}, {"offset", page.offset}, {"limit", page.limit},
              {"next_offset", next < total ? Json(next) : Json(nullptr)}};
}

// The job page's actions: POST /api/job/cancel and GET /api/results (status_endpoints.h).
void InstallJobActions(const StatusSources& src, std::shared_ptr<DashboardSessions> sessions, HttpServer* http);
// The caller of a request that must hold a scope, or the refusal to send.
using Authorize = std::function<absl::StatusOr<Caller>(const HttpRequest&, Scope)>;
void InstallPages(const StatusSources& src, std::shared_ptr<DashboardSessions> sessions, const Authorize& authorize,
                  HttpServer* http);

}  // namespace

std::string RequestBearer(const HttpRequest& request) {
  const std::string authorization = request.Header("authorization");
  return absl::StartsWith(authorization, "Bearer ") ? authorization.substr(7) : "";
}

std::string RequestToken(const HttpRequest& request, DashboardSessions& sessions, absl::Time now) {
  if (std::string bearer = RequestBearer(request); !bearer.empty()) return bearer;
  const std::string session = request.Cookie(kSessionCookie);
  return session.empty() ? "" : sessions.TokenOf(session, now);
}

bool FromOwnPage(const HttpRequest& request) {
  const std::string origin = request.Header("origin");
  return origin != "null" && (origin.empty() || absl::EndsWith(origin, "://" + request.Header("host")));
}

Page PageOf(const HttpRequest& request, int64_t default_limit, int64_t max_limit) {
  Page page;
  page.limit = default_limit;
  int64_t value = 0;
  if (absl::SimpleAtoi(request.Param("offset"), &value) && value >= 0) page.offset = value;
  if (absl::SimpleAtoi(request.Param("limit"), &value) && value > 0) page.limit = std::min(value, max_limit);
  return page;
}

Json FleetJson(const FleetSnapshot& s, absl::Time now, const Caller& caller) {
  // The team of every job with a running task: the snapshot holds every unfinished job.
  std::map<std::string, std::string> team_of;
  for (const Job& job : s.jobs) team_of[job.id] = job.spec.team;
  // Cached models by the names the viewer's team gives them (admins: every team's).
  std::vector<ModelRecord> visible_models;
  for (const ModelRecord& m : s.models) {
    if (caller.SeesTeam(m.team)) visible_models.push_back(m);
  }
  const std::map<std::string, std::string> model_names = ModelNamesByDigest(visible_models);
  Json executors = Json::array();
  for (const Executor& e : s.executors) {
    Json tasks = Json::array();
    if (auto it = s.running_by_executor.find(e.id); it != s.running_by_executor.end()) {
      for (const Task& t : it->second) {
        auto team = team_of.find(t.job_id);
        if (!caller.IsAdmin() && (team == team_of.end() || !caller.SeesTeam(team->second))) continue;
        tasks.push_back({{"job", t.job_id}, {"index", t.index}, {"attempt", t.attempt},
                         {"records_done", t.records_done}, {"records", t.n_records}});
      }
    }
    // Another team's models and the second it beat are its own business (docs/security.md, 40.7f).
    const VisibleModels models_seen = ModelsVisibleTo(caller.IsAdmin(), !tasks.empty(), e.info, model_names);
    Json models_shown = Json::array();
    for (const std::string& digest : models_seen.cached) models_shown.push_back(ShownModel(digest, model_names));
    // The gang it sits in and its leader (a gang of another team's job: not shown).
    Json gang = nullptr;
    if (auto g = s.gang_of.find(e.id); g != s.gang_of.end()) {
      auto team = team_of.find(g->second.job_id);
      if (caller.IsAdmin() || (team != team_of.end() && caller.SeesTeam(team->second))) {
        std::string leader_name;
        for (const Executor& other : s.executors) {
          if (other.id == g->second.leader()) leader_name = other.info.name;
        }
        gang = {{"job", g->second.job_id}, {"index", g->second.task_index}, {"attempt", g->second.attempt},
                {"leader", g->second.leader()}, {"leader_name", leader_name}, {"size", g->second.members.size()},
                {"leads", g->second.leader() == e.id}};
      }
    }
    executors.push_back({{"id", e.id},
                         {"name", e.info.name},
                         {"device", e.info.gpu.empty() ? e.info.chip : e.info.gpu},
                         {"gpu", !e.info.gpu.empty()},
                         {"os", e.info.os},
                         {"memory_bytes", e.info.memory_bytes},
                         {"accelerator", e.info.accelerator},
                         {"usable_memory_bytes", UsableMemory(e.info)},
                         {"runners", e.info.runners},
                         {"models_cached", models_seen.cached},
                         {"model_loaded", models_seen.loaded},
                         {"models_shown", std::move(models_shown)},
                         {"model_loaded_shown", models_seen.loaded_hidden
                                                    ? std::string(kAnotherTeamsModel)
                                                    : ShownModel(models_seen.loaded, model_names)},
                         // Coarse: an owner's presence is "unavailable", and never explained.
                         {"state", ExecutorStateShown(e.state)},
                         {"state_reason", e.state == ExecutorState::kOwnerActive ? "" : e.state_reason},
                         {"drain_requested", e.drain_requested},
                         {"records_done", e.records_done},
                         {"last_heartbeat_age_seconds", absl::ToDoubleSeconds(now - HeartbeatShown(caller.IsAdmin(), e.last_heartbeat_at))},
                         {"tasks", std::move(tasks)},
                         {"gang", std::move(gang)}});
  }
  Json executors_by_state = Json::object();
  for (const auto& [state, n] : s.executors_by_state) {
    std::string name(ExecutorStateShown(state));
    if (n != 0) executors_by_state[name] = executors_by_state.value(name, int64_t{0}) + n;
  }
  Json jobs_by_state, tasks_by_state;
  if (caller.IsAdmin()) {
    jobs_by_state = CountsJson(s.jobs_by_state, JobStateName);
    tasks_by_state = CountsJson(s.tasks_by_state, TaskStateName);
  } else {
    // A team sees counts of its own jobs only (those the snapshot lists).
    std::map<JobState, int64_t> jobs;
    std::map<TaskState, int64_t> tasks;
    for (const Job& job : s.jobs) {
      if (!caller.SeesTeam(job.spec.team)) continue;
      ++jobs[job.state];
      if (auto it = s.job_tasks.find(job.id); it != s.job_tasks.end()) {
        for (const auto& [state, n] : it->second) tasks[state] += n;
      }
    }
    jobs_by_state = CountsJson(jobs, JobStateName);
    tasks_by_state = CountsJson(tasks, TaskStateName);
  }
  return Json{{"now", Seconds(now)},
              {"snapshot_at", Seconds(s.taken_at)},
              {"viewer", {{"role", RoleName(caller.role)}, {"team", caller.team}, {"principal", caller.principal}}},
              {"executors", std::move(executors)},
              {"jobs_by_state", std::move(jobs_by_state)},
              {"tasks_by_state", std::move(tasks_by_state)},
              {"executors_by_state", std::move(executors_by_state)}};
}

Json JobsJson(const FleetSnapshot& s, absl::Time now, const Caller& caller, Page page) {
  Json jobs = Json::array();
  int64_t seen = 0;
  for (const Job& job : s.jobs) {
    if (!caller.SeesTeam(job.spec.team)) continue;
    if (seen++ < page.offset || static_cast<int64_t>(jobs.size()) >= page.limit) continue;
    auto it = s.progress.find(job.id);
    jobs.push_back(JobSummary(job, it == s.progress.end() ? ProgressEstimate{} : it->second));
  }
  Json out = PageJson(seen, page);
  out["now"] = Seconds(now);
  out["jobs"] = std::move(jobs);
  return out;
}

absl::StatusOr<Json> FirstRecordErrors(BlobStore* blobs, const Job& job, int limit) {
  Json out = Json::array();
  if (blobs == nullptr || job.errors_key.empty() || job.counts.failed == 0) return out;
  constexpr int64_t kMaxBytes = 256 << 10;
  auto head = blobs->GetRange(job.errors_key, 0, kMaxBytes);
  if (!head.ok()) return head.status();
  size_t start = 0;
  while (static_cast<int>(out.size()) < limit) {
    size_t end = head->find('\n', start);
    if (end == std::string::npos) break;  // the rest is a line cut by the range
    auto line = ParseJson(std::string_view(*head).substr(start, end - start));
    start = end + 1;
    if (!line.ok()) continue;
    Json error = OutputLineError(*line);
    if (error.is_null()) continue;
    const Json& id = JsonField(*line, "custom_id");
    out.push_back({{"custom_id", id.is_string() ? id : Json("")},
                   {"code", JsonString(error, "code")},
                   {"message", JsonString(error, "message")}});
  }
  return out;
}

Json JobActions(const Job& job, const Caller& caller, bool downloads) {
  const bool has_results =
      downloads && (job.state == JobState::kCompleted || job.state == JobState::kExpired || job.state == JobState::kCancelled);
  const std::string& id = job.id;  // made by the server: letters, digits and '-'
  return Json{{"cancel", caller.Has(Scope::kJobsWrite) && caller.SeesTeam(job.spec.team) && !IsTerminal(job.state)},
              {"results", has_results ? Json(absl::StrCat("/api/results?id=", id)) : Json(nullptr)},
              {"errors", has_results ? Json(absl::StrCat("/api/results?id=", id, "&file=errors")) : Json(nullptr)}};
}

Json JobJson(const Job& job, const std::vector<Task>& tasks, const ProgressEstimate& progress, absl::Time now,
             Page tasks_page, const Json& record_errors, const Json& actions) {
  Json list = Json::array();
  Json errors = Json::array();
  for (const Task& t : tasks) {
    if (t.index >= tasks_page.offset && static_cast<int64_t>(list.size()) < tasks_page.limit) {
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
    }
    if (!t.last_error.empty() && static_cast<int64_t>(errors.size()) < kMaxErrorsShown) {
      errors.push_back({{"task", t.index}, {"attempt", t.attempt}, {"state", TaskStateName(t.state)},
                        {"message", t.last_error}});
    }
  }
  // The records that failed: the first error lines once the job has ended (while it runs they
  // sit in its tasks' chunks), and how to get them all.
  int64_t records_failed = job.counts.failed;
  if (!IsTerminal(job.state)) {
    records_failed = 0;
    for (const Task& t : tasks) records_failed += t.state == TaskState::kRunning ? t.records_failed : 0;
    records_failed += job.counts.failed;
  }
  Json records{{"failed", records_failed},
               {"first", record_errors},
               {"all", records_failed == 0 ? "" : absl::StrCat("minions results ", job.id, " --errors")}};
  return Json{{"now", Seconds(now)}, {"job", JobSummary(job, progress)}, {"tasks", std::move(list)},
              {"tasks_page", PageJson(static_cast<int64_t>(tasks.size()), tasks_page)}, {"errors", std::move(errors)},
              {"record_errors", std::move(records)}, {"actions", actions}};
}

Json HistoryJson(const std::vector<FleetHistoryPoint>& points, const Caller& caller, absl::Duration step) {
  // The rows drawn: each point, and a gap (every series null) where no point was recorded for
  // more than two steps (no server ran): charts break the line there instead of drawing one
  // straight across a time nothing was seen.
  std::vector<const FleetHistoryPoint*> rows;
  std::vector<absl::Time> times;
  for (const FleetHistoryPoint& p : points) {
    if (!times.empty() && rows.back() != nullptr && p.at - times.back() > 2 * step) {
      rows.push_back(nullptr);
      times.push_back(times.back() + step);
    }
    rows.push_back(&p);
    times.push_back(p.at);
  }
  const size_t n = rows.size();
  const Json nulls(std::vector<Json>(n, nullptr));
  Json t = Json::array();
  for (absl::Time at : times) t.push_back(Seconds(at));
  // The chart's four series; draining counts as busy, revoked executors are left out.
  std::map<std::string, Json> executors = {{"busy", nulls}, {"available", nulls}, {"unavailable", nulls}, {"offline", nulls}};
  Json pending = nulls, running = nulls;
  std::map<std::string, std::pair<std::string, Json>> jobs;  // id -> team, rates
  std::map<std::string, std::pair<Json, Json>> teams;        // team -> usage shares, target shares
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] == nullptr) continue;
    const FleetHistoryPoint& p = *rows[i];
    for (auto& [name, series] : executors) series[i] = 0;
    for (const auto& [state, count] : p.executors_by_state) {
      const char* shown = nullptr;
      switch (state) {
        case ExecutorState::kBusy:
        case ExecutorState::kDraining: shown = "busy"; break;
        case ExecutorState::kAvailable: shown = "available"; break;
        case ExecutorState::kOwnerActive: shown = "unavailable"; break;
        case ExecutorState::kLost: shown = "offline"; break;
        default: break;
      }
      if (shown) executors[shown][i] = executors[shown][i].get<int64_t>() + count;
    }
    if (caller.IsAdmin()) {  // the fleet's queue holds every team's tasks
      pending[i] = p.tasks_pending;
      running[i] = p.tasks_running;
    }
    for (const auto& [id, rate] : p.jobs) {
      if (!caller.SeesTeam(rate.team)) continue;
      auto [it, added] = jobs.try_emplace(id, rate.team, nulls);
      it->second.second[i] = rate.records_per_second;
    }
    const std::map<std::string, double> targets = TargetShares(p.teams);
    absl::Duration total;
    for (const TeamUsage& u : p.teams) total += u.usage;
    for (const TeamUsage& u : p.teams) {
      if (!caller.IsAdmin() && !caller.SeesTeam(u.team)) continue;
      auto [it, added] = teams.try_emplace(u.team, nulls, nulls);
      it->second.first[i] = total > absl::ZeroDuration() ? absl::FDivDuration(u.usage, total) : 0.0;
      it->second.second[i] = targets.at(u.team);
    }
  }
  // Tokens per second by team (the answers' completion tokens, and their prompts'): what every
  // server admitted in the step that ended at each point; 0 in a step with none, null at a gap
  // and at the newest point (its step is not over).
  std::set<std::string> token_teams;
  for (const FleetHistoryPoint* p : rows) {
    if (p == nullptr) continue;
    for (const auto& [team, used] : p->tokens) {
      if (caller.SeesTeam(team)) token_teams.insert(team);
    }
  }
  Json tokens_json = Json::array();
  const double step_seconds = std::max(absl::ToDoubleSeconds(step), 1e-3);
  for (const std::string& team : token_teams) {
    Json completion = nulls, prompt = nulls;
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] == nullptr || !rows[i]->tokens_known) continue;
      auto it = rows[i]->tokens.find(team);
      const TokenUsage used = it == rows[i]->tokens.end() ? TokenUsage{} : it->second;
      completion[i] = static_cast<double>(used.completion_tokens) / step_seconds;
      prompt[i] = static_cast<double>(used.prompt_tokens) / step_seconds;
    }
    tokens_json.push_back({{"team", team}, {"completion_per_second", std::move(completion)},
                           {"prompt_per_second", std::move(prompt)}});
  }
  Json jobs_json = Json::array();
  for (auto& [id, team_rates] : jobs) {
    jobs_json.push_back({{"id", id}, {"team", team_rates.first}, {"records_per_second", std::move(team_rates.second)}});
  }
  Json teams_json = Json::array();
  for (auto& [team, shares] : teams) {
    teams_json.push_back(
        {{"team", team}, {"usage_share", std::move(shares.first)}, {"target_share", std::move(shares.second)}});
  }
  Json executors_json = Json::object();
  for (auto& [state, counts] : executors) executors_json[state] = std::move(counts);
  Json out{{"t", std::move(t)},
           {"step_seconds", absl::ToDoubleSeconds(step)},
           {"executors", std::move(executors_json)},
           {"jobs", std::move(jobs_json)},
           {"teams", std::move(teams_json)},
           {"tokens", std::move(tokens_json)}};
  if (caller.IsAdmin()) out["tasks"] = {{"pending", std::move(pending)}, {"running", std::move(running)}};
  return out;
}

Json ExecutorHistoryJson(const std::vector<FleetHistoryPoint>& points, const std::string& executor_id,
                         const Caller& caller, absl::Duration step) {
  Json t = Json::array(), state = Json::array(), rates = Json::array(), tasks = Json::array();
  const FleetHistoryPoint* previous = nullptr;  // the row before, when it saw the executor
  std::optional<absl::Time> last_at;
  for (const FleetHistoryPoint& p : points) {
    if (last_at && p.at - *last_at > 2 * step) {
      // No point for more than two steps (no server ran): a gap, as on the fleet's charts.
      t.push_back(Seconds(*last_at + step));
      state.push_back(nullptr);
      rates.push_back(nullptr);
      tasks.push_back(nullptr);
      previous = nullptr;
    }
    t.push_back(Seconds(p.at));
    last_at = p.at;
    auto it = p.executors.find(executor_id);
    if (it == p.executors.end()) {
      state.push_back(nullptr);
      rates.push_back(nullptr);
      tasks.push_back(nullptr);
      previous = nullptr;
      continue;
    }
    const FleetHistoryPoint::ExecutorSample& e = it->second;
    state.push_back(std::string(ExecutorStateShown(e.state)));
    tasks.push_back(caller.IsAdmin() ? Json(e.tasks_running) : Json(nullptr));
    Json rate = nullptr;
    if (previous != nullptr && p.at > previous->at) {
      const int64_t before = previous->executors.at(executor_id).records_done;
      // Lifetime records only grow; fewer (re-enrolled under the same id) draws nothing.
      if (e.records_done >= before) rate = static_cast<double>(e.records_done - before) / absl::ToDoubleSeconds(p.at - previous->at);
    }
    rates.push_back(rate);
    previous = &p;
  }
  Json out{{"t", std::move(t)}, {"step_seconds", absl::ToDoubleSeconds(step)}, {"state", std::move(state)},
           {"records_per_second", std::move(rates)}};
  if (caller.IsAdmin()) out["tasks"] = std::move(tasks);
  return out;
}

void InstallStatusEndpoints(const StatusSources& src, HttpServer* http) {
  auto sessions = std::make_shared<DashboardSessions>(absl::Seconds(kSessionSeconds), kMaxSessions);
  // The caller of a request that must hold `scope`, or the refusal to send.
  auto authorize = [src, sessions](const HttpRequest& request, Scope scope) -> absl::StatusOr<Caller> {
    return src.auth->Authorize(RequestToken(request, *sessions, src.clock->Now()), scope);
  };
  InstallMetricsEndpoints(src.registry, http, [authorize](const HttpRequest& request) -> std::optional<HttpResponse> {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kMetricsRead);
    if (!caller.ok()) return Refusal(caller.status());
    return std::nullopt;
  });
  http->Handle("/readyz", [src](const HttpRequest&) {
    // Says ready or not, nothing else: the reason goes to the log.
    if (src.serving && !src.serving()) return HttpResponse{503, kPlain, "not ready: starting or shutting down\n", {}};
    auto probe = src.store->ListJobs(JobFilter{std::nullopt, "", 1});
    if (!probe.ok()) {
      MINIONS_LOG(Warning) << "/readyz: the store cannot be read: " << probe.status().message();
      return HttpResponse{503, kPlain, "not ready\n", {}};
    }
    return HttpResponse{200, kPlain, "ready\n", {}};
  });
  http->Handle("/api/fleet", [src, authorize, sessions](const HttpRequest& request) {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kFleetRead);
    if (!caller.ok()) return Refusal(caller.status());
    auto s = src.fleet->Get();
    if (!s.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    Json fleet = FleetJson(**s, src.clock->Now(), *caller);
    // The page's CSRF secret for the changes it may ask (a cancel): readable by this origin's
    // scripts only (no CORS), and only for a session (a bearer token needs none).
    if (RequestBearer(request).empty()) {
      fleet["viewer"]["csrf"] = sessions->CsrfOf(request.Cookie(kSessionCookie), src.clock->Now());
    }
    return JsonResponse(fleet);
  });
  http->Handle("/api/history", [src, authorize](const HttpRequest& request) {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kFleetRead);
    if (!caller.ok()) return Refusal(caller.status());
    if (!src.fleet->Get().ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    auto history = src.fleet->History();
    if (!history.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    return JsonResponse(HistoryJson(*history, *caller, src.fleet->history_step()));
  });
  http->Handle("/api/history/executor", [src, authorize](const HttpRequest& request) {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kFleetRead);
    if (!caller.ok()) return Refusal(caller.status());
    const std::string id = request.Param("id");
    if (id.empty()) return JsonResponse({{"error", "say which executor: /api/history/executor?id=EXECUTOR_ID"}}, 400);
    auto history = src.fleet->History();
    if (!history.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    return JsonResponse(ExecutorHistoryJson(*history, id, *caller, src.fleet->history_step()));
  });
  http->Handle("/api/jobs", [src, authorize](const HttpRequest& request) {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kJobsRead);
    if (!caller.ok()) return Refusal(caller.status());
    auto s = src.fleet->Get();
    if (!s.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    return JsonResponse(JobsJson(**s, src.clock->Now(), *caller, PageOf(request, 100, 500)));
  });
  http->Handle("/api/job", [src, authorize](const HttpRequest& request) {
    absl::StatusOr<Caller> caller = authorize(request, Scope::kJobsRead);
    if (!caller.ok()) return Refusal(caller.status());
    std::string id = request.Param("id");
    if (id.empty()) return JsonResponse({{"error", "say which job: /api/job?id=JOB_ID"}}, 400);
    auto job = src.store->GetJob(id);
    // Another team's job is not found, word for word as an unknown one.
    if ((job.ok() && !caller->SeesTeam(job->spec.team)) || absl::IsNotFound(job.status())) {
      return JsonResponse({{"error", absl::StrCat("no job ", id)}}, 404);
    }
    if (!job.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    auto tasks = src.store->ListTasks(id);
    if (!tasks.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    const absl::Time now = src.clock->Now();
    int64_t in_flight = 0;
    for (const Task& t : *tasks) {
      if (t.state == TaskState::kRunning) in_flight += t.records_done;
    }
    Json record_errors = Json::array();
    if (IsTerminal(job->state)) {
      auto first = FirstRecordErrors(src.blobs, *job, kMaxRecordErrorsShown);
      // The page still shows the counts and how to get the errors; the log says why not the lines.
      if (first.ok()) {
        record_errors = std::move(*first);
      } else {
        MINIONS_LOG(Warning) << "job=" << id << " dashboard: cannot read its error lines: " << first.status().message();
      }
    }
    return JsonResponse(JobJson(*job, *tasks, src.progress->Observe(*job, in_flight, now), now,
                                PageOf(request, 500, 5000), record_errors,
                                JobActions(*job, *caller, src.results_of != nullptr)));
  });
  InstallJobActions(src, sessions, http);

  InstallPages(src, sessions, authorize, http);
}

namespace {

// The sign-in (/login, /logout: a session cookie that names the token's session) and the page's
// assets; the page itself sends a visitor without a session to sign in.
void InstallPages(const StatusSources& src, std::shared_ptr<DashboardSessions> sessions, const Authorize& authorize,
                  HttpServer* http) {
  // Login: the token is checked, then kept in an HttpOnly cookie for the browser session.
  const WebAsset* login_page = nullptr;
  for (const WebAsset& asset : WebAssets()) {
    if (std::string(asset.path) == "/login.html") login_page = &asset;
  }
  auto login_html = [login_page](int status, const std::string& message) {
    std::string page = login_page ? std::string(reinterpret_cast<const char*>(login_page->data), login_page->size)
                                  : "<p>{{message}}</p>";
    return HttpResponse{status, "text/html; charset=utf-8",
                        absl::StrReplaceAll(page, {{"{{message}}", HtmlEscape(message)}}),
                        {{"Cache-Control", "no-store"}}};
  };
  http->Handle("/login", [login_html](const HttpRequest&) { return login_html(200, ""); });
  http->HandlePost("/login", [src, login_html, sessions](const HttpRequest& request) {
    // A login posted from another site's page is refused (SameSite also keeps its cookie home),
    // and so is one from an opaque origin ("null": a sandboxed frame, a data: or file: page,
    // which any site can make); the dashboard's own page always sends its real origin.
    if (!FromOwnPage(request)) return login_html(403, "sign in from this server's own page");
    const std::string token = request.Form()["token"];
    absl::StatusOr<Caller> caller = src.auth->Authorize(token, Scope::kFleetRead);
    if (!caller.ok()) {
      MINIONS_LOG(Info) << "refused a dashboard login from " << request.peer << ": " << caller.status().message();
      return login_html(401, std::string(caller.status().message()));
    }
    HttpResponse response{303, kPlain, "signed in\n", {{"Location", "/"}, {"Cache-Control", "no-store"}}};
    // The cookie names a session, never the token; the session ends after a working day even
    // where the browser stays open (the server forgets it then too).
    const std::string session = sessions->Open(token, src.clock->Now());
    response.headers["Set-Cookie"] = absl::StrCat(kSessionCookie, "=", session, "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                                                  kSessionSeconds, request.tls ? "; Secure" : "");
    return response;
  });
  http->HandlePost("/logout", [sessions](const HttpRequest& request) {
    sessions->Close(request.Cookie(kSessionCookie));  // ended on the server too, not only in the browser
    HttpResponse response{303, kPlain, "signed out\n", {{"Location", "/login"}}};
    response.headers["Set-Cookie"] = absl::StrCat(kSessionCookie, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                                                  request.tls ? "; Secure" : "");
    return response;
  });

  for (const WebAsset& asset : WebAssets()) {
    const std::string path = asset.path;
    if (path == "/login.html") continue;
    auto serve = [&asset](const HttpRequest&) {
      return HttpResponse{200, asset.content_type, std::string(reinterpret_cast<const char*>(asset.data), asset.size),
                          {}};
    };
    if (path == "/index.html") {
      // The page itself holds no data, but a visitor without a session is sent to sign in first.
      auto page = [src, serve, authorize](const HttpRequest& request) {
        if (!authorize(request, Scope::kFleetRead).ok()) {
          return HttpResponse{302, kPlain, "sign in first\n", {{"Location", "/login"}}};
        }
        return serve(request);
      };
      http->Handle("/", page);
      http->Handle("/index.html", page);
      continue;
    }
    http->Handle(path, serve);
  }
}

void InstallJobActions(const StatusSources& src, std::shared_ptr<DashboardSessions> sessions, HttpServer* http) {
  // A cancel, from the job page (or a script with a bearer token). The session cookie alone
  // never suffices: a page of another site could make the browser post it (SameSite=Strict is
  // the first guard, this the second), so a cookie's request must also come from this
  // server's page and carry the session's CSRF secret, which only this origin's scripts read.
  http->HandlePost("/api/job/cancel", [src, sessions](const HttpRequest& request) {
    const absl::Time now = src.clock->Now();
    std::string token = RequestBearer(request);
    if (token.empty()) {
      const std::string session = request.Cookie(kSessionCookie);
      token = session.empty() ? "" : sessions->TokenOf(session, now);
      if (!token.empty() && (!FromOwnPage(request) || !sessions->CsrfMatches(session, request.Header("x-csrf-token"), now))) {
        MINIONS_LOG(Info) << "refused a dashboard cancel from " << request.peer << ": not from the dashboard's own page";
        return JsonResponse({{"error", "cancel from this server's dashboard page (reload it if it is old)"}}, 403);
      }
    }
    absl::StatusOr<Caller> caller = src.auth->Authorize(token, Scope::kJobsWrite);
    if (!caller.ok()) return Refusal(caller.status());
    const std::string id = request.Form()["id"];
    if (id.empty()) return JsonResponse({{"error", "say which job: POST id=JOB_ID"}}, 400);
    auto job = src.store->GetJob(id);
    // Another team's job is not found, word for word as an unknown one.
    if ((job.ok() && !caller->SeesTeam(job->spec.team)) || absl::IsNotFound(job.status())) {
      return JsonResponse({{"error", absl::StrCat("no job ", id)}}, 404);
    }
    if (!job.ok()) return JsonResponse({{"error", "the store cannot be read"}}, 503);
    auto cancelled = src.store->CancelJob(id, now);
    if (absl::IsFailedPrecondition(cancelled.status())) {
      return JsonResponse({{"error", absl::StrCat("job ", id, " has ended (", std::string(JobStateName(job->state)),
                                                  "): only a queued or running job can be cancelled")}},
                          409);
    }
    if (!cancelled.ok()) return JsonResponse({{"error", std::string(cancelled.status().message())}}, 503);
    MINIONS_LOG(Info) << "job=" << id << " cancelled from the dashboard by " << caller->Describe();
    // What it finished stays: the page offers its files at once.
    return JsonResponse({{"id", id}, {"state", JobStateName(cancelled->state)},
                         {"actions", JobActions(*cancelled, *caller, src.results_of != nullptr)}});
  });

  // Downloads: streamed from the object store as they are read, never held whole; one stream
  // slot per download, counted against the caller.
  auto admit = [src, sessions](const HttpRequest& request) {
    HttpAdmission admission;
    absl::StatusOr<Caller> caller =
        src.auth->Authorize(RequestToken(request, *sessions, src.clock->Now()), Scope::kJobsRead);
    if (!caller.ok()) {
      admission.kind = HttpAdmission::Kind::kRefuse;
      admission.refusal = Refusal(caller.status());
      return admission;
    }
    admission.kind = HttpAdmission::Kind::kStream;
    admission.principal = absl::StrCat(caller->principal, "@", caller->team);
    admission.admitted = *caller;
    return admission;
  };
  http->HandleStream(
      "/api/results",
      [src](const HttpRequest& request, HttpStream& stream) {
        const Caller* caller = std::any_cast<Caller>(&request.admitted);
        if (caller == nullptr) return (void)stream.Respond(Refusal(absl::UnauthenticatedError("sign in first")));
        if (request.path != "/api/results") return (void)stream.Respond(JsonResponse({{"error", "no such page"}}, 404));
        if (request.method != "GET" && request.method != "HEAD") {
          return (void)stream.Respond(JsonResponse({{"error", "GET /api/results?id=JOB_ID[&file=errors]"}}, 405));
        }
        const std::string id = request.Param("id");
        const std::string file = request.Param("file");
        if (id.empty() || (!file.empty() && file != "errors" && file != "output")) {
          return (void)stream.Respond(JsonResponse({{"error", "say which file: /api/results?id=JOB_ID[&file=errors]"}}, 400));
        }
        auto job = src.store->GetJob(id);
        if ((job.ok() && !caller->SeesTeam(job->spec.team)) || absl::IsNotFound(job.status())) {
          return (void)stream.Respond(JsonResponse({{"error", absl::StrCat("no job ", id)}}, 404));
        }
        if (!job.ok()) return (void)stream.Respond(JsonResponse({{"error", "the store cannot be read"}}, 503));
        if (!src.results_of || src.blobs == nullptr) {
          return (void)stream.Respond(JsonResponse({{"error", "this server offers no downloads; use minions results"}}, 404));
        }
        auto keys = src.results_of(*job);
        if (absl::IsFailedPrecondition(keys.status())) {
          return (void)stream.Respond(JsonResponse({{"error", std::string(keys.status().message())}}, 409));
        }
        if (!keys.ok()) {
          MINIONS_LOG(Warning) << "job=" << id << " dashboard download: " << keys.status().message();
          return (void)stream.Respond(JsonResponse({{"error", "the results cannot be read now; try again"}}, 503));
        }
        const bool errors = file == "errors";
        const std::string& key = errors ? keys->second : keys->first;
        auto size = src.blobs->Size(key);
        if (!size.ok()) {
          MINIONS_LOG(Warning) << "job=" << id << " dashboard download: " << size.status().message();
          return (void)stream.Respond(JsonResponse({{"error", "the results cannot be read now; try again"}}, 503));
        }
        const std::string name = absl::StrCat(id, errors ? "-errors" : "-output", ".jsonl");
        if (!stream.WriteHead(200, "application/jsonl", *size,
                              {{"Content-Disposition", absl::StrCat("attachment; filename=\"", name, "\"")},
                               {"Cache-Control", "no-store"}})
                 .ok()) {
          return;
        }
        if (request.method == "HEAD") return;
        int64_t sent = 0;
        auto read = src.blobs->Read(key, [&](std::string_view chunk) {
          sent += static_cast<int64_t>(chunk.size());
          return sent <= *size && stream.Write(chunk).ok();
        });
        // After the head a failure can only cut the body short: the client sees fewer bytes
        // than Content-Length said.
        if (!read.ok()) MINIONS_LOG(Warning) << "job=" << id << " dashboard download cut short: " << read.message();
      },
      admit);
}

}  // namespace
}  // namespace minions
