#pragma once
// StatusEndpoints: what a server serves on its HTTP port. Operators' and tools' endpoints:
//   /metrics   Prometheus text format (the server's registry, store-derived gauges included)
//   /healthz   200 while the process is up
//   /readyz    200 when the server serves gRPC and can read its store; 503 otherwise
// The web dashboard (files from web/, compiled in) and its JSON:
//   /            the dashboard page; /app.js, /style.css
//   /api/fleet   executors (device, state, owner away/present, current tasks) and counts by state
//   /api/jobs    jobs, newest first, with progress, rate and ETA
//   /api/job?id= one job, its tasks and their errors
//
// Ownership: borrows everything it is given; they must outlive the HttpServer it installs into.
// Threads: handlers run on the HTTP server's threads; thread-safe.

#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/json_util.h"
#include "dashboard/fleet_view.h"
#include "http/http_server.h"
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
};

void InstallStatusEndpoints(const StatusSources& sources, HttpServer* http);

// The dashboard's JSON documents (exposed for tests).
Json FleetJson(const FleetSnapshot& snapshot, absl::Time now);
Json JobsJson(const FleetSnapshot& snapshot, absl::Time now, int limit);
Json JobJson(const Job& job, const std::vector<Task>& tasks, const ProgressEstimate& progress, absl::Time now);

// A file of the web dashboard compiled into the binary (generated from web/ at build time).
struct WebAsset {
  const char* path;          // "/index.html"
  const char* content_type;
  const unsigned char* data;
  size_t size;
};
const std::vector<WebAsset>& WebAssets();

}  // namespace minions
