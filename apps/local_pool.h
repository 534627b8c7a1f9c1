#pragma once
// The embedded-default backends and the one-machine pool.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "blob/blob_store.h"
#include "cli/pool.h"
#include "common/clock.h"
#include "server/control_plane.h"
#include "store/metadata_store.h"
#include "backends.h"

namespace minions::apps {

// A server in this process with the watchdog, plus executor child processes.
absl::StatusOr<std::unique_ptr<cli::Pool>> StartLocalPool(const cli::PoolOptions& options);

}  // namespace minions::apps
