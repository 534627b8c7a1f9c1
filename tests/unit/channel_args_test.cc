#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "rpc/rpc.h"

namespace minions::rpc {
namespace {

// The integer `key` holds in `args`, if it is set.
std::optional<int> IntArg(const grpc::ChannelArguments& args, const std::string& key) {
  grpc_channel_args c_args;
  args.SetChannelArgs(&c_args);
  std::optional<int> value;
  for (size_t i = 0; i < c_args.num_args; ++i) {
    if (key == c_args.args[i].key && c_args.args[i].type == GRPC_ARG_INTEGER) value = c_args.args[i].value.integer;
  }
  return value;
}

// An executor's channel carries small control messages on one connection of thousands: no
// bandwidth-delay probe (its pings and timers cost the server, rpc.h kServerBdpProbe).
TEST(ChannelArgs, AnExecutorsChannelSendsNoBandwidthProbes) {
  EXPECT_EQ(IntArg(ChannelArgs(ChannelUse::kExecutor), GRPC_ARG_HTTP2_BDP_PROBE), 0);
  EXPECT_FALSE(kServerBdpProbe);
}

// A client's channel receives results in bulk: gRPC's default (the probe on) stands.
TEST(ChannelArgs, AClientsChannelKeepsTheBandwidthProbe) {
  EXPECT_EQ(IntArg(ChannelArgs(), GRPC_ARG_HTTP2_BDP_PROBE), std::nullopt);
  EXPECT_EQ(IntArg(ChannelArgs(ChannelUse::kClient), GRPC_ARG_HTTP2_BDP_PROBE), std::nullopt);
  // Both keep the quick reconnects every channel needs.
  EXPECT_EQ(IntArg(ChannelArgs(ChannelUse::kExecutor), GRPC_ARG_MAX_RECONNECT_BACKOFF_MS), 1000);
  EXPECT_EQ(IntArg(ChannelArgs(ChannelUse::kClient), GRPC_ARG_MAX_RECONNECT_BACKOFF_MS), 1000);
}

}  // namespace
}  // namespace minions::rpc
