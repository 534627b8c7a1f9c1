#pragma once
// "host:port" addresses as the processes take them (--listen, --server): splitting, and whether
// one stays on this machine. A pool bound to loopback may speak plain text; anything else needs
// TLS (docs/operations.md, "TLS"). Pure functions; any thread.

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace minions {

// "host:port" -> host and port ("[::1]:80" -> "::1", 80; ":80" -> "0.0.0.0"); InvalidArgument
// with a message a person can act on.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// 127.0.0.0/8, ::1 (bracketed or not, and as ::ffff:127.x.y.z) and "localhost". Not 0.0.0.0,
// "" or "::" (every interface), and never another name ("127.evil.example"). The one loopback
// check of the code base: every place that trusts loopback asks it.
bool IsLoopbackHost(std::string_view host);
// The host part of "host:port" (or a bare host) is a loopback one.
bool IsLoopbackAddress(const std::string& address);

}  // namespace minions
