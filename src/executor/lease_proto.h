#pragma once
// The executor's side of the wire: leases and reports between the Executors service's messages
// and the domain types the executor's core works on (model/types.h). Pure.

#include "minions/v1/minions.pb.h"
#include "model/types.h"

namespace minions {

LeaseGrant FromProto(const v1::TaskLease& lease);
AttemptRef FromProto(const v1::LeaseRef& ref);
GangDuty FromProto(const v1::GangDuty& duty);
// A report about an attempt: its ref, progress and the chunks it has uploaded.
void ToProto(const LeaseProgress& progress, v1::LeaseRef* ref);

}  // namespace minions
