// Who may join gangs, and with how much memory (docs/security.md, findings 40.1b and 40.1c). The
// largest gang candidate leads, and members admit their leader's address: so an enrolled executor
// that names a gang address and claims "10 TiB" used to lead other teams' gangs. Now gangs take
// only executors an admin enrolled for them (a join token with the gang scope), and no executor
// may claim more memory than a machine has.

#include "secure_server.h"

namespace minions::testing {
namespace {

class GangAttack : public SecureServer {
 protected:
  void SetUp() override {
    SecureServer::SetUp();
    StartServer();
  }
  std::string JoinToken(bool gang) {
    IssueRequest request;
    request.role = Role::kJoin;
    request.principal = gang ? "gang-machines" : "laptops";
    request.uses = 10;
    if (gang) request.scopes = ScopeSet{Scope::kEnrol, Scope::kGang};
    return Must(server_->identities().Issue(request, "local")).text;
  }
  static v1::Capabilities Capabilities(const std::string& name, int64_t memory, const std::string& gang_address) {
    v1::Capabilities caps;
    caps.set_name(name);
    caps.set_memory_bytes(memory);
    caps.add_runners("llama");
    caps.set_gang_address(gang_address);
    return caps;
  }
  // Enrols with `join` and registers; the executor as the store has it.
  Executor EnrolAndRegister(const std::string& join, const v1::Capabilities& caps, std::string* credential = nullptr) {
    v1::EnrolRequest request;
    *request.mutable_capabilities() = caps;
    v1::EnrolResponse reply;
    grpc::Status status = executors_->Enrol(As(join).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    v1::RegisterRequest registration;
    *registration.mutable_capabilities() = caps;
    v1::RegisterResponse registered;
    status = executors_->Register(As(reply.credential()).get(), registration, &registered);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (credential != nullptr) *credential = reply.credential();
    return Must(store_->GetExecutor(reply.executor_id()));
  }
};

TEST_F(GangAttack, AnExecutorNoAdminEnrolledForGangsJoinsNone) {
  std::string credential;
  Executor e = EnrolAndRegister(JoinToken(/*gang=*/false), Capabilities("sneaky", int64_t{16} << 30, "127.0.0.9:50052"),
                                &credential);
  EXPECT_EQ(e.info.gang_address, "") << "its gang address was kept: it could be chosen to lead";
  // Registering again with the address changes nothing.
  v1::RegisterRequest registration;
  *registration.mutable_capabilities() = Capabilities("sneaky", int64_t{16} << 30, "127.0.0.9:50052");
  v1::RegisterResponse registered;
  ASSERT_GRPC_OK(executors_->Register(As(credential).get(), registration, &registered));
  EXPECT_EQ(Must(store_->GetExecutor(e.id)).info.gang_address, "");
}

TEST_F(GangAttack, AnExecutorEnrolledWithAGangJoinTokenJoinsGangs) {
  Executor e = EnrolAndRegister(JoinToken(/*gang=*/true), Capabilities("rack-1", int64_t{64} << 30, "10.0.0.1:50052"));
  EXPECT_EQ(e.info.gang_address, "10.0.0.1:50052");
}

TEST_F(GangAttack, OnlyJoinTokensCarryTheGangScopeAndNeverByDefault) {
  IssueRequest request;
  request.role = Role::kSubmitter;
  request.team = "search";
  request.principal = "alice";
  request.scopes = ScopeSet{Scope::kJobsRead, Scope::kGang};
  CreateTeam("search");
  EXPECT_EQ(server_->identities().Issue(request, "local").status().code(), absl::StatusCode::kInvalidArgument);
  request.role = Role::kJoin;
  request.team = "";
  request.scopes = ScopeSet{Scope::kGang};  // gang without enrol: useless, refused
  EXPECT_EQ(server_->identities().Issue(request, "local").status().code(), absl::StatusCode::kInvalidArgument);
  request.scopes.reset();
  IssuedToken plain = Must(server_->identities().Issue(request, "local"));
  EXPECT_FALSE(plain.record.scopes.Has(Scope::kGang));
}

TEST_F(GangAttack, AnExecutorClaimingTenTebibytesIsRefusedAndCannotLead) {
  const std::string join = JoinToken(/*gang=*/true);
  v1::EnrolRequest request;
  *request.mutable_capabilities() = Capabilities("liar", int64_t{10} << 40, "127.0.0.9:50052");
  v1::EnrolResponse reply;
  EXPECT_GRPC_ERROR(executors_->Enrol(As(join).get(), request, &reply), INVALID_ARGUMENT, "TiB");
  EXPECT_TRUE(reply.credential().empty());
  EXPECT_THAT(Must(store_->ListExecutors()), IsEmpty());
  // An enrolled one cannot raise its claim when it registers again, nor claim more usable
  // memory than its machine has.
  std::string credential;
  Executor e = EnrolAndRegister(join, Capabilities("liar", int64_t{16} << 30, "10.0.0.2:50052"), &credential);
  for (const auto& [memory, usable] : std::vector<std::pair<int64_t, int64_t>>{
           {int64_t{10} << 40, 0}, {int64_t{16} << 30, int64_t{10} << 40}, {int64_t{16} << 30, int64_t{32} << 30},
           {-1, 0}}) {
    v1::RegisterRequest registration;
    *registration.mutable_capabilities() = Capabilities("liar", memory, "10.0.0.2:50052");
    registration.mutable_capabilities()->set_usable_memory_bytes(usable);
    v1::RegisterResponse registered;
    EXPECT_GRPC_CODE(executors_->Register(As(credential).get(), registration, &registered), INVALID_ARGUMENT);
  }
  EXPECT_EQ(Must(store_->GetExecutor(e.id)).info.memory_bytes, int64_t{16} << 30);
}

}  // namespace
}  // namespace minions::testing
