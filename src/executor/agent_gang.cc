// ExecutorAgent, gangs (docs/architecture.md, "Gangs"): as a member it serves the duties its lease
// answers carry, an rpc-server behind a gate on its gang address that admits only the gang's
// leader, until a heartbeat says the attempt ended or the owner needs the machine (the owner never
// waits for a gang); as a leader it waits for its members' gates before its runner loads the model
// across them, and asks them again when its runner dies (agent_runner.cc: a member gone, or a crash
// of the runner's own). While it serves or leads a gang it leases nothing else: its memory is the gang's.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/logging.h"
#include "executor/agent.h"

namespace minions {

void ExecutorAgent::TakeGangDuties(const std::vector<GangDuty>& duties) {
  for (const GangDuty& duty : duties) {
    const std::string key = TaskKey(duty.ref);
    if (duties_.contains(key)) continue;
    absl::Status started = absl::FailedPreconditionError("this executor names no [gang] address");
    if (options_.gang) {
      GangMemberOptions member;
      member.rpc_server = options_.gang->rpc_server;
      member.stderr_path = options_.gang->rpc_log;
      member.threads = options_.runner_threads;
      member.leader_host = duty.leader_host;
      member.secret = duty.secret;
      member.wrap = options_.gang->rpc_wrap;
      std::string host;
      int port = 0;
      // Only its own gang address: the server's `bind` is a copy of what this executor reported.
      started = SplitHostPort(options_.gang->address, &host, &port);
      if (started.ok() && duty.bind != options_.gang->address) {
        started = absl::InvalidArgumentError(absl::StrCat("the duty binds ", duty.bind, ", not this executor's gang address ",
                                                          options_.gang->address));
      }
      if (started.ok()) {
        member.bind_host = host;
        member.port = port;
        absl::StatusOr<std::unique_ptr<GangService>> running = gang_link_->Serve(member);
        if (running.ok()) {
          MINIONS_LOG(Info) << Describe(duty.ref) << " serving the gang of leader " << duty.leader_host << " at "
                            << (*running)->endpoint();
          duties_[key] = *std::move(running);
        } else {
          started = running.status();
        }
      }
    }
    if (!started.ok()) {
      // Its leader finds no gate and gives the attempt back (preempted): nothing else to do here.
      MINIONS_LOG(Warning) << Describe(duty.ref) << " cannot serve its gang: " << started.message();
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      duty_refs_.push_back(duty.ref);
    }
    heartbeater_.Soon(clock_->Now());  // a member's duty is heard of within a third
  }
}

bool ExecutorAgent::EndDuty(const AttemptRef& ref) {
  auto it = duties_.find(TaskKey(ref));
  if (it == duties_.end()) return false;
  it->second->Stop();
  MINIONS_LOG(Info) << Describe(ref) << " gang duty ended (" << it->second->admitted() << " connections from the leader, "
                    << it->second->refused() << " refused; " << it->second->bytes_in() << " bytes in, "
                    << it->second->bytes_out() << " bytes out)";
  duties_.erase(it);
  absl::MutexLock lock(&mu_);
  std::erase(duty_refs_, ref);
  return true;
}

void ExecutorAgent::EndDuties(const char* why) {
  if (duties_.empty()) return;
  MINIONS_LOG(Info) << "leaving " << duties_.size() << " gang(s): " << why;
  for (auto& [key, member] : duties_) member->Stop();
  duties_.clear();
  absl::MutexLock lock(&mu_);
  // Reported no more: the server ends those attempts when their leaders give them back, and its
  // next heartbeat finds this executor free.
  duty_refs_.clear();
}

bool ExecutorAgent::InGang() const {
  if (!duties_.empty()) return true;
  for (const auto& [key, task] : tasks_) {
    if (!task->lease().gang.empty()) return true;
  }
  return false;
}

std::vector<int> ExecutorAgent::GangPorts(const LeaseGrant& lease) {
  std::vector<int> ports;
  for (const LeaseGrant::GangPeer& peer : lease.gang) {
    std::string host;
    int port = 0;
    if (SplitHostPort(peer.endpoint, &host, &port).ok() && port > 0) ports.push_back(port);
  }
  std::sort(ports.begin(), ports.end());
  ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
  return ports;
}

absl::StatusOr<std::vector<int>> ExecutorAgent::OpenGangTunnels(const LeaseGrant& lease,
                                                                runner_protocol::LoadRequest* load) {
  runner_.KeepTunnels({});  // the last runner's stop
  std::vector<std::unique_ptr<GangTunnel>> tunnels;
  std::vector<int> ports;
  for (size_t i = 0; i < lease.gang.size() && i < load->gang.servers.size(); ++i) {
    GangTunnelOptions options;
    options.member = lease.gang[i].endpoint;
    options.secret = lease.gang_secret;
    absl::StatusOr<std::unique_ptr<GangTunnel>> tunnel = GangTunnel::Start(options);
    if (!tunnel.ok()) return tunnel.status();
    load->gang.servers[i].endpoint = (*tunnel)->endpoint();
    ports.push_back((*tunnel)->port());
    tunnels.push_back(*std::move(tunnel));
  }
  runner_.KeepTunnels(std::move(tunnels));  // they admit the runner's process when it starts
  return ports;
}

absl::Status ExecutorAgent::GangMembersAnswer(const LeaseGrant& lease) const {
  for (const LeaseGrant::GangPeer& peer : lease.gang) {
    if (!gang_link_->Answers(peer.endpoint, lease.gang_secret)) {
      return absl::UnavailableError(absl::StrCat("gang member ", peer.endpoint, " does not answer"));
    }
  }
  return absl::OkStatus();
}

}  // namespace minions
