#pragma once
// The two endpoints every Minions process with an HTTP port serves: /metrics (the registry in the
// Prometheus text format) and /healthz (200 while the process is up). Servers add /readyz and the
// dashboard on top (dashboard/status_endpoints.h).

#include "http/http_server.h"
#include "metrics/metrics.h"

namespace minions {

// `registry` must outlive `http`'s serving.
void InstallMetricsEndpoints(metrics::Registry* registry, HttpServer* http);

}  // namespace minions
