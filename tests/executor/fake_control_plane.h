#pragma once
// FakeControlPlane: the control plane inside the test's process, without sockets or threads — a
// real ControlPlane (server/control_plane.h: the services, the finaliser and the watchdog, as
// `minions server` assembles them) over an in-memory SQLite store and a local blob store in a
// temporary folder, never started, all on the test's clock.
// Executors reach it through clients that call the services' methods directly; the server can be
// taken down (every call then fails as an unreachable server's would) and brought back.
//
// What is not real: no gRPC, no authentication, and a lease's long poll is answered at once (the
// test's driver moves time, so nothing may wait for it).
// Ownership: owns the store, the blob store's folder and the ControlPlane.
// Threads: one thread at a time (the test's).

#include <functional>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "blob/local/local_blob_store.h"
#include "common/clock.h"
#include "executor/blob_client.h"
#include "executor/control_plane_client.h"
#include "server/control_plane.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "watchdog/watchdog.h"

namespace minions::testing {

class FakeControlPlane {
 public:
  struct Options {
    absl::Duration lease_ttl = absl::Seconds(9);
    bool idle_polls_renew = true;  // ServerOptions::idle_polls_renew; false: as an older server
    // Its executor timeout and takeover grace are set from the TTL, as in `minions server`
    // (ServerWatchdogOptions).
    WatchdogOptions watchdog;
    // StoreOptions::spot_checks (server.spot_checks): committed chunks get spot checks drawn, and
    // the clients lease and report them. Off: the clients answer those calls Unimplemented.
    bool spot_checks = false;
    absl::Duration verify_wait = absl::Minutes(10);  // ServerOptions::verify_wait
  };
  FakeControlPlane(Clock* clock, Options options);
  ~FakeControlPlane();

  // A client for one executor.
  std::unique_ptr<ControlPlaneClient> NewClient();
  // While down, every call of every client fails Unavailable, as with a server that is away, and
  // the server does nothing in the background.
  void SetDown(bool down) { down_ = down; }
  // Down, then up again as a new process: a new watchdog that waits its takeover grace.
  void Restart();
  bool down() const { return down_; }
  // The next `n` Lease calls are served (their grants committed to the store) and then fail as
  // if the server died before answering: the executor never hears what it was granted.
  void LoseLeaseAnswers(int n) { lease_answers_to_lose_ = n; }
  // While on, Lease calls are answered as a server of the previous version answers them (one
  // behind the same address): LeaseRequest.idle is unknown to it, so it renews no one from a poll
  // and its answers never say idle_renewed.
  void AnswerLeasesAsAnOlderServer(bool on) { older_lease_answers_ = on; }
  // Lease calls made with LeaseRequest.reclaim, and the leases they were granted.
  int reclaims() const { return reclaims_.load(); }
  int calls() const { return calls_.load(); }
  // Heartbeat calls made by every client so far, and liveness renewals the server made from idle
  // polls (ExecutorService::idle_renewals).
  int heartbeats() const { return heartbeats_.load(); }
  int64_t idle_renewals() const { return control_plane_->executors().idle_renewals(); }

  // The model every job names: an empty file in this server's folder (the fake runners read
  // nothing), so the agent's ModelAccess resolves it like a real model in an owner's folder.
  const std::string& model_path() const { return model_path_; }
  const std::string& models_dir() const { return models_dir_; }

  // Submits `lines` as one job (the model is `model`, else model_path(); `runner` "" is the
  // built-in one; `gang_size` >= 2: a gang job); returns its id.
  absl::StatusOr<std::string> Submit(const std::vector<std::string>& lines, int64_t shard_size, int max_attempts = 0,
                                     absl::Duration completion_window = absl::ZeroDuration(),
                                     const std::string& runner = "", const std::string& model = "",
                                     int gang_size = 0);
  // A registry model `name` of the jobs' team holding `bytes`, as a finished push leaves it (its
  // bytes under their digest in the object store, its row in the registry); returns its digest.
  absl::StatusOr<std::string> AddModel(const std::string& name, const std::string& bytes);
  absl::Status Cancel(const std::string& job_id);
  absl::Status Drain(const std::string& executor_id);

  // What the server does in the background: finalise the jobs ready for it, and a watchdog pass
  // when one is due.
  void Tick(absl::Time now);
  absl::Time NextTickAt() const { return down_ ? absl::InfiniteFuture() : next_watchdog_at_; }

  MetadataStore& store() { return *store_; }
  Job GetJob(const std::string& job_id);
  std::vector<Task> Tasks(const std::string& job_id);
  // The lines of a finished job's merged output (or error) file, parsed.
  std::vector<Json> Results(const std::string& job_id, bool errors);

 private:
  class Client;
  template <typename Reply>
  absl::StatusOr<Reply> Call(const std::function<absl::Status(ExecutorService&, Reply*)>& call);

  Clock* clock_;
  Options options_;
  std::string dir_;
  std::string models_dir_;
  std::string model_path_;
  std::unique_ptr<SqliteMetadataStore> store_;
  std::unique_ptr<LocalBlobStore> blobs_;
  // A new one for each process (Restart); after the store and blobs it uses.
  std::unique_ptr<ControlPlane> control_plane_;
  absl::Time next_watchdog_at_;
  std::atomic<bool> down_{false};
  std::atomic<int> calls_{0};
  std::atomic<int> lease_answers_to_lose_{0};
  std::atomic<bool> older_lease_answers_{false};
  std::atomic<int> reclaims_{0};
  std::atomic<int> heartbeats_{0};
};

// A BlobClient that breaks on demand (LevelDB's fault-injecting Env, for uploads and fetches):
// the real one underneath, and a count of calls to fail.
class FaultyBlobClient : public BlobClient {
 public:
  explicit FaultyBlobClient(std::unique_ptr<BlobClient> real) : real_(std::move(real)) {}
  absl::StatusOr<std::string> GetRange(const std::string& url, int64_t begin, int64_t end) override {
    if (fail_gets_ > 0) {
      --fail_gets_;
      return absl::UnavailableError("the object store is out of reach (injected)");
    }
    return real_->GetRange(url, begin, end);
  }
  absl::Status Put(const std::string& url, std::string_view data) override {
    ++puts_;
    if (on_put_) on_put_();
    if (fail_puts_ > 0) {
      --fail_puts_;
      return absl::UnavailableError("the object store is out of reach (injected)");
    }
    return real_->Put(url, data);
  }
  void FailGets(int n) { fail_gets_ = n; }
  void FailPuts(int n) { fail_puts_ = n; }
  // Runs inside every Put, before it does anything (a call that takes its time).
  void OnPut(std::function<void()> hook) { on_put_ = std::move(hook); }
  int puts() const { return puts_; }

 private:
  std::unique_ptr<BlobClient> real_;
  std::function<void()> on_put_;
  int fail_gets_ = 0;
  int fail_puts_ = 0;
  int puts_ = 0;
};

}  // namespace minions::testing
