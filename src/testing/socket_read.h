#pragma once
// ReadFromSocket: what a test's raw connection receives, for tests that speak HTTP by hand.

#include <poll.h>
#include <sys/socket.h>

#include <functional>
#include <string>

#include "absl/time/time.h"

namespace minions::testing {

// What comes back on `fd` until the peer closes it, `enough` (given all so far) says so, or
// `timeout` passes with nothing new.
inline std::string ReadFromSocket(int fd, absl::Duration timeout,
                                  const std::function<bool(const std::string&)>& enough = nullptr) {
  std::string all;
  char buffer[16384];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) > 0) {
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    all.append(buffer, static_cast<size_t>(n));
    if (enough && enough(all)) break;
  }
  return all;
}

}  // namespace minions::testing
