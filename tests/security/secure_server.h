#pragma once
// The attack suite's server: a ControlPlane in this process (SQLite in memory, a local object
// store, the real clock), reached only through real gRPC stubs and HTTP, with helpers to make
// teams, credentials and enrolled executors, and to look at the store behind the server's back
// (to assert that a refused call changed nothing).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "blob/local/local_blob_store.h"
#include "identity/pki.h"
#include "minions/v1/minions.grpc.pb.h"
#include "rpc/rpc.h"
#include "rpc/tls.h"
#include "server/control_plane.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/grpc_checks.h"
#include "testing/identities.h"
#include "testing/matchers.h"
#include "testing/must.h"

namespace minions::testing {

// `n` request lines r0..r{n-1}.
inline std::string Records(int n, const std::string& prefix = "r") {
  std::string input;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&input, R"({"custom_id":")", prefix, i, R"(","prompt":"hello"})", "\n");
  }
  return input;
}

class SecureServer : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/minions-security-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    store_ = Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
    blobs_ = Must(LocalBlobStore::Open(dir_ + "/objects"));
    model_ = dir_ + "/tiny.gguf";
    std::ofstream(model_) << "GGUF but not really";
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  ServerOptions Options() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.http_listen = "127.0.0.1:0";
    options.lease_ttl = absl::Seconds(30);
    return options;
  }

  // Starts the server; `tls` for a channel over TLS (options.tls must be set).
  void StartServer(ServerOptions options, const rpc::ClientTls& tls = {}) {
    server_ = std::make_unique<ControlPlane>(store_.get(), blobs_.get(), &clock_, ControlPlaneOptions{options});
    ASSERT_TRUE(server_->Start().ok());
    auto channel = Must(rpc::OpenChannel(server_->address(), tls));
    jobs_ = v1::Jobs::NewStub(channel);
    executors_ = v1::Executors::NewStub(channel);
    admin_stub_ = v1::Admin::NewStub(channel);
    admin_ = Issue(Role::kAdmin, "", "root");
  }
  void StartServer() { StartServer(Options()); }

  // A private CA and server certificate in dir/NAME.
  pki::Files MakePki(const std::string& name) {
    pki::InitOptions options;
    options.dir = dir_ + "/" + name;
    return Must(pki::Init(options, absl::Now()));
  }

  std::string Issue(Role role, const std::string& team, const std::string& name,
                    std::optional<absl::Duration> ttl = std::nullopt, int64_t uses = 0) {
    IssueRequest request = TokenRequest(role, team, name);
    request.ttl = ttl;
    request.uses = uses;
    return Must(server_->identities().Issue(request, "local")).text;
  }
  void CreateTeam(const std::string& name, int max_priority = 10, int64_t max_active_jobs = 0,
                  int64_t requests_per_second = 0) {
    Team team;
    team.name = name;
    team.max_priority = max_priority;
    team.max_active_jobs = max_active_jobs;
    team.requests_per_second = requests_per_second;
    Must(server_->identities().CreateTeam(team));
  }

  // A context presenting `token` ("" presents none).
  static std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    rpc::Prepare(*context, token, absl::Seconds(10));
    return context;
  }

  struct Enrolled {
    std::string id;
    std::string credential;
  };
  // Enrols and registers an executor with a fresh join token; `confinement` is what it reports
  // of its runners' (Capabilities.confinement; "": says nothing, as an older executor).
  // Registers `digest` as the model `name` of `team` (one byte, its object never read).
  void AddModel(const std::string& team, const std::string& name, const std::string& digest) {
    ModelRecord model;
    model.team = team;
    model.name = name;
    model.digest = digest;
    model.created_at = absl::Now();
    model.size_bytes = 1;
    model.blob_key = "models/x";
    Must(store_->AddModel(model));
  }

  Enrolled Enrol(const std::string& name, const std::string& confinement = "") {
    v1::EnrolRequest request;
    request.mutable_capabilities()->set_name(name);
    request.mutable_capabilities()->set_confinement(confinement);
    request.mutable_capabilities()->set_memory_bytes(int64_t{16} << 30);
    request.mutable_capabilities()->add_runners("llama");
    v1::EnrolResponse reply;
    grpc::Status status = executors_->Enrol(As(Issue(Role::kJoin, "", "join")).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    v1::RegisterRequest registration;
    *registration.mutable_capabilities() = request.capabilities();
    v1::RegisterResponse registered;
    status = executors_->Register(As(reply.credential()).get(), registration, &registered);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {reply.executor_id(), reply.credential()};
  }

  // A job of `team` made in the store directly: `n_tasks` tasks of 2 records.
  std::string StoreJobOf(const std::string& team, int n_tasks = 1) {
    JobSpec spec;
    spec.team = team;
    spec.model = model_;
    spec.input_key = "uploads/x/y/in.jsonl";
    Job job = Must(store_->CreateJob(spec, absl::Now()));
    EXPECT_TRUE(store_->AddTasks(job.id, EvenTasks(n_tasks, 2), n_tasks * 2, absl::Now()).ok());
    return job.id;
  }
  // The header that presents `token` over HTTP.
  static std::vector<std::string> Bearer(const std::string& token) { return {"Authorization: Bearer " + token}; }

  // Registers an enrolled executor again, as `name` with a llama runner, holding `models` in its
  // cache and `loaded` in its runner.
  grpc::Status RegisterHolding(const Enrolled& executor, const std::string& name,
                               const std::vector<std::string>& models, const std::string& loaded) {
    v1::RegisterRequest registration;
    registration.mutable_capabilities()->set_name(name);
    registration.mutable_capabilities()->add_runners("llama");
    for (const std::string& model : models) registration.mutable_capabilities()->add_models(model);
    registration.mutable_capabilities()->set_model_loaded(loaded);
    v1::RegisterResponse registered;
    return executors_->Register(As(executor.credential).get(), registration, &registered);
  }

  v1::SubmitJobRequest Request(int records, const std::string& team = "") {
    v1::SubmitJobRequest request;
    request.set_input(Records(records));
    request.set_model(model_);
    request.set_shard_size(2);
    request.set_team(team);
    return request;
  }
  v1::Job MustSubmit(const std::string& token, int records = 4) {
    v1::Job job;
    grpc::Status status = jobs_->SubmitJob(As(token).get(), Request(records), &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }
  std::vector<v1::TaskLease> MustLease(const Enrolled& executor, int max_tasks) {
    v1::LeaseRequest request;
    request.set_max_tasks(max_tasks);
    v1::LeaseResponse reply;
    grpc::Status status = executors_->Lease(As(executor.credential).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {reply.leases().begin(), reply.leases().end()};
  }
  // `n` tasks leased to `executor`, asking for `n`. Where it gets another number, the test fails
  // and ends there (as Must ends it).
  std::vector<v1::TaskLease> MustLeaseExactly(const Enrolled& executor, int n) {
    std::vector<v1::TaskLease> leases = MustLease(executor, n);
    EXPECT_EQ(leases.size(), static_cast<size_t>(n)) << executor.id;
    if (leases.size() != static_cast<size_t>(n)) throw std::runtime_error(executor.id + ": another number of tasks");
    return leases;
  }
  // Writes a task's output as an executor would and completes it.
  grpc::Status CompleteLease(const Enrolled& executor, const v1::TaskLease& lease) {
    auto input = Must(FileUrlPath(lease.input_url()));
    std::ifstream in(input, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string range = all.substr(lease.byte_begin(), lease.byte_end() - lease.byte_begin());
    std::string output;
    int64_t n = 0;
    for (size_t start = 0; start < range.size();) {
      size_t end = range.find('\n', start);
      if (end == std::string::npos) end = range.size();
      std::string line = range.substr(start, end - start);
      auto id_start = line.find("\"custom_id\":\"") + 13;
      std::string id = line.substr(id_start, line.find('"', id_start) - id_start);
      absl::StrAppend(&output, R"({"custom_id":")", id, R"(","response":{"status_code":200,"body":{}},"error":null})",
                      "\n");
      ++n;
      start = end + 1;
    }
    EXPECT_TRUE(WriteFileAtomically(Must(FileUrlPath(lease.chunk_urls(0).output_url())), output).ok());
    EXPECT_TRUE(WriteFileAtomically(Must(FileUrlPath(lease.chunk_urls(0).errors_url())), "").ok());
    v1::CompleteRequest request;
    *request.mutable_ref() = lease.ref();
    request.mutable_ref()->set_records_done(n);
    v1::CompleteResponse reply;
    return executors_->Complete(As(executor.credential).get(), request, &reply);
  }

  Job StoreJob(const std::string& id) { return Must(store_->GetJob(id)); }

  std::string dir_;
  RealClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<LocalBlobStore> blobs_;
  std::string model_;
  std::unique_ptr<ControlPlane> server_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Executors::Stub> executors_;
  std::unique_ptr<v1::Admin::Stub> admin_stub_;
  std::string admin_;
};

}  // namespace minions::testing
