#pragma once
// The two endpoints every Minions process with an HTTP port serves: /metrics (the registry in the
// Prometheus text format) and /healthz (200 while the process is up, and nothing else). Servers
// add /readyz and the dashboard on top (dashboard/status_endpoints.h).

#include <functional>
#include <optional>

#include "http/http_server.h"
#include "metrics/metrics.h"

namespace minions {

// Decides whether a request may read /metrics: nullopt lets it, a response refuses it (a server
// asks for a credential with metrics:read; an executor's port is loopback-only and lets all).
using MetricsGuard = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

// `registry` must outlive `http`'s serving.
void InstallMetricsEndpoints(metrics::Registry* registry, HttpServer* http, MetricsGuard guard = nullptr);

}  // namespace minions
