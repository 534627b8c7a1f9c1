// Raw bytes to the server's HTTP port (the dashboard, its JSON, /metrics, /healthz, /readyz over
// an empty store): the request parser and every route. Never a crash; the port keeps answering.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/clock.h"
#include "dashboard/fleet_view.h"
#include "dashboard/status_endpoints.h"
#include "http/http_server.h"
#include "metrics/metrics.h"
#include "store/sqlite/sqlite_metadata_store.h"

namespace {
struct Server {
  std::unique_ptr<minions::SqliteMetadataStore> store;
  minions::RealClock clock;
  minions::ProgressTracker progress;
  std::unique_ptr<minions::FleetView> fleet;
  minions::metrics::Registry registry;
  minions::HttpServer http;
};
Server& Get() {
  static Server* server = [] {
    auto* s = new Server;
    auto store = minions::SqliteMetadataStore::Open(":memory:", minions::StoreOptions{});
    if (!store.ok()) std::abort();
    s->store = std::move(*store);
    s->fleet = std::make_unique<minions::FleetView>(s->store.get(), &s->clock, &s->progress);
    minions::InstallStatusEndpoints({s->store.get(), &s->clock, s->fleet.get(), &s->progress, &s->registry, [] { return true; }}, &s->http);
    if (!s->http.Start("127.0.0.1:0").ok()) std::abort();
    return s;
  }();
  return *server;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server& server = Get();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.http.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();  // the port must still answer
  timeval timeout{0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char buffer[65536];
  while (recv(fd, buffer, sizeof buffer, 0) > 0) {
  }
  close(fd);
  return 0;
}
