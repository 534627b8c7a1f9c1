// LeaseWaitRoom alone, on the fake clock: a held call is served when it enters, waits parked until
// its wake time or an announcement, goes round again when work was announced while it looked,
// hears a renewal's notice instead of work, and ends when cancelled or the server stops. No gRPC,
// no store: the calls are the room's own Call objects.

#include "server/lease_wait_room.h"

#include <thread>

#include "gtest/gtest.h"
#include "testing/fake_clock.h"

namespace minions {
namespace {

constexpr absl::Duration kScan = absl::Seconds(4);

using AfterLook = LeaseWaitRoom::AfterLook;

class LeaseWaitRoomTest : public ::testing::Test {
 protected:
  // A call that waits up to `wait` from now.
  LeaseWaitRoom::Call* Hold(const std::string& executor_id, absl::Duration wait, bool idle = false,
                            bool spreads = false) {
    calls_.push_back(std::make_unique<LeaseWaitRoom::Call>(executor_id, clock_.Now() + wait, idle, spreads));
    room_.Enter(calls_.back().get(), clock_.Now());
    return calls_.back().get();
  }
  // Next() on another thread, with the clock moved by `step` once it waits.
  LeaseWaitRoom::Turn NextAfter(absl::Duration step) {
    LeaseWaitRoom::Turn turn;
    std::thread taker([&] { turn = room_.Next(); });
    EXPECT_TRUE(clock_.AwaitWaiters(1));
    clock_.Advance(step);
    taker.join();
    return turn;
  }
  // Serves `call` (the room's next) and parks it until `until`.
  void Park(LeaseWaitRoom::Call* call, absl::Time until) {
    ASSERT_EQ(room_.Next().call, call);
    room_.BeginLook(call);
    ASSERT_EQ(room_.EndLook(call, room_.generation(), until), AfterLook::kWaiting);
    room_.ServingEnded(call->spreads);
  }

  testing::FakeClock clock_;
  LeaseWaitRoom room_{&clock_, kScan};
  std::vector<std::unique_ptr<LeaseWaitRoom::Call>> calls_;
};

TEST_F(LeaseWaitRoomTest, AParkedCallIsServedAgainAtItsWakeTime) {
  LeaseWaitRoom::Call* call = Hold("e1", absl::Seconds(30));
  Park(call, clock_.Now() + absl::Seconds(5));
  EXPECT_EQ(room_.waiting(), 1);
  // Nothing before its wake time: the taker waits for exactly that on the clock.
  LeaseWaitRoom::Turn turn = NextAfter(absl::Seconds(5));
  EXPECT_EQ(turn.call, call);
  EXPECT_EQ(room_.waiting(), 0);
  // Its wait is over: it is answered, not parked.
  room_.BeginLook(call);
  EXPECT_EQ(room_.EndLook(call, room_.generation(), std::nullopt), AfterLook::kAnswer);
}

TEST_F(LeaseWaitRoomTest, AnAnnouncementWakesEveryParkedCall) {
  LeaseWaitRoom::Call* a = Hold("e1", absl::Seconds(30));
  LeaseWaitRoom::Call* b = Hold("e2", absl::Seconds(30));
  Park(a, clock_.Now() + absl::Seconds(30));
  Park(b, clock_.Now() + absl::Seconds(30));
  const uint64_t before = room_.generation();
  room_.Announce();
  EXPECT_GT(room_.generation(), before);
  EXPECT_EQ(room_.waiting(), 0);
  // Both ready at once, without the clock moving.
  std::set<LeaseWaitRoom::Call*> served{room_.Next().call, room_.Next().call};
  EXPECT_EQ(served, (std::set<LeaseWaitRoom::Call*>{a, b}));
}

TEST_F(LeaseWaitRoomTest, WorkAnnouncedWhileItLookedSendsItRoundAgain) {
  LeaseWaitRoom::Call* call = Hold("e1", absl::Seconds(30));
  ASSERT_EQ(room_.Next().call, call);
  room_.BeginLook(call);
  const uint64_t looked_as_of = room_.generation();
  room_.Announce();  // while it looked in the store
  EXPECT_EQ(room_.EndLook(call, looked_as_of, clock_.Now() + absl::Seconds(30)), AfterLook::kWaiting);
  EXPECT_EQ(room_.waiting(), 0);  // not parked: ready again
  EXPECT_EQ(room_.Next().call, call);
}

TEST_F(LeaseWaitRoomTest, ACancelledCallIsAnsweredByWhoeverHoldsIt) {
  // Parked: the canceller answers it, and it is never served.
  LeaseWaitRoom::Call* parked = Hold("e1", absl::Seconds(30));
  Park(parked, clock_.Now() + absl::Seconds(30));
  EXPECT_TRUE(room_.Cancel(parked));
  EXPECT_EQ(room_.waiting(), 0);
  // Being served: the server answers it, cancelled, and does not park it.
  LeaseWaitRoom::Call* serving = Hold("e2", absl::Seconds(30));
  ASSERT_EQ(room_.Next().call, serving);
  EXPECT_FALSE(room_.Cancel(serving));
  EXPECT_TRUE(room_.BeginLook(serving).cancelled);
  EXPECT_EQ(room_.EndLook(serving, room_.generation(), clock_.Now() + absl::Seconds(30)), AfterLook::kCancelled);
  EXPECT_EQ(room_.waiting(), 0);
}

TEST_F(LeaseWaitRoomTest, ARenewalsNoticeReachesTheHeldIdlePollInsteadOfWork) {
  LeaseWaitRoom::Call* poll = Hold("e1", absl::Seconds(30), /*idle=*/true);
  EXPECT_TRUE(room_.Polling("e1"));
  Park(poll, clock_.Now() + absl::Seconds(30));
  room_.Tell("e1", {/*drain=*/true, /*reregister=*/false});
  EXPECT_EQ(room_.waiting(), 0);  // woken at once
  ASSERT_EQ(room_.Next().call, poll);
  LeaseWaitRoom::Look look = room_.BeginLook(poll);
  ASSERT_TRUE(look.notice.has_value());
  EXPECT_TRUE(look.notice->drain);
  EXPECT_FALSE(look.notice->reregister);
  EXPECT_FALSE(room_.Polling("e1"));  // answered: it no longer stands for the executor
  // A notice for an executor with no idle poll held is dropped: its next poll hears none.
  room_.Tell("e1", {true, true});
  LeaseWaitRoom::Call* later = Hold("e1", absl::Seconds(30), /*idle=*/true);
  ASSERT_EQ(room_.Next().call, later);
  EXPECT_FALSE(room_.BeginLook(later).notice.has_value());
}

TEST_F(LeaseWaitRoomTest, ANoticeThatCameWhileItLookedIsHeardNext) {
  LeaseWaitRoom::Call* poll = Hold("e1", absl::Seconds(30), /*idle=*/true);
  ASSERT_EQ(room_.Next().call, poll);
  room_.BeginLook(poll);
  room_.Tell("e1", {false, /*reregister=*/true});  // while it looked
  EXPECT_EQ(room_.EndLook(poll, room_.generation(), clock_.Now() + absl::Seconds(30)), AfterLook::kWaiting);
  ASSERT_EQ(room_.Next().call, poll);
  LeaseWaitRoom::Look look = room_.BeginLook(poll);
  ASSERT_TRUE(look.notice.has_value());
  EXPECT_TRUE(look.notice->reregister);
}

TEST_F(LeaseWaitRoomTest, RegisteringAgainForgetsANotice) {
  LeaseWaitRoom::Call* poll = Hold("e1", absl::Seconds(30), /*idle=*/true);
  room_.Tell("e1", {true, false});
  room_.ForgetNotice("e1");
  ASSERT_EQ(room_.Next().call, poll);
  EXPECT_FALSE(room_.BeginLook(poll).notice.has_value());
}

TEST_F(LeaseWaitRoomTest, OnlyTheLatestIdlePollStandsForItsExecutor) {
  LeaseWaitRoom::Call* older = Hold("e1", absl::Seconds(30), /*idle=*/true);
  LeaseWaitRoom::Call* newer = Hold("e1", absl::Seconds(30), /*idle=*/true);
  ASSERT_EQ(room_.Next().call, older);
  room_.BeginLook(older);
  EXPECT_EQ(room_.EndLook(older, room_.generation(), std::nullopt), AfterLook::kAnswer);
  EXPECT_TRUE(room_.Polling("e1"));  // the newer one still does
  ASSERT_EQ(room_.Next().call, newer);
  room_.BeginLook(newer);
  room_.EndLook(newer, room_.generation(), std::nullopt);
  EXPECT_FALSE(room_.Polling("e1"));
}

// A producer's commit may wake another executor's parked idle poll to verify it
// (ExecutorService::WakeAVerifier): the room knows in O(1) whether one is parked that is not the
// producer's, counting only each executor's latest poll, only while parked, and wakes that one.
TEST_F(LeaseWaitRoomTest, AParkedIdlePollOfAnotherExecutorIsFoundAndWokenNeverTheProducers) {
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("p"));
  LeaseWaitRoom::Call* producers = Hold("p", absl::Seconds(30), /*idle=*/true);
  LeaseWaitRoom::Call* busy = Hold("b", absl::Seconds(30));  // not idle: never woken to verify
  Park(producers, clock_.Now() + absl::Seconds(30));
  Park(busy, clock_.Now() + absl::Seconds(30));
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("p"));
  EXPECT_TRUE(room_.AnyParkedIdlePollBut("q"));  // the producer's poll is another's verifier
  EXPECT_FALSE(room_.WakeOneIdlePollBut("p"));
  LeaseWaitRoom::Call* verifier = Hold("v", absl::Seconds(30), /*idle=*/true);
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("p")) << "ready, not parked: it looks for work already";
  Park(verifier, clock_.Now() + absl::Seconds(30));
  EXPECT_TRUE(room_.AnyParkedIdlePollBut("p"));
  EXPECT_TRUE(room_.AnyParkedIdlePollBut("v"));
  // A newer poll of the verifier stands for it: the older one, still parked, counts no more.
  LeaseWaitRoom::Call* newer = Hold("v", absl::Seconds(30), /*idle=*/true);
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("p"));
  ASSERT_EQ(room_.Next().call, newer);
  room_.BeginLook(newer);
  ASSERT_EQ(room_.EndLook(newer, room_.generation(), clock_.Now() + absl::Seconds(30)), AfterLook::kWaiting);
  room_.ServingEnded(false);
  EXPECT_TRUE(room_.AnyParkedIdlePollBut("p"));
  EXPECT_EQ(room_.waiting(), 4);
  ASSERT_TRUE(room_.WakeOneIdlePollBut("p"));
  EXPECT_EQ(room_.waiting(), 3);
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("p")) << "woken: no longer parked";
  EXPECT_FALSE(room_.WakeOneIdlePollBut("p"));
  ASSERT_EQ(room_.Next().call, newer);  // answered at once, with an empty notice
  LeaseWaitRoom::Look look = room_.BeginLook(newer);
  ASSERT_TRUE(look.notice.has_value());
  EXPECT_FALSE(look.notice->drain);
  EXPECT_FALSE(look.notice->reregister);
  // An announcement readies every parked call: none is left to wake.
  room_.Announce();
  EXPECT_FALSE(room_.AnyParkedIdlePollBut("q"));
}

TEST_F(LeaseWaitRoomTest, HeldIdlePollsBringARenewalScanEachPeriod) {
  LeaseWaitRoom::Call* poll = Hold("e1", absl::Seconds(30), /*idle=*/true);
  Park(poll, clock_.Now() + absl::Seconds(30));
  LeaseWaitRoom::Turn turn = NextAfter(kScan);
  EXPECT_TRUE(turn.scan);
  EXPECT_EQ(turn.idle_polls, std::vector<std::string>{"e1"});
  EXPECT_EQ(room_.waiting(), 1);  // the poll itself still waits
}

TEST_F(LeaseWaitRoomTest, SpreadingCallsCountWhileReadyOrServed) {
  LeaseWaitRoom::Call* a = Hold("e1", absl::Seconds(30), false, /*spreads=*/true);
  Hold("e2", absl::Seconds(30), false, /*spreads=*/true);
  Hold("e3", absl::Seconds(30), false, /*spreads=*/false);
  ASSERT_EQ(room_.Next().call, a);
  EXPECT_EQ(room_.BeginLook(a).others_spreading, 1);  // e2 (e3 does not spread)
  room_.EndLook(a, room_.generation(), std::nullopt);
  room_.ServingEnded(a->spreads);
  LeaseWaitRoom::Call* b = room_.Next().call;
  EXPECT_EQ(room_.BeginLook(b).others_spreading, 0);
}

TEST_F(LeaseWaitRoomTest, StoppingAnswersParkedCallsAndParksNoneAgain) {
  LeaseWaitRoom::Call* call = Hold("e1", absl::Seconds(30));
  Park(call, clock_.Now() + absl::Seconds(30));
  room_.Stop();
  EXPECT_TRUE(room_.stopping());
  ASSERT_EQ(room_.Next().call, call);
  room_.BeginLook(call);
  EXPECT_EQ(room_.EndLook(call, room_.generation(), clock_.Now() + absl::Seconds(30)), AfterLook::kAnswer);
  // A caller without a call does not wait either.
  EXPECT_TRUE(room_.AwaitAnnouncement(room_.generation(), clock_.Now() + absl::Seconds(30)));
  room_.Close();
  LeaseWaitRoom::Turn last = room_.Next();
  EXPECT_EQ(last.call, nullptr);
  EXPECT_FALSE(last.scan);
}

TEST_F(LeaseWaitRoomTest, ACallerWithoutACallWaitsForAnAnnouncementOrItsWake) {
  const uint64_t generation = room_.generation();
  bool stopping = true;
  std::thread waiter([&] { stopping = room_.AwaitAnnouncement(generation, clock_.Now() + absl::Seconds(10)); });
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  room_.Announce();
  waiter.join();
  EXPECT_FALSE(stopping);
  // No announcement: it wakes at its wake time.
  std::thread sleeper([&] { stopping = room_.AwaitAnnouncement(room_.generation(), clock_.Now() + absl::Seconds(10)); });
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  clock_.Advance(absl::Seconds(10));
  sleeper.join();
  EXPECT_FALSE(stopping);
}

}  // namespace
}  // namespace minions
