#pragma once
// AdminService: the Admin gRPC service — teams, credentials, revocations — for admin tokens
// (WhoAmI: any valid credential). The rules are IdentityAdmin's; this class authorises, converts
// and makes a revocation take effect on this server at once (Authenticator::Forget).
// Threads: called on gRPC's threads; thread-safe.

#include <functional>
#include <vector>

#include "common/clock.h"
#include "identity/authenticator.h"
#include "identity/identity_admin.h"
#include "minions/v1/minions.grpc.pb.h"
#include "store/metadata_store.h"

namespace minions {

// Every team with its settings and its fair-share standing as of `now` (ListTeams, and the admin
// verbs run on the server's own data).
absl::StatusOr<std::vector<v1::Team>> TeamsWithStanding(MetadataStore& store, absl::Time now);

// The admin verbs' work on the store, written once for AdminService and for the admin verbs run on
// the server's own data (apps/identity_setup.cc). The caller authorises, logs and makes a change
// take effect on a live server (forgetting a credential, waking the lease polls).

// An IssueTokenRequest as IdentityAdmin takes it; InvalidArgument for an unknown role or scope.
absl::StatusOr<IssueRequest> FromProto(const v1::IssueTokenRequest& request);
// A ListTokensRequest as the store's filter; InvalidArgument for an unknown role.
absl::StatusOr<TokenFilter> FromProto(const v1::ListTokensRequest& request);
// Issues the token `request` asks for on behalf of `issuer` (a token id, or "local").
absl::StatusOr<IssuedToken> IssueToken(IdentityAdmin& identities, const v1::IssueTokenRequest& request,
                                       const std::string& issuer);
v1::IssuedToken ToProto(const IssuedToken& issued);
// Every token the filter in `request` selects, as the wire shows them.
absl::StatusOr<std::vector<v1::TokenInfo>> ListTokens(MetadataStore& store, const v1::ListTokensRequest& request);

// What an admin does to one executor: revoke it, release it from quarantine, approve it.
enum class ExecutorVerb { kRevoke, kRelease, kApprove };
absl::StatusOr<Executor> ApplyToExecutor(MetadataStore& store, ExecutorVerb verb, const std::string& executor_id,
                                         absl::Time now);

class AdminService final : public v1::Admin::Service {
 public:
  // `work_added` is called when a revocation hands tasks back (they are leasable again).
  AdminService(MetadataStore* store, Clock* clock, Authenticator* auth, IdentityAdmin* identities,
               std::function<void()> work_added = nullptr)
      : store_(store), clock_(clock), auth_(auth), identities_(identities), work_added_(std::move(work_added)) {}

  grpc::Status CreateTeam(grpc::ServerContext* context, const v1::CreateTeamRequest* request, v1::Team* reply) override;
  grpc::Status UpdateTeam(grpc::ServerContext* context, const v1::UpdateTeamRequest* request, v1::Team* reply) override;
  grpc::Status ListTeams(grpc::ServerContext* context, const v1::ListTeamsRequest* request,
                         v1::ListTeamsResponse* reply) override;
  grpc::Status IssueToken(grpc::ServerContext* context, const v1::IssueTokenRequest* request,
                          v1::IssuedToken* reply) override;
  grpc::Status ListTokens(grpc::ServerContext* context, const v1::ListTokensRequest* request,
                          v1::ListTokensResponse* reply) override;
  grpc::Status RevokeToken(grpc::ServerContext* context, const v1::RevokeTokenRequest* request,
                           v1::TokenInfo* reply) override;
  grpc::Status RevokeExecutor(grpc::ServerContext* context, const v1::RevokeExecutorRequest* request,
                              v1::Executor* reply) override;
  grpc::Status ReleaseExecutor(grpc::ServerContext* context, const v1::ReleaseExecutorRequest* request,
                               v1::Executor* reply) override;
  grpc::Status ApproveExecutor(grpc::ServerContext* context, const v1::ApproveExecutorRequest* request,
                               v1::Executor* reply) override;
  grpc::Status WhoAmI(grpc::ServerContext* context, const v1::WhoAmIRequest* request, v1::TokenInfo* reply) override;

 private:
  // The three executor verbs: authorise, apply, make it take effect here, log, answer.
  grpc::Status ApplyToExecutor(grpc::ServerContext* context, ExecutorVerb verb, const std::string& executor_id,
                               v1::Executor* reply);

  MetadataStore* store_;
  Clock* clock_;
  Authenticator* auth_;
  IdentityAdmin* identities_;
  std::function<void()> work_added_;
};

}  // namespace minions
