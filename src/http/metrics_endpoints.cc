#include "http/metrics_endpoints.h"

namespace minions {

void InstallMetricsEndpoints(metrics::Registry* registry, HttpServer* http) {
  http->Handle("/metrics", [registry](const HttpRequest&) {
    return HttpResponse{200, metrics::kTextContentType, registry->Render(), {}};
  });
  http->Handle("/healthz", [](const HttpRequest&) { return HttpResponse{200, "text/plain; charset=utf-8", "ok\n", {}}; });
}

}  // namespace minions
