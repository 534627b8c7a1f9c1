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
  grpc::Status ApproveExecutor(grpc::ServerContext* context, const v1::RevokeExecutorRequest* request,
                               v1::Executor* reply) override;
  grpc::Status WhoAmI(grpc::ServerContext* context, const v1::WhoAmIRequest* request, v1::TokenInfo* reply) override;

 private:
  MetadataStore* store_;
  Clock* clock_;
  Authenticator* auth_;
  IdentityAdmin* identities_;
  std::function<void()> work_added_;
};

// An IssueTokenRequest as IdentityAdmin takes it; InvalidArgument for an unknown role or scope.
absl::StatusOr<IssueRequest> FromProto(const v1::IssueTokenRequest& request);

}  // namespace minions
