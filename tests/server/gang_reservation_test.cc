// Gang reservation with a fake clock: the fewest executors whose memory suffices, all or nothing,
// the reservation timeout, and no deadlock between two gang jobs and a stream of single jobs.

#include "server/gang_reservation.h"

#include <deque>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/gang_leasing.h"
#include "store/sqlite/sqlite_metadata_store.h"
#include "testing/even_tasks.h"
#include "testing/fake_clock.h"
#include "testing/must.h"

namespace minions {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Verdict = GangReserver::Verdict;

constexpr int64_t kGiB = int64_t{1} << 30;

GangCandidate Exec(const std::string& id, int64_t gib, const std::string& address = "") {
  return {id, gib * kGiB, address.empty() ? "10.9.0." + id : address};
}

std::vector<std::string> Ids(const std::vector<GangCandidate>& gang) {
  std::vector<std::string> ids;
  for (const auto& m : gang) ids.push_back(m.executor_id);
  return ids;
}

TEST(ChooseGang, TheFewestExecutorsWhoseMemorySufficesLargestFirst) {
  std::vector<GangCandidate> fleet = {Exec("a", 16), Exec("b", 64), Exec("c", 32), Exec("d", 32)};
  auto gang = ChooseGang({"j/0", 90 * kGiB, 0}, fleet);
  ASSERT_TRUE(gang.ok()) << gang.status();
  EXPECT_THAT(Ids(*gang), ElementsAre("b", "c"));  // 96 GiB; the leader has the most memory
  gang = ChooseGang({"j/0", 100 * kGiB, 0}, fleet);
  ASSERT_TRUE(gang.ok());
  EXPECT_THAT(Ids(*gang), ElementsAre("b", "c", "d"));
  // A model one executor could hold still gets two when a gang is asked for.
  gang = ChooseGang({"j/0", 1 * kGiB, 0}, fleet);
  ASSERT_TRUE(gang.ok());
  EXPECT_EQ(gang->size(), 2u);
  // --gang 3: exactly three, the largest.
  gang = ChooseGang({"j/0", 0, 3}, fleet);
  ASSERT_TRUE(gang.ok());
  EXPECT_THAT(Ids(*gang), ElementsAre("b", "c", "d"));
}

TEST(ChooseGang, NotFoundWhenTheFleetCannotAndNeverAnExecutorWithoutAGangNetwork) {
  std::vector<GangCandidate> fleet = {Exec("a", 16), Exec("b", 64), {"c", 512 * kGiB, ""}};
  auto gang = ChooseGang({"j/0", 100 * kGiB, 0}, fleet);
  EXPECT_EQ(gang.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gang.status().message()), HasSubstr("2 candidates with a gang network"));
  EXPECT_EQ(ChooseGang({"j/0", 0, 3}, fleet).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ChooseGang({"j/0", 0, 1}, fleet).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GangReserver, AllOrNothing) {
  testing::FakeClock clock;
  GangReserver reserver(&clock, absl::Seconds(30));
  ASSERT_TRUE(reserver.Begin({"j/0", 0, 3}, {Exec("a", 8), Exec("b", 8), Exec("c", 8)}).ok());
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kHeld);
  EXPECT_EQ(reserver.CheckIn("x").verdict, Verdict::kFree);  // not named: single work as usual
  EXPECT_EQ(reserver.CheckIn("b").verdict, Verdict::kHeld);
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kHeld);  // asking again changes nothing
  auto formed = reserver.CheckIn("c");
  ASSERT_EQ(formed.verdict, Verdict::kFormed);
  EXPECT_EQ(formed.request.key, "j/0");
  EXPECT_THAT(Ids(formed.members), ElementsAre("a", "b", "c"));
  // Done: every executor is free again, and the next gang may begin.
  EXPECT_FALSE(reserver.busy());
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kFree);
  EXPECT_TRUE(reserver.Begin({"j/1", 0, 2}, {Exec("a", 8), Exec("b", 8)}).ok());
}

TEST(GangReserver, OneReservationAtATime) {
  testing::FakeClock clock;
  GangReserver reserver(&clock, absl::Seconds(30));
  ASSERT_TRUE(reserver.Begin({"j/0", 0, 2}, {Exec("a", 8), Exec("b", 8)}).ok());
  auto second = reserver.Begin({"k/0", 0, 2}, {Exec("c", 8), Exec("d", 8)});
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.message()), HasSubstr("one reservation at a time"));
  EXPECT_EQ(reserver.CheckIn("c").verdict, Verdict::kFree);
}

TEST(GangReserver, APartialReservationTimesOutAndIsReleased) {
  testing::FakeClock clock;
  GangReserver reserver(&clock, absl::Seconds(30));
  ASSERT_TRUE(reserver.Begin({"j/0", 0, 2}, {Exec("a", 8), Exec("b", 8)}).ok());
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kHeld);
  clock.Advance(absl::Seconds(29));
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kHeld);
  clock.Advance(absl::Seconds(1));
  // b never came: a is free again, nothing is formed, and the gang waits one timeout.
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kFree);
  EXPECT_EQ(reserver.CheckIn("b").verdict, Verdict::kFree);
  EXPECT_EQ(reserver.released(), 1);
  EXPECT_FALSE(reserver.CanBegin("j/0"));
  EXPECT_TRUE(reserver.CanBegin("k/0"));  // another gang may go first
  clock.Advance(absl::Seconds(30));
  EXPECT_TRUE(reserver.Begin({"j/0", 0, 2}, {Exec("a", 8), Exec("c", 8)}).ok());
}

TEST(GangReserver, AMemberThatGoesAwayReleasesTheReservationAtOnce) {
  testing::FakeClock clock;
  GangReserver reserver(&clock, absl::Seconds(30));
  ASSERT_TRUE(reserver.Begin({"j/0", 0, 2}, {Exec("a", 8), Exec("b", 8)}).ok());
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kHeld);
  reserver.Withdraw("z");  // not a member: nothing changes
  EXPECT_TRUE(reserver.busy());
  reserver.Withdraw("b");  // b's owner came back
  EXPECT_FALSE(reserver.busy());
  EXPECT_EQ(reserver.CheckIn("a").verdict, Verdict::kFree);
}

// A fleet of 4 executors, two gang jobs of 3 executors each and a stream of single jobs; every
// tick each idle executor asks for work, as an executor's Lease call does. A gang runs 5 ticks,
// a single job 2. Executor c, busy when the first gang is reserved, has its owner back at tick 1
// (the reservation is released at once) until tick 25. One reservation at a time: both
// gangs run, no executor is held longer than the timeout, and single jobs keep finishing.
TEST(GangReserver, TwoGangJobsAndAStreamOfSingleJobsNeverDeadlock) {
  testing::FakeClock clock;
  const absl::Duration timeout = absl::Seconds(10);
  GangReserver reserver(&clock, timeout);
  std::vector<GangCandidate> fleet = {Exec("a", 8), Exec("b", 8), Exec("c", 8), Exec("d", 8)};
  std::deque<GangRequest> gangs = {{"g1/0", 0, 3}, {"g2/0", 0, 3}};
  std::map<std::string, int> busy_until;       // executor -> tick its work ends
  std::map<std::string, std::string> running;  // executor -> "single" or the gang's key
  std::map<std::string, int> held_since;       // executor -> first tick it was held
  auto away = [](const std::string& id, int now) { return id == "c" && now >= 1 && now < 25; };
  int singles_done = 0, singles_while_gangs_wait = 0, longest_hold = 0;
  std::vector<std::string> gangs_done;
  busy_until["c"] = 3;  // c starts with a single job: the first reservation holds a and b for it
  running["c"] = "single";

  for (int now = 0; now < 200; ++now) {
    if (now == 1) reserver.Withdraw("c");  // the owner is back: c leaves any reservation
    for (auto it = busy_until.begin(); it != busy_until.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      if (running[it->first] == "single") {
        ++singles_done;
        if (!gangs.empty()) ++singles_while_gangs_wait;
      } else if (running[it->first].ends_with("#leader")) {
        gangs_done.push_back(running[it->first]);
      }
      running.erase(it->first);
      it = busy_until.erase(it);
    }
    // The scheduler: the gang at the head of the queue is reserved from the executors present
    // (busy ones included: they check in when their work ends).
    if (!gangs.empty() && reserver.CanBegin(gangs.front().key)) {
      std::vector<GangCandidate> present;
      for (const auto& e : fleet) {
        if (!away(e.executor_id, now)) present.push_back(e);
      }
      auto gang = ChooseGang(gangs.front(), present);
      if (gang.ok()) ASSERT_TRUE(reserver.Begin(gangs.front(), *gang).ok());
    }
    for (const auto& e : fleet) {
      const std::string& id = e.executor_id;
      if (busy_until.contains(id) || away(id, now)) continue;
      auto answer = reserver.CheckIn(id);
      if (answer.verdict == Verdict::kHeld) {  // waits for its gang, takes nothing else
        held_since.try_emplace(id, now);
        longest_hold = std::max(longest_hold, now - held_since[id]);
        continue;
      }
      held_since.erase(id);
      if (answer.verdict == Verdict::kFormed) {
        ASSERT_EQ(answer.request.key, gangs.front().key);
        gangs.pop_front();
        for (size_t m = 0; m < answer.members.size(); ++m) {
          const std::string& member = answer.members[m].executor_id;
          ASSERT_FALSE(busy_until.contains(member)) << member << " joined a gang while busy";
          held_since.erase(member);
          busy_until[member] = now + 5;
          running[member] = answer.request.key + (m == 0 ? "#leader" : "#member");
        }
        continue;
      }
      busy_until[id] = now + 2;  // a single job: the stream never runs dry
      running[id] = "single";
    }
    clock.Advance(absl::Seconds(1));
  }
  EXPECT_THAT(gangs_done, ElementsAre("g1/0#leader", "g2/0#leader"));
  EXPECT_LE(longest_hold, absl::ToInt64Seconds(timeout));
  EXPECT_GT(singles_while_gangs_wait, 0);  // single work flowed while gangs waited for members
  EXPECT_GT(singles_done, 100);
  EXPECT_GE(reserver.released(), 1);  // c's return released the first reservation
  EXPECT_FALSE(reserver.busy());
}

// Gang leasing on a SQLite store in memory and the fake clock.
class GangLeasingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = testing::Must(SqliteMetadataStore::Open(":memory:", StoreOptions{}));
  }

  // A Linux executor of `gib` GiB that runs one task at a time, reachable by its gang at `address`
  // ("": never in a gang): its id.
  std::string Join(const std::string& name, const std::string& address, int64_t gib = 8) {
    ExecutorInfo info;
    info.name = name;
    info.os = "linux";
    info.memory_bytes = gib * kGiB;
    info.runners = {"llama"};
    info.gang_address = address;
    auto executor = store_->RegisterExecutor("", info, clock_.Now());
    EXPECT_TRUE(executor.ok()) << executor.status();
    return executor.ok() ? executor->id : "";
  }

  // A queued job of one task of 10 records for a gang of two.
  void QueueGangJob() {
    auto job = testing::QueueEvenJob(*store_, testing::TenRecordSpec("search", "/models/big.gguf", /*gang_size=*/2), 1,
                                     clock_.Now(), /*bytes_per_task=*/1000);
    ASSERT_TRUE(job.ok()) << job.status();
  }

  testing::FakeClock clock_;
  std::unique_ptr<SqliteMetadataStore> store_;
};

// GangLeasing on a real store: the check-in that completes a reservation grants it (the gang
// seated, the task leased) before any other check-in may begin a reservation. Before, another
// executor's check-in in between (another lease thread) saw the gang's executors unseated and the
// task still pending, and reserved the same two for the same task again; that reservation formed
// the moment the leader checked in after its attempt ended (a member's owner came back), with the
// member that had left: its leader waited a minute for a gate that never answered (the flaky
// GangEndToEnd.AMembersOwnerReturningPreemptsTheAttemptAndNeverWaits). Here the member checks in
// again on another thread while the grant is held at the hook.
TEST_F(GangLeasingTest, NoReservationBeginsWhileACompletedOneIsBeingGranted) {
  const std::string lead = Join("lead", "10.9.0.1:50052", 16);  // the larger leads
  const std::string member = Join("member", "10.9.0.2:50052", 8);
  QueueGangJob();
  GangLeasing gangs(store_.get(), &clock_, GangLeasingOptions{});

  auto begun = gangs.CheckIn(lead, clock_.Now());  // begins the reservation
  ASSERT_TRUE(begun.ok() && begun->held);
  clock_.Advance(absl::Seconds(2));  // a later check-in may look again
  // The member completes it; while its grant is held, the member checks in again elsewhere.
  absl::StatusOr<GangLeasing::CheckInAnswer> again = absl::UnknownError("not checked in");
  std::thread other;
  absl::Notification other_done;
  bool fired = false;
  gangs.SetBeforeFormForTesting([&] {
    if (fired) return;
    fired = true;
    other = std::thread([&] {
      again = gangs.CheckIn(member, clock_.Now());
      other_done.Notify();
    });
    // It waits for the grant, so this wait runs out (2 s); were it not held back, it would have
    // begun another reservation by then.
    other_done.WaitForNotificationWithTimeout(absl::Seconds(2));
  });
  auto formed = gangs.CheckIn(member, clock_.Now());
  if (other.joinable()) other.join();
  ASSERT_TRUE(fired) << "no check-in completed the reservation";
  ASSERT_TRUE(formed.ok() && formed->formed);
  ASSERT_TRUE(again.ok()) << again.status();
  // The other check-in looked only after the grant: the task leased, nothing to reserve (whether
  // it saw the member's duty or not). Without the lock it began reserving the same two again.
  EXPECT_FALSE(gangs.reserving()) << "another reservation was begun for the gang's executors";
  ASSERT_EQ(gangs.TakeDuties(member).size(), 1u);  // its lease answer carries its duty
  auto leased = gangs.CheckIn(lead, clock_.Now());
  ASSERT_TRUE(leased.ok());
  EXPECT_EQ(leased->leases.size(), 1u);
}

// The gang link's secret (docs/security.md, 40.1a): the server mints one per attempt, hands it to
// the leader with its lease and to each member with its duty, and to no one else.
TEST_F(GangLeasingTest, EachAttemptGetsAFreshSecretSharedByItsLeaderAndMembersOnly) {
  const std::string a = Join("a", "10.9.0.1:50052");
  const std::string b = Join("b", "10.9.0.2:50052");
  const std::string bystander = Join("c", "");  // no gang address: never in a gang
  QueueGangJob();
  GangLeasing gangs(store_.get(), &clock_, GangLeasingOptions{});
  std::vector<Lease> leases;
  std::vector<GangDuty> duties;
  // Every check-in's answer is kept (the one that forms the gang carries the leader's lease when
  // the leader made it).
  auto check_in = [&](const std::string& id) {
    auto answer = gangs.CheckIn(id, clock_.Now());
    ASSERT_TRUE(answer.ok());
    for (Lease& lease : answer->leases) leases.push_back(lease);
    for (GangDuty& duty : gangs.TakeDuties(id)) duties.push_back(duty);
  };
  check_in(a);
  clock_.Advance(absl::Seconds(2));
  check_in(b);
  check_in(a);
  check_in(b);
  ASSERT_EQ(leases.size(), 1u);
  ASSERT_EQ(duties.size(), 1u);
  const std::string& secret = leases[0].gang_secret;
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(duties[0].secret, secret);
  EXPECT_TRUE(gangs.TakeDuties(bystander).empty());
}

}  // namespace
}  // namespace minions
