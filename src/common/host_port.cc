#include "common/host_port.h"

#include <arpa/inet.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace minions {

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' needs host:port, like 127.0.0.1:7080"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  if (host->empty()) *host = "0.0.0.0";
  return absl::OkStatus();
}

bool IsLoopbackHost(std::string_view host) {
  // Only a name that is loopback by definition, or an address literal: "127.evil.example" is a
  // name any DNS may point anywhere.
  std::string h = absl::AsciiStrToLower(std::string(host));
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

bool IsLoopbackAddress(const std::string& address) {
  std::string host;
  int port = 0;
  // gRPC targets may carry a scheme ("ipv4:127.0.0.1:7070", "dns:///localhost:7070").
  std::string bare = address;
  for (absl::string_view scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(bare, scheme)) bare = bare.substr(scheme.size());
  }
  if (!SplitHostPort(bare, &host, &port).ok()) host = bare;
  return IsLoopbackHost(host);
}

}  // namespace minions
