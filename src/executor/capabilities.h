#pragma once
// What this machine offers, as reported when an executor registers.

#include "minions/v1/minions.pb.h"

namespace minions {

// OS, chip, memory; GPU detection arrives with the availability probes.
v1::Capabilities DetectCapabilities(const std::string& name);

}  // namespace minions
