#pragma once
// AgentControlPlane: the control plane as the executor's agent sees it, in the domain's words
// (model/types.h): register with an offer, beat with what it holds, lease with how much room it
// has, complete and fail attempts. The agent's logic is written against this interface, so a test
// can drive the agent (or one of its parts) through a fake without building a protobuf; the one
// real implementation (MakeAgentControlPlane) translates to the Executors service's messages
// over a ControlPlaneClient, the transport seam (executor/control_plane_client.h).
//
// The one wire type left in it is the capabilities offer (v1::Capabilities): it is measured and
// written by executor/capabilities.cc as the message the server stores, and the agent only
// passes it through.
// Threads: thread-safe (the agent's main and heartbeat threads share one).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "executor/control_plane_client.h"
#include "minions/v1/minions.pb.h"
#include "model/types.h"
#include "model/verification.h"

namespace minions {

// What the server said at registration.
struct AgentRegistration {
  std::string executor_id;
  absl::Duration lease_ttl;
  absl::Duration idle_heartbeat;  // zero: the server did not say (an older one)
  bool idle_polls_renew = false;  // its idle long polls stand for its idle heartbeats
};

// One heartbeat: the executor's state and what it holds.
struct AgentBeat {
  std::string executor_id;
  std::string state;         // available busy owner_active draining (ExecutorStateName)
  std::string state_reason;
  std::vector<LeaseProgress> leases;     // the leases it renews, with their progress
  std::vector<AttemptRef> gang_duties;   // gangs it serves as a member
  std::string model_loaded;              // digest (or path) its runner has loaded; "" none
  std::vector<std::string> models_cached;  // digests its model cache holds
};

// The server's answer to a heartbeat.
struct AgentBeatAnswer {
  std::vector<AttemptRef> cancel;  // stop these now
  int renewed = 0;                 // leases renewed
  bool drain = false;
  bool reregister = false;         // the server does not know this executor
};

// One Lease call.
struct AgentLeaseAsk {
  std::string executor_id;
  int max_tasks = 1;
  absl::Duration wait = absl::ZeroDuration();  // a long poll: answered when work comes, or after this
  bool idle = false;     // holding nothing: the poll may renew it in place of an idle heartbeat
  bool reclaim = false;  // the last answer was lost: give back what was granted
  std::vector<AttemptRef> held;  // with reclaim: every attempt it holds
};

// The server's answer to a Lease call.
struct AgentLeaseAnswer {
  std::vector<LeaseGrant> leases;
  std::vector<GangDuty> gang_duties;  // gangs to serve as a member
  bool drain = false;
  bool reregister = false;
  bool idle_renewed = false;  // this idle poll renewed the executor
};

// A spot check leased to this executor (docs/verification.md, "Spot checks"): records of a chunk
// another executor produced, to re-score with the job's model.
struct VerificationGrant {
  // The job's model and runner as a task lease names them, so the agent loads it as it would for
  // a task: ref is the checked chunk's attempt, expires_at when the report is due; no input URL.
  LeaseGrant job;
  int seq = 0;  // the chunk's number in that attempt
  struct Item {
    int64_t record = 0;  // task-relative
    std::string custom_id;
    std::string input_line;
    std::string output_line;  // what the producer claimed
  };
  std::vector<Item> items;
};

class AgentControlPlane {
 public:
  virtual ~AgentControlPlane() = default;
  virtual absl::StatusOr<AgentRegistration> Register(const std::string& executor_id,
                                                     const v1::Capabilities& capabilities) = 0;
  virtual absl::StatusOr<AgentBeatAnswer> Heartbeat(const AgentBeat& beat) = 0;
  virtual absl::StatusOr<AgentLeaseAnswer> Lease(const AgentLeaseAsk& ask) = 0;
  // Completes finished attempts in one call: one status per attempt, in order (an answer with
  // fewer outcomes than attempts leaves the rest unanswered: NotFound "no answer").
  virtual absl::StatusOr<std::vector<absl::Status>> CompleteBatch(const std::string& executor_id,
                                                                  const std::vector<LeaseProgress>& done) = 0;
  // Reports an attempt that ended without success, with the chunks it uploaded.
  virtual absl::Status Fail(const std::string& executor_id, const LeaseProgress& progress, FailureClass failure,
                            const std::string& message) = 0;
  // Spot checks: verification tasks for this executor, and its verdicts on one (one per item, in
  // order). Default: Unimplemented (a control plane that does not offer them).
  virtual absl::StatusOr<std::vector<VerificationGrant>> LeaseVerifications(const std::string& executor_id,
                                                                           int max_tasks) {
    return absl::UnimplementedError("no verification tasks here");
  }
  virtual absl::Status ReportVerifications(const std::string& executor_id, const VerificationGrant& grant,
                                           const std::vector<RecordVerdict>& verdicts) {
    return absl::UnimplementedError("no verification tasks here");
  }
  // Ends a Lease call now waiting, from any thread (ControlPlaneClient::InterruptLease).
  virtual void InterruptLease() = 0;
  // Non-OK once the server refused this executor's credential (ControlPlaneClient::
  // CredentialRefused): the agent stops for good. Default: never.
  virtual absl::Status CredentialRefused() const { return absl::OkStatus(); }
};

// The real one: these calls as the Executors service's messages over `client`.
std::unique_ptr<AgentControlPlane> MakeAgentControlPlane(std::unique_ptr<ControlPlaneClient> client);

}  // namespace minions
