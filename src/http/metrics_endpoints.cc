#include "http/metrics_endpoints.h"

namespace minions {

void InstallMetricsEndpoints(metrics::Registry* registry, HttpServer* http, MetricsGuard guard) {
  http->Handle("/metrics", [registry, guard](const HttpRequest& request) {
    if (guard) {
      if (std::optional<HttpResponse> refusal = guard(request)) return *refusal;
    }
    return HttpResponse{200, metrics::kTextContentType, registry->Render(), {}};
  });
  http->Handle("/healthz", [](const HttpRequest&) { return HttpResponse{200, "text/plain; charset=utf-8", "ok\n", {}}; });
}

}  // namespace minions
