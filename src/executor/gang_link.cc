#include "executor/gang_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/host_port.h"

namespace minions {
namespace {

// A duty served by a GangMember (the real rpc-server behind its gate).
class MemberService : public GangService {
 public:
  explicit MemberService(std::unique_ptr<GangMember> member) : member_(std::move(member)) {}
  const std::string& endpoint() const override { return member_->endpoint(); }
  int64_t refused() const override { return member_->refused(); }
  int64_t admitted() const override { return member_->admitted(); }
  int64_t bytes_in() const override { return member_->bytes_in(); }
  int64_t bytes_out() const override { return member_->bytes_out(); }
  void Stop() override { member_->Stop(); }

 private:
  std::unique_ptr<GangMember> member_;
};

// How long a connection to a gate is watched for being closed at once: a gate closes what it
// cannot forward (its rpc-server gone, before the gate itself closes) and what is not the leader's.
constexpr absl::Duration kGateSettle = absl::Milliseconds(200);

// Connects to `address` without blocking for longer than `timeout`, and watches the connection
// for kGateSettle; true when it connected and was not closed at once.
bool ConnectsWithin(const addrinfo& address, absl::Duration timeout) {
  int fd = socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address.ai_protocol);
  if (fd < 0) return false;
  bool ok = connect(fd, address.ai_addr, address.ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd wait{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof(error);
    ok = poll(&wait, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1 &&
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
  }
  if (ok) {
    // A live rpc-server waits for a command: nothing to read. End of stream or an error: closed.
    pollfd watch{fd, POLLIN, 0};
    if (poll(&watch, 1, static_cast<int>(absl::ToInt64Milliseconds(kGateSettle))) == 1) {
      char byte;
      ok = recv(fd, &byte, 1, MSG_PEEK) > 0;
    }
  }
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GangService>> NetworkGangLink::Serve(const GangMemberOptions& options) {
  absl::StatusOr<std::unique_ptr<GangMember>> member = GangMember::Start(options);
  if (!member.ok()) return member.status();
  return std::make_unique<MemberService>(*std::move(member));
}

bool NetworkGangLink::Answers(const std::string& endpoint) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(endpoint, &host, &port).ok()) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) ok = ConnectsWithin(*a, connect_timeout_);
  freeaddrinfo(found);
  return ok;
}

}  // namespace minions
