#pragma once
// Raw TCP connections for the HTTP attack suites (http_attack_test.cc, v1_attack_test.cc): what a
// hostile client does below any HTTP library.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace minions::testing {

// A raw TCP connection to 127.0.0.1:port from `source` (another loopback address stands for
// another machine); -1 when refused.
inline int Connect(int port, const char* source = "127.0.0.1") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, source, &local.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace minions::testing
