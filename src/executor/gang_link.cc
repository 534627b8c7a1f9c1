#include "executor/gang_link.h"

#include <unistd.h>

#include "executor/gang_handshake.h"
#include "executor/gang_tunnel.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<GangService>> NetworkGangLink::Serve(const GangMemberOptions& options) {
  absl::StatusOr<std::unique_ptr<GangMember>> member = GangMember::Start(options);
  if (!member.ok()) return member.status();
  return std::make_unique<MemberService>(*std::move(member));
}

bool NetworkGangLink::Answers(const std::string& endpoint, const std::string& secret) {
  // A gate whose rpc-server is gone closes what it cannot forward, so the handshake fails there.
  int fd = ConnectGangPeer(endpoint, connect_timeout_);
  if (fd < 0) return false;
  const bool proved = ProveLeader(fd, secret, connect_timeout_).ok();
  close(fd);
  return proved;
}

}  // namespace minions
