// The control plane's own work, off the services: finalisation runs on a worker of its own, so the
// watchdog's passes go on while a large merge is under way (server/control_plane.h).

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "grpc_service_fixture.h"
#include "server/keys.h"
#include "testing/fake_watchdog_lock.h"

namespace minions::testing {
namespace {

// The fixture's blob store, except that writing a job's merged output waits until the test opens
// the gate: a finalisation that takes as long as the test wants (a merge of a large job).
class GatedBlobStore : public ForwardingBlobStore {
 public:
  using ForwardingBlobStore::ForwardingBlobStore;
  absl::Status PutStream(const std::string& key, const std::function<absl::StatusOr<std::string>()>& source) override {
    if (absl::StrContains(key, "/results/") && absl::EndsWith(key, "/output.jsonl")) {
      if (!entered.HasBeenNotified()) entered.Notify();
      open.WaitForNotification();
    }
    return ForwardingBlobStore::PutStream(key, source);
  }
  absl::Notification entered;  // a merge is under way
  absl::Notification open;      // the test lets it finish
};

// Until the store says task 0 of `job_id` is in `state` (the control plane's threads move it).
TaskState AwaitTaskState(MetadataStore& store, const std::string& job_id, TaskState state) {
  TaskState now = TaskState::kPending;
  for (int i = 0; i < 20000; ++i) {
    auto tasks = store.ListTasks(job_id);
    if (tasks.ok() && !tasks->empty()) now = (*tasks)[0].state;
    if (now == state) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return now;
}

TEST_F(GrpcServiceTest, AJobsMergeInProgressDoesNotHoldBackLeaseExpiry) {
  GatedBlobStore gated(blobs_.get());
  ControlPlaneOptions options{Options(), ServerWatchdogOptions(kLeaseTtl)};
  options.server.background_thread = true;  // the finaliser's and the watchdog's threads, on the fake clock
  options.watchdog->takeover_grace = absl::ZeroDuration();
  clock_ = &fake_clock_;
  server_ = std::make_unique<ControlPlane>(store_.get(), &gated, &fake_clock_, options,
                                           std::make_unique<FakeWatchdogLock>());
  // The server's threads use `gated`: they end before it does, whichever way the test ends (the
  // fixture's TearDown came after `gated` was gone, and the finaliser's thread, still at work after
  // the merge, once read freed memory).
  absl::Cleanup stop_first = [this, &gated] {
    if (!gated.open.HasBeenNotified()) gated.open.Notify();  // a test that failed early: let the merge end
    server_->Shutdown();
    server_.reset();
  };
  ASSERT_OK(server_->Start());
  Connect();

  v1::Job merged = MustSubmit(Records(3), 3);
  v1::Job stalled = MustSubmit(Records(3), 3);
  const std::string executor = RegisterExecutor("worker");
  std::vector<v1::TaskLease> leases = MustLease(executor, 2);
  ASSERT_EQ(leases.size(), 2u);
  // The first job's one task finishes: its merge starts on the finaliser's thread and is held.
  for (const v1::TaskLease& lease : leases) {
    if (lease.ref().job_id() != merged.id()) continue;
    auto [done, failed] = Serve(lease);
    ASSERT_GRPC_OK(Complete(executor, lease.ref(), done, failed));
  }
  gated.entered.WaitForNotification();

  // The other job's executor goes silent: its lease expires while the merge is still held.
  fake_clock_.Advance(kLeaseTtl + absl::Seconds(1));
  EXPECT_EQ(AwaitTaskState(*store_, stalled.id(), TaskState::kPending), TaskState::kPending)
      << "the watchdog requeues an expired lease while a merge is under way";
  EXPECT_EQ(MustGetJob(merged.id()).state(), "finalizing") << "the merge is still held";

  gated.open.Notify();
  std::string state;
  for (int i = 0; i < 20000 && state != "completed"; ++i) {
    state = MustGetJob(merged.id()).state();
    if (state != "completed") absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(state, "completed");
}

}  // namespace
}  // namespace minions::testing
