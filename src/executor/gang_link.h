#pragma once
// GangLink: how an executor meets the gang network (docs/architecture.md, "Gangs"). As a member it
// serves a duty (GangService: in production a GangMember, llama.cpp's rpc-server behind a gate
// that admits only the leader); as a leader it asks whether a member's gate answers, before its
// runner connects and again when that runner dies (a gate that no longer answers means the member
// went away: a preemption; gates that all answer mean the runner died of its own accord).
//
// NetworkGangLink is the real one (GangMember, TCP connects); executor tests put a fake here (the
// seam, like Runner and Clock).
// Threads: the agent's main thread calls Serve and Answers; a GangService's counters may be read
// from any thread.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/gang_member.h"

namespace minions {

// One duty being served: the member's side of one gang attempt.
class GangService {
 public:
  virtual ~GangService() = default;
  // host:port the leader connects to.
  virtual const std::string& endpoint() const = 0;
  // Connections refused (not the leader) and admitted; bytes forwarded each way.
  virtual int64_t refused() const = 0;
  virtual int64_t admitted() const = 0;
  virtual int64_t bytes_in() const = 0;
  virtual int64_t bytes_out() const = 0;
  // Closes the gate first, then everything behind it. Idempotent.
  virtual void Stop() = 0;
};

class GangLink {
 public:
  virtual ~GangLink() = default;
  // Starts serving a duty as `options` say (bind address, the leader admitted, rpc-server).
  virtual absl::StatusOr<std::unique_ptr<GangService>> Serve(const GangMemberOptions& options) = 0;
  // Whether the member gate at `endpoint` ("host:port") accepts a connection now and proves it
  // serves this attempt (it holds `secret`, and admits whoever proves it: the leader).
  virtual bool Answers(const std::string& endpoint, const std::string& secret) = 0;
};

// The real gang network: GangMember for duties, a TCP connect and the handshake (closed at once,
// given up after `connect_timeout`: a member machine that vanished may answer nothing at all) for
// Answers.
class NetworkGangLink : public GangLink {
 public:
  explicit NetworkGangLink(absl::Duration connect_timeout = absl::Seconds(3)) : connect_timeout_(connect_timeout) {}
  absl::StatusOr<std::unique_ptr<GangService>> Serve(const GangMemberOptions& options) override;
  bool Answers(const std::string& endpoint, const std::string& secret) override;

 private:
  absl::Duration connect_timeout_;
};

}  // namespace minions
