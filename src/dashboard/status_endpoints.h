#pragma once
// StatusEndpoints: what a server serves on its HTTP port.
//   Open to anyone, and saying nothing else:
//     /healthz   200 while the process is up
//     /readyz    200 when the server serves gRPC and can read its store; 503 otherwise
//     /login     the login page (GET) and the login (POST token=...: sets the session cookie)
//     /logout    (POST) forgets the session cookie
//     /app.js, /style.css   the dashboard's code and looks (no data); /uplot.js, /uplot.css its
//                           charting library (uPlot, embedded at build time)
//   With a credential ("Authorization: Bearer <token>", or the HttpOnly session cookie the login
//   sets, which names a session of this server's, never the token: dashboard_sessions.h):
//     /metrics     Prometheus text format: metrics:read (monitor and admin tokens)
//     /            the dashboard page (without a session: a redirect to /login)
//     /api/fleet   executors (device, coarse state, current tasks) and counts by state: fleet:read
//     /api/jobs    jobs, newest first, paged (?offset=&limit=): jobs:read
//     /api/job?id= one job and its tasks (paged) and errors: jobs:read
//     /api/history the last hours for the charts: executors by state, each job's records per
//                  second, each team's usage against its share: fleet:read
//     /api/history/executor?id=EXECUTOR  one executor's state and records per second over the
//                  same hours (its page's chart): fleet:read
//     /api/job/cancel  (POST id=JOB) cancels a queued or running job of the caller's team:
//                  jobs:write (submitters and admins; a viewer is 403, another team's job 404).
//                  With the session cookie it must come from this server's own page: its Origin,
//                  and the session's CSRF secret (/api/fleet's viewer.csrf) in X-CSRF-Token.
//     /api/results?id=JOB[&file=errors]  an ended job's output (or error) file, streamed as an
//                  attachment: jobs:read. A cancelled or expired job's hold what it finished
//                  (and an error line per record that never ran), as `minions results` gives.
// A caller who is not an admin sees only its own team's jobs and tasks (another team's job is
// 404, as an unknown one) and counts of its own team's jobs. Nobody is shown why an executor's
// owner made it unavailable: states are coarse (available, busy, unavailable, ...).
//
// Ownership: borrows everything it is given; they must outlive the HttpServer it installs into.
// Threads: handlers run on the HTTP server's threads; thread-safe.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "blob/blob_store.h"
#include "common/clock.h"
#include "common/json_util.h"
#include "dashboard/dashboard_sessions.h"
#include "dashboard/fleet_view.h"
#include "http/http_server.h"
#include "identity/authenticator.h"
#include "metrics/metrics.h"
#include "store/metadata_store.h"

namespace minions {

struct StatusSources {
  MetadataStore* store = nullptr;
  Clock* clock = nullptr;
  FleetView* fleet = nullptr;
  ProgressTracker* progress = nullptr;  // the server's (FleetView feeds it too)
  metrics::Registry* registry = nullptr;
  std::function<bool()> serving;  // the gRPC port is up and the server is not shutting down
  Authenticator* auth = nullptr;  // every page but the open ones asks it
  // Where an ended job's error lines are (the job page shows the first ones); null: counts only.
  BlobStore* blobs = nullptr;
  // Where an ended job's results lie (output key, errors key), as `minions results` reads them
  // (JobFinalizer::ResultsOf); FailedPrecondition for a job without results. Null: no downloads.
  std::function<absl::StatusOr<std::pair<std::string, std::string>>(const Job&)> results_of;
};

void InstallStatusEndpoints(const StatusSources& sources, HttpServer* http);

// The session cookie the login sets.
inline constexpr char kSessionCookie[] = "minions_session";
// How long a dashboard session lasts (the cookie's Max-Age): twelve hours.
inline constexpr int64_t kSessionSeconds = 12 * 3600;

// The most dashboard sessions a server keeps at once (the oldest to end goes first).
inline constexpr size_t kMaxSessions = 10000;

// The bearer token a request carries ("" when none): pages without sessions (a watchdog's /metrics).
std::string RequestBearer(const HttpRequest& request);
// The credential a request carries: its bearer token, else the token of the session its cookie
// names ("" when none, or the session has ended).
std::string RequestToken(const HttpRequest& request, DashboardSessions& sessions, absl::Time now);

// Whether a request that changes something (a sign-in, a cancel) came from this server's own
// page: no Origin (not a browser's cross-site request) or this server's; never an opaque one.
bool FromOwnPage(const HttpRequest& request);

// A page of a listing: `offset` and `limit` from ?offset=&limit= (limit at most `max_limit`).
struct Page {
  int64_t offset = 0;
  int64_t limit = 100;
};
Page PageOf(const HttpRequest& request, int64_t default_limit, int64_t max_limit);

// The dashboard's JSON documents (exposed for tests), as `caller` may see them.
Json FleetJson(const FleetSnapshot& snapshot, absl::Time now, const Caller& caller);
Json JobsJson(const FleetSnapshot& snapshot, absl::Time now, const Caller& caller, Page page);
// `record_errors`: the first of its error lines ({"custom_id", "code", "message"}), as
// FirstRecordErrors reads them.
// `actions` ({"cancel": bool, "results": URL or null, "errors": URL or null}: what the page
// offers this caller) goes in as it is.
Json JobJson(const Job& job, const std::vector<Task>& tasks, const ProgressEstimate& progress, absl::Time now,
             Page tasks_page, const Json& record_errors = Json::array(), const Json& actions = Json::object());
// What the job page offers `caller` for `job`: a cancel while it may still run (jobs:write), and
// its files once it has them.
Json JobActions(const Job& job, const Caller& caller, bool downloads);
// The first `limit` error lines of an ended job (from its errors file, reading at most its first
// 256 KiB), each as {"custom_id", "code", "message"}; empty while the job runs or has none.
absl::StatusOr<Json> FirstRecordErrors(BlobStore* blobs, const Job& job, int limit);
// {"t": [unix seconds], "step_seconds": S, "executors": {"busy": [...], "available": [...],
//  "unavailable": [...], "offline": [...]}, "tasks": {"pending": [...], "running": [...]},
//  "jobs": [{"id", "team", "records_per_second": [...]}], "teams": [{"team", "usage_share": [...],
//  "target_share": [...]}], "tokens": [{"team", "completion_per_second": [...], "prompt_per_second":
//  [...]}]}: one value per time in "t"; null where nothing was recorded (a job
// not running then; every series at a gap: a time of more than two steps with no point, when
// no server ran). Another team's jobs and usage, and the fleet's task counts (every team's), are
// left out unless `caller` is an admin.
Json HistoryJson(const std::vector<FleetHistoryPoint>& points, const Caller& caller, absl::Duration step);
// One executor's history (its page's chart): {"t": [...], "step_seconds": S, "state": [shown
// state], "records_per_second": [...], "tasks": [...]}: null where it was not seen (before it
// enrolled, after it was revoked, at a gap as HistoryJson draws them); records per second
// between a point and the one before it; "tasks" (how many it ran, any team's) for admins only.
Json ExecutorHistoryJson(const std::vector<FleetHistoryPoint>& points, const std::string& executor_id,
                         const Caller& caller, absl::Duration step);

// A file of the web dashboard compiled into the binary (generated from web/ at build time).
struct WebAsset {
  const char* path;          // "/index.html"
  const char* content_type;
  const unsigned char* data;
  size_t size;
};
const std::vector<WebAsset>& WebAssets();

}  // namespace minions
