// RpcFaults on the fake clock: which answers are the server's own faults, how they are counted,
// and how often they are logged. (Through a real server and store: grpc_service_test.cc,
// "FaultsOfTheServersOwnAreCountedByMethodAndRefusalsAreNot".)

#include "server/rpc_faults.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/fake_clock.h"
#include "testing/prometheus_text.h"

namespace minions::testing {
namespace {

constexpr char kLease[] = "/minions.v1.Executors/Lease";
constexpr char kBeats[] = "/minions.v1.Executors/Beats";

class RpcFaultsTest : public ::testing::Test {
 protected:
  double Counted(const std::string& method, const std::string& code) {
    auto samples = ParsePrometheusSamples(registry_.Render());
    auto it = samples.find("minions_rpc_faults_total{method=\"" + method + "\",code=\"" + code + "\"}");
    return it == samples.end() ? 0 : it->second;
  }
  bool Answer(const std::string& method, grpc::StatusCode code) {
    return faults_.Answered(method, grpc::Status(code, "what went wrong"), "ipv4:127.0.0.1:5555");
  }

  FakeClock clock_;
  metrics::Registry registry_;
  RpcFaults faults_{&clock_, &registry_};
};

TEST_F(RpcFaultsTest, ARefusalOfTheCallersOwnMistakeIsNeitherCountedNorLogged) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::OK, grpc::StatusCode::CANCELLED, grpc::StatusCode::INVALID_ARGUMENT,
        grpc::StatusCode::NOT_FOUND, grpc::StatusCode::ALREADY_EXISTS, grpc::StatusCode::PERMISSION_DENIED,
        grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::FAILED_PRECONDITION, grpc::StatusCode::ABORTED,
        grpc::StatusCode::OUT_OF_RANGE, grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::UNAUTHENTICATED}) {
    EXPECT_FALSE(RpcFaults::IsFault(code)) << code;
    EXPECT_FALSE(Answer(kLease, code)) << code;
  }
  EXPECT_EQ(registry_.Render().find("minions_rpc_faults_total{"), std::string::npos) << registry_.Render();
}

TEST_F(RpcFaultsTest, EveryFaultIsCountedByMethodAndCode) {
  for (grpc::StatusCode code : {grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN, grpc::StatusCode::DATA_LOSS,
                                grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED}) {
    EXPECT_TRUE(RpcFaults::IsFault(code)) << code;
  }
  Answer(kLease, grpc::StatusCode::INTERNAL);
  Answer(kLease, grpc::StatusCode::INTERNAL);
  Answer(kLease, grpc::StatusCode::UNAVAILABLE);
  Answer(kBeats, grpc::StatusCode::DEADLINE_EXCEEDED);
  Answer(kBeats, grpc::StatusCode::DATA_LOSS);
  Answer(kBeats, grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(Counted(kLease, "INTERNAL"), 2);
  EXPECT_EQ(Counted(kLease, "UNAVAILABLE"), 1);
  EXPECT_EQ(Counted(kBeats, "DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(Counted(kBeats, "DATA_LOSS"), 1);
  EXPECT_EQ(Counted(kBeats, "UNKNOWN"), 1);
  EXPECT_EQ(Counted(kBeats, "INTERNAL"), 0);
}

// A store that is down fails every call: the log gets the first at once, then a line a minute per
// method (with how many it left out), not a line per call.
TEST_F(RpcFaultsTest, AMethodsFaultsAreLoggedAtOnceThenAtMostOnceAMinute) {
  EXPECT_TRUE(Answer(kLease, grpc::StatusCode::INTERNAL)) << "the first is logged at once";
  EXPECT_TRUE(Answer(kBeats, grpc::StatusCode::UNAVAILABLE)) << "so is another method's first";
  for (int second = 0; second < 59; ++second) {
    EXPECT_FALSE(Answer(kLease, grpc::StatusCode::INTERNAL)) << second << " s after the first line";
    EXPECT_FALSE(Answer(kLease, grpc::StatusCode::UNAVAILABLE)) << "another code of the same method";
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_FALSE(Answer(kLease, grpc::StatusCode::INTERNAL)) << "59 s after the first line";
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(Answer(kLease, grpc::StatusCode::INTERNAL)) << "a minute after the first line";
  EXPECT_FALSE(Answer(kLease, grpc::StatusCode::INTERNAL));
  EXPECT_TRUE(Answer(kBeats, grpc::StatusCode::UNAVAILABLE)) << "its minute is up too";
  // Every one was counted, logged or not.
  EXPECT_EQ(Counted(kLease, "INTERNAL"), 63);
  EXPECT_EQ(Counted(kLease, "UNAVAILABLE"), 59);
  EXPECT_EQ(Counted(kBeats, "UNAVAILABLE"), 2);
}

}  // namespace
}  // namespace minions::testing
