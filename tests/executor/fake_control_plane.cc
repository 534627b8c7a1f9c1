#include "fake_control_plane.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "model/identity.h"
#include "rpc/rpc.h"
#include "server/keys.h"
#include "testing/fake_watchdog_lock.h"
#include "testing/temp_dir.h"
#include "testing/status_checks.h"

namespace minions::testing {

// The executor's calls, made as the executor its request names: the typed methods of the service
// are its calls for a caller already authenticated (an executor's credential is what a real
// server checks first; tests/server and tests/security cover that).
class FakeControlPlane::Client : public ControlPlaneClient {
 public:
  explicit Client(FakeControlPlane* server) : server_(server) {}

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    return server_->Call<v1::RegisterResponse>([&](ExecutorService& s, v1::RegisterResponse* reply) {
      return s.Register(request.executor_id(), request, reply, /*may_join_gangs=*/true);  // enrolled with --gang
    });
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override {
    ++server_->heartbeats_;
    return server_->Call<v1::HeartbeatResponse>([&](ExecutorService& s, v1::HeartbeatResponse* reply) {
      return s.Heartbeat(request.executor_id(), request, reply);
    });
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) override {
    v1::LeaseRequest at_once = request;
    at_once.set_wait_ms(0);  // the test's driver moves time: nothing may wait for it
    if (server_->older_lease_answers_) at_once.set_idle(false);  // a server that knows no idle polls
    if (request.reclaim()) ++server_->reclaims_;
    auto reply = server_->Call<v1::LeaseResponse>([&](ExecutorService& s, v1::LeaseResponse* reply) {
      return s.Lease(at_once.executor_id(), nullptr, at_once, reply);
    });
    if (reply.ok() && server_->lease_answers_to_lose_ > 0) {
      --server_->lease_answers_to_lose_;
      return absl::UnavailableError("the server died before it answered (the test lost the answer)");
    }
    return reply;
  }
  absl::Status Complete(const v1::CompleteRequest& request) override {
    return server_
        ->Call<v1::CompleteResponse>([&](ExecutorService& s, v1::CompleteResponse*) {
          return s.Complete(request.executor_id(), request);
        })
        .status();
  }
  absl::StatusOr<v1::CompleteBatchResponse> CompleteBatch(const v1::CompleteBatchRequest& request) override {
    return server_->Call<v1::CompleteBatchResponse>([&](ExecutorService& s, v1::CompleteBatchResponse* reply) {
      return s.CompleteBatch(request.executor_id(), request, reply);
    });
  }
  absl::Status Fail(const v1::FailRequest& request) override {
    return server_
        ->Call<v1::FailResponse>([&](ExecutorService& s, v1::FailResponse*) { return s.Fail(request.executor_id(), request); })
        .status();
  }
  absl::StatusOr<v1::LeaseVerificationsResponse> LeaseVerifications(
      const v1::LeaseVerificationsRequest& request) override {
    if (!server_->options_.spot_checks) return ControlPlaneClient::LeaseVerifications(request);
    return server_->Call<v1::LeaseVerificationsResponse>(
        [&](ExecutorService& s, v1::LeaseVerificationsResponse* reply) {
          return s.LeaseVerifications(request.executor_id(), request, reply);
        });
  }
  absl::Status ReportVerifications(const v1::ReportVerificationsRequest& request) override {
    if (!server_->options_.spot_checks) return ControlPlaneClient::ReportVerifications(request);
    return server_
        ->Call<v1::ReportVerificationsResponse>([&](ExecutorService& s, v1::ReportVerificationsResponse*) {
          return s.ReportVerifications(request.executor_id(), request);
        })
        .status();
  }

 private:
  FakeControlPlane* server_;
};

template <typename Reply>
absl::StatusOr<Reply> FakeControlPlane::Call(const std::function<absl::Status(ExecutorService&, Reply*)>& call) {
  ++calls_;
  if (down_) return absl::UnavailableError("cannot reach the Minions server: connection refused (the test took it down)");
  Reply reply;
  if (absl::Status status = call(control_plane_->executors(), &reply); !status.ok()) return status;
  return reply;
}

FakeControlPlane::FakeControlPlane(Clock* clock, Options options) : clock_(clock), options_(options) {
  dir_ = std::filesystem::canonical(testing::MakeTempDir("minions-fake-cp")).string();  // real paths, as ModelAccess resolves them
  models_dir_ = dir_ + "/models";
  model_path_ = models_dir_ + "/fake.gguf";
  std::filesystem::create_directories(models_dir_);
  std::ofstream(model_path_) << "GGUF";
  StoreOptions store_options;
  store_options.spot_checks = options_.spot_checks;
  auto store = SqliteMetadataStore::Open(":memory:", store_options);
  auto blobs = LocalBlobStore::Open(dir_ + "/objects");
  if (!store.ok() || !blobs.ok()) std::abort();
  store_ = std::move(*store);
  blobs_ = std::move(*blobs);
  // The watchdog as `minions server` sets it for the TTL; the rest of the test's options kept.
  const WatchdogOptions server_watchdog = ServerWatchdogOptions(options_.lease_ttl);
  options_.watchdog.executor_timeout = server_watchdog.executor_timeout;
  options_.watchdog.takeover_grace = server_watchdog.takeover_grace;
  Restart();
}

void FakeControlPlane::Restart() {
  down_ = false;
  // The process before (if any) ends first: it shares the store with the new one.
  control_plane_.reset();
  ControlPlaneOptions options;
  options.server.lease_ttl = options_.lease_ttl;
  options.server.idle_polls_renew = options_.idle_polls_renew;
  options.server.spot_checks = options_.spot_checks;  // as the store's
  options.server.verify_wait = options_.verify_wait;
  options.server.check_model_paths = false;  // the fake runners load no file
  options.server.background_thread = false;  // Tick runs its work, on the test's thread
  options.watchdog = options_.watchdog;
  control_plane_ = std::make_unique<ControlPlane>(store_.get(), blobs_.get(), clock_, std::move(options),
                                                  std::make_unique<testing::FakeWatchdogLock>());
  next_watchdog_at_ = clock_->Now();
}

FakeControlPlane::~FakeControlPlane() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::unique_ptr<ControlPlaneClient> FakeControlPlane::NewClient() { return std::make_unique<Client>(this); }

absl::StatusOr<std::string> FakeControlPlane::Submit(const std::vector<std::string>& lines, int64_t shard_size,
                                                     int max_attempts, absl::Duration completion_window,
                                                     const std::string& runner, const std::string& model,
                                                     int gang_size) {
  v1::SubmitJobRequest request;
  std::string input;
  for (const auto& line : lines) absl::StrAppend(&input, line, "\n");
  request.set_input(input);
  request.set_model(model.empty() ? model_path_ : model);
  request.set_shard_size(shard_size);
  request.set_max_attempts(max_attempts);
  request.set_completion_window_ms(absl::ToInt64Milliseconds(completion_window));
  request.set_runner(runner);
  request.set_gang_size(gang_size);
  // Submitted as the pool's admin would, into the default team.
  const Caller admin{"tok-fakecp000000", Role::kAdmin, "", "tests", DefaultScopes(Role::kAdmin)};
  auto job = control_plane_->jobs().Submit(admin, request);
  if (!job.ok()) return job.status();
  return job->id;
}

absl::StatusOr<std::string> FakeControlPlane::AddModel(const std::string& name, const std::string& bytes) {
  Sha256 hash;
  hash.Update(bytes);
  const std::string hex = hash.HexDigest();
  ModelRecord model;
  model.team = kDefaultTeam;  // the team of Submit's jobs (an admin's, naming none)
  model.name = name;
  model.digest = "sha256:" + hex;
  model.size_bytes = static_cast<int64_t>(bytes.size());
  model.blob_key = keys::ModelBlob(model.team, hex);
  model.created_by = "tests";
  model.created_at = clock_->Now();
  RETURN_IF_ERROR(blobs_->Put(model.blob_key, bytes));
  RETURN_IF_ERROR(store_->AddModel(model).status());
  return model.digest;
}

// Cancel and drain as the Jobs service does them (its gRPC methods ask for a credential).
absl::Status FakeControlPlane::Cancel(const std::string& job_id) {
  return store_->CancelJob(job_id, clock_->Now()).status();
}

absl::Status FakeControlPlane::Drain(const std::string& executor_id) {
  return store_->RequestDrain(executor_id, clock_->Now());
}

void FakeControlPlane::Tick(absl::Time now) {
  if (down_) return;
  // The control plane's background work, its finaliser's and its watchdog's, on the test's thread:
  // the reported jobs at every tick, the watchdog and the sweep when the watchdog is due.
  EXPECT_OK(control_plane_->FinalizeReportedJobs());
  if (now < next_watchdog_at_) return;
  next_watchdog_at_ = now + options_.watchdog.interval;
  auto pass = control_plane_->RunWatchdogPass(now);
  EXPECT_TRUE(pass.ok()) << pass.status();
  EXPECT_OK(control_plane_->SweepReadyJobs());
}

Job FakeControlPlane::GetJob(const std::string& job_id) {
  auto job = store_->GetJob(job_id);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : Job{};
}

std::vector<Task> FakeControlPlane::Tasks(const std::string& job_id) {
  auto tasks = store_->ListTasks(job_id);
  EXPECT_TRUE(tasks.ok()) << tasks.status();
  return tasks.ok() ? *tasks : std::vector<Task>{};
}

std::vector<Json> FakeControlPlane::Results(const std::string& job_id, bool errors) {
  Job job = GetJob(job_id);
  const std::string& key = errors ? job.errors_key : job.output_key;
  std::vector<Json> lines;
  if (key.empty()) return lines;
  auto data = blobs_->Get(key);
  if (!data.ok()) return lines;  // no error file: no error lines
  std::istringstream in(*data);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto json = ParseJson(line);
    EXPECT_TRUE(json.ok()) << line;
    if (json.ok()) lines.push_back(*json);
  }
  return lines;
}

}  // namespace minions::testing
