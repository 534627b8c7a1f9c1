#pragma once
// The fixture of the gRPC service tests (grpc_service_test.cc, attack_test.cc): a ControlPlane on a
// loopback port over SQLite in memory and a local blob store, driven only through real stubs, the
// way the client verbs and executors talk to it; and what an honest executor does with a lease.

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "blob/local/local_blob_store.h"
#include "minions/v1/minions.grpc.pb.h"
#include "cli/client_verbs.h"
#include "rpc/rpc.h"
#include "runner/batch_record.h"
#include "identity/token.h"
#include "server/control_plane.h"
#include "server_test_util.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/fake_clock.h"
#include "testing/grpc_checks.h"
#include "testing/prometheus_text.h"

namespace minions::testing {

constexpr absl::Duration kLeaseTtl = absl::Seconds(9);

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// `n` request lines r0..r{n-1}.
inline std::string Records(int n) {
  std::string input;
  for (int i = 0; i < n; ++i) absl::StrAppend(&input, RequestLine(absl::StrCat("r", i)), "\n");
  return input;
}

inline std::vector<std::string> CustomIds(const std::string& jsonl) {
  std::vector<std::string> ids;
  for (absl::string_view line : absl::StrSplit(jsonl, '\n', absl::SkipEmpty())) {
    auto json = ParseJson(std::string(line));
    ids.push_back(json.ok() && json->contains("custom_id") && (*json)["custom_id"].is_string()
                      ? (*json)["custom_id"].get<std::string>()
                      : "<bad line>");
  }
  return ids;
}

// The fixture's blob store, except that URLs of keys containing `fail_urls_for` cannot be made
// (a presigner that is down, say).
class UrlFailingBlobStore : public ForwardingBlobStore {
 public:
  UrlFailingBlobStore(BlobStore* inner, std::string fail_urls_for)
      : ForwardingBlobStore(inner), fail_urls_for_(std::move(fail_urls_for)) {}
  absl::StatusOr<std::string> Url(const std::string& key, UrlAccess access, absl::Duration ttl) override {
    if (key.find(fail_urls_for_) != std::string::npos) return absl::UnavailableError("cannot presign " + key);
    return ForwardingBlobStore::Url(key, access, ttl);
  }

 private:
  std::string fail_urls_for_;
};

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteMetadataStore::Open(":memory:", StoreOptions{});
    ASSERT_OK(store);
    store_ = std::move(*store);
    auto blobs = LocalBlobStore::Open(dir_.File("blobs"));
    ASSERT_OK(blobs);
    blobs_ = std::move(*blobs);
    model_ = dir_.File("tiny.gguf");
    std::ofstream(model_) << "GGUF but not really";
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  ServerOptions Options() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.check_model_paths = true;
    options.lease_ttl = kLeaseTtl;
    return options;
  }

  // Starts the server on `clock` (the fake clock unless a test needs real time to pass).
  void StartServer(Clock* clock, ServerOptions options, BlobStore* blobs = nullptr) {
    clock_ = clock;
    options.background_thread = clock != &fake_clock_;
    server_ = std::make_unique<ControlPlane>(store_.get(), blobs ? blobs : blobs_.get(), clock,
                                             ControlPlaneOptions{options});
    ASSERT_OK(server_->Start());
    Connect();
  }
  void StartServer() { StartServer(&fake_clock_, Options()); }

  // Stubs to the started server_, and the credentials the calls present.
  void Connect() {
    ASSERT_GT(server_->port(), 0);
    auto channel = rpc::MakeChannel(server_->address());
    jobs_ = v1::Jobs::NewStub(channel);
    executors_ = v1::Executors::NewStub(channel);
    // Credentials: the Jobs calls are an admin's; executors enrol with a join token.
    token_ = Issue(Role::kAdmin, "", "tests");
    IssueRequest join;
    join.role = Role::kJoin;
    join.principal = "tests";
    join.uses = 1000;
    ASSERT_OK_AND_ASSIGN(IssuedToken join_token, server_->identities().Issue(join, "local"));
    join_token_ = join_token.text;
  }

  // A fresh token's text.
  std::string Issue(Role role, const std::string& team, const std::string& principal) {
    IssueRequest request;
    request.role = role;
    request.team = team;
    request.principal = principal;
    absl::StatusOr<IssuedToken> issued = server_->identities().Issue(request, "local");
    EXPECT_TRUE(issued.ok()) << issued.status();
    return issued.ok() ? issued->text : "";
  }

  // A context carrying the admin's token (or `token`) and a deadline.
  std::unique_ptr<grpc::ClientContext> Context(const std::string* token = nullptr) {
    auto context = std::make_unique<grpc::ClientContext>();
    rpc::Prepare(*context, token ? *token : token_, absl::Seconds(10));
    return context;
  }
  // A context carrying an executor's own credential.
  std::unique_ptr<grpc::ClientContext> ExecutorContext(const std::string& executor_id) {
    return Context(&credentials_[executor_id]);
  }

  v1::SubmitJobRequest Request(const std::string& input, int64_t shard_size = 3) {
    v1::SubmitJobRequest request;
    request.set_input(input);
    request.set_model(model_);
    request.set_shard_size(shard_size);
    return request;
  }

  // As the CLI submits: an input over kMaxInlineInputBytes travels in parts (Jobs.UploadInput).
  grpc::Status Submit(const v1::SubmitJobRequest& request, v1::Job* job) {
    absl::StatusOr<v1::Job> submitted = cli::SubmitJob(*jobs_, token_, request, absl::Seconds(60));
    if (!submitted.ok()) return rpc::ToGrpc(submitted.status());
    *job = *std::move(submitted);
    return grpc::Status::OK;
  }
  // The reply of `call(&reply)`, a call that must succeed (the test fails otherwise).
  template <typename Reply, typename Call>
  static Reply MustReply(Call call) {
    Reply reply;
    grpc::Status status = call(&reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply;
  }
  v1::Job MustSubmit(const std::string& input, int64_t shard_size = 3) {
    return MustReply<v1::Job>([&](v1::Job* job) { return Submit(Request(input, shard_size), job); });
  }

  grpc::Status GetJob(const std::string& job_id, v1::Job* job) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    return jobs_->GetJob(Context().get(), request, job);
  }
  v1::Job MustGetJob(const std::string& job_id) {
    return MustReply<v1::Job>([&](v1::Job* job) { return GetJob(job_id, job); });
  }
  grpc::Status Cancel(const std::string& job_id, v1::Job* job) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    return jobs_->CancelJob(Context().get(), request, job);
  }

  // The whole stream of GetResults: its status, and the bytes received.
  std::pair<grpc::Status, std::string> Results(const std::string& job_id, bool errors = false) {
    v1::GetResultsRequest request;
    request.set_job_id(job_id);
    request.set_errors(errors);
    auto context = Context();
    auto reader = jobs_->GetResults(context.get(), request);
    std::string data;
    v1::ResultsChunk chunk;
    while (reader->Read(&chunk)) data += chunk.data();
    return {reader->Finish(), data};
  }

  std::pair<grpc::Status, std::vector<v1::JobProgress>> Watch(const std::string& job_id, int64_t interval_ms = 50) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_interval_ms(interval_ms);
    auto context = Context();
    auto reader = jobs_->WatchJob(context.get(), request);
    std::vector<v1::JobProgress> progress;
    v1::JobProgress p;
    while (reader->Read(&p)) progress.push_back(p);
    return {reader->Finish(), progress};
  }

  // Server health after a refused call: it still answers.
  void ExpectServerUp() {
    MustReply<v1::ListJobsResponse>(
        [&](v1::ListJobsResponse* reply) { return jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), reply); });
  }

  // Enrols an executor with the join token, then registers it with its own credential; a CPU
  // machine unless an accelerator (and its device name) is given.
  std::string RegisterExecutor(const std::string& name, const std::string& accelerator = "",
                               const std::string& gpu = "", const std::vector<std::string>& model_folders = {}) {
    v1::RegisterRequest request;
    v1::Capabilities* caps = request.mutable_capabilities();
    for (const std::string& folder : model_folders) caps->add_model_folders(folder);
    caps->set_name(name);
    caps->set_os("linux");
    caps->set_accelerator(accelerator);
    caps->set_gpu(gpu);
    caps->set_memory_bytes(int64_t{16} << 30);
    caps->add_runners("llama");
    caps->set_max_tasks(8);
    v1::EnrolRequest enrol;
    *enrol.mutable_capabilities() = *caps;
    v1::EnrolResponse enrolled = MustReply<v1::EnrolResponse>(
        [&](v1::EnrolResponse* reply) { return executors_->Enrol(Context(&join_token_).get(), enrol, reply); });
    credentials_[enrolled.executor_id()] = enrolled.credential();
    v1::RegisterResponse reply = MustReply<v1::RegisterResponse>([&](v1::RegisterResponse* registered) {
      return executors_->Register(ExecutorContext(enrolled.executor_id()).get(), request, registered);
    });
    EXPECT_EQ(reply.lease_ttl_ms(), absl::ToInt64Milliseconds(kLeaseTtl));
    EXPECT_FALSE(reply.executor_id().empty());
    return reply.executor_id();
  }

  grpc::Status Lease(const std::string& executor_id, int max_tasks, v1::LeaseResponse* reply) {
    v1::LeaseRequest request;
    request.set_executor_id(executor_id);
    request.set_max_tasks(max_tasks);
    return executors_->Lease(ExecutorContext(executor_id).get(), request, reply);
  }
  std::vector<v1::TaskLease> MustLease(const std::string& executor_id, int max_tasks) {
    v1::LeaseResponse reply =
        MustReply<v1::LeaseResponse>([&](v1::LeaseResponse* leased) { return Lease(executor_id, max_tasks, leased); });
    return {reply.leases().begin(), reply.leases().end()};
  }

  // A job of records r0..r{n-1} in tasks of `shard_size`, submitted to the started server, and the
  // one task leased to a new executor `name`.
  struct LeasedJob {
    v1::Job job;
    std::string executor;
    v1::TaskLease lease;
  };
  LeasedJob SubmitAndLeaseOne(int n, int64_t shard_size, const std::string& name) {
    v1::Job job = MustSubmit(Records(n), shard_size);
    std::string executor = RegisterExecutor(name);
    v1::TaskLease lease = MustLeaseOne(executor);
    return {std::move(job), std::move(executor), std::move(lease)};
  }

  // The one task leased to `executor_id`. Where it gets none, the test fails and ends there (as
  // testing::Must ends it).
  v1::TaskLease MustLeaseOne(const std::string& executor_id) {
    std::vector<v1::TaskLease> leases = MustLease(executor_id, 1);
    EXPECT_EQ(leases.size(), 1u) << executor_id << " was leased " << leases.size() << " tasks";
    if (leases.size() != 1) throw std::runtime_error(executor_id + " was not leased one task");
    return leases[0];
  }

  grpc::Status Complete(const std::string& executor_id, const v1::LeaseRef& ref, int64_t done, int64_t failed = 0) {
    v1::CompleteRequest request;
    request.set_executor_id(executor_id);
    *request.mutable_ref() = ref;
    request.mutable_ref()->set_records_done(done);
    request.mutable_ref()->set_records_failed(failed);
    v1::CompleteResponse reply;
    return executors_->Complete(ExecutorContext(executor_id).get(), request, &reply);
  }
  grpc::Status Fail(const std::string& executor_id, const v1::LeaseRef& ref, const std::string& failure_class,
                    const std::string& message = "it broke") {
    v1::FailRequest request;
    request.set_executor_id(executor_id);
    *request.mutable_ref() = ref;
    request.set_failure_class(failure_class);
    request.set_message(message);
    v1::FailResponse reply;
    return executors_->Fail(ExecutorContext(executor_id).get(), request, &reply);
  }

  // What an executor does with a lease: read its input range by URL, answer every record, write
  // the output and error files by URL. Returns (records, error lines).
  std::pair<int64_t, int64_t> Serve(const v1::TaskLease& lease) {
    auto input_path = FileUrlPath(lease.input_url());
    EXPECT_OK(input_path);
    std::string input = ReadFile(*input_path);
    EXPECT_LE(lease.byte_end(), static_cast<int64_t>(input.size()));
    std::string range = input.substr(lease.byte_begin(), lease.byte_end() - lease.byte_begin());
    std::string output, errors;
    int64_t records = 0, failed = 0;
    for (const std::string& line : SplitRecordLines(range)) {
      ++records;
      ParsedRecord parsed = ParseRecordLine(line);
      if (parsed.ok()) {
        output += DumpJson(MakeResponseLine(parsed.custom_id, Json{{"echo", parsed.custom_id}})) + "\n";
      } else {
        ++failed;
        errors += DumpJson(MakeErrorLine(parsed.custom_id, parsed.error_code, parsed.error_message)) + "\n";
      }
    }
    EXPECT_EQ(records, lease.n_records());
    auto output_path = FileUrlPath(lease.chunk_urls(0).output_url());
    auto errors_path = FileUrlPath(lease.chunk_urls(0).errors_url());
    EXPECT_OK(output_path);
    EXPECT_OK(errors_path);
    EXPECT_OK(WriteFileAtomically(*output_path, output));
    EXPECT_OK(WriteFileAtomically(*errors_path, errors));
    return {records, failed};
  }

  // The job once it is in `state`. On the fake clock the server has no background thread: one
  // pass of its loop, run here, finalises what is ready. On the real clock, polls for it.
  v1::Job WaitForState(const std::string& job_id, const std::string& state,
                       absl::Duration timeout = absl::Seconds(5)) {
    v1::Job job;
    if (clock_ == &fake_clock_) {
      server_->RunBackgroundPass();
      job = MustGetJob(job_id);
      EXPECT_EQ(job.state(), state) << "job " << job_id << " after a pass of the server's loop";
      return job;
    }
    absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      job = MustGetJob(job_id);
      if (job.state() == state) return job;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "job " << job_id << " is " << job.state() << " after " << timeout << ", not " << state;
    return job;
  }

  // Submits `records` records and runs the job to completion.
  v1::Job CompletedJob(int records, int64_t shard_size) {
    v1::Job job = MustSubmit(Records(records), shard_size);
    std::string executor = RegisterExecutor("finisher");
    for (const v1::TaskLease& lease : MustLease(executor, 64)) {
      auto [done, failed] = Serve(lease);
      EXPECT_TRUE(Complete(executor, lease.ref(), done, failed).ok());
    }
    return WaitForState(job.id(), "completed");
  }

  Task StoreTask(const std::string& job_id, int64_t index) {
    auto tasks = store_->ListTasks(job_id);
    EXPECT_OK(tasks);
    for (const Task& t : *tasks) {
      if (t.index == index) return t;
    }
    ADD_FAILURE() << "no task " << index;
    return Task{};
  }

  TempDir dir_;
  FakeClock fake_clock_;
  RealClock real_clock_;
  Clock* clock_ = nullptr;
  std::string model_;
  std::string token_;       // an admin's
  std::string join_token_;  // executors enrol with it
  std::map<std::string, std::string> credentials_;  // executor id -> its credential
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<LocalBlobStore> blobs_;
  std::unique_ptr<ControlPlane> server_;  // after what it points to: destroyed first
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<v1::Executors::Stub> executors_;
};

}  // namespace minions::testing
