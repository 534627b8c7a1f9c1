#pragma once
// Conversions between the domain types and the gRPC messages.

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "minions/v1/minions.pb.h"
#include "model/identity.h"
#include "model/types.h"
#include "model/verification.h"
#include "rpc/rpc.h"

namespace minions {

// Unix milliseconds of an optional time; 0 when unset.
int64_t MillisOrZero(const std::optional<absl::Time>& t);

v1::Job ToProto(const Job& job);
v1::Task ToProto(const Task& task);
v1::Executor ToProto(const Executor& executor);
ExecutorInfo FromProto(const v1::Capabilities& capabilities);
ModelHoldings FromProto(const v1::ModelHoldings& holdings);
// With the memory one task needs under the runner's default options.
v1::Model ToProto(const ModelRecord& model);
v1::Team ToProto(const Team& team);
Team FromProto(const v1::Team& team);  // settings only; created_at is the server's
v1::VerificationCounts ToProto(const VerificationTally& tally);
v1::TokenInfo ToProto(const TokenRecord& token);  // never the text (the record has none)

using rpc::ToGrpc;

}  // namespace minions
