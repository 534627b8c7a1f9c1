#pragma once
// Identities for processes started on the server's own machine: the admin token a server or a
// local pool mints into its data folder when the pool has none (so one-machine use needs no
// set-up and the CLI finds it), and the admin verbs acting on the server's own data
// (`minions admin --data-dir/--database`, how an operator makes the first admin token of a
// fleet on PostgreSQL).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/admin_verbs.h"
#include "common/clock.h"
#include "store/metadata_store.h"

namespace minions::apps {

// Makes sure `path` holds a usable admin token of `store`: keeps the one there when it is still
// valid; otherwise, when the store has no usable admin token at all, issues one (holder
// "bootstrap") and writes it to `path` (0600). When the store has admin tokens but `path` holds
// none of them, leaves things as they are and returns NotFound (the operator has theirs).
// Returns the token's text.
absl::StatusOr<std::string> EnsureAdminToken(MetadataStore* store, Clock* clock, const std::string& path);

// The admin verbs on a store opened here.
std::unique_ptr<cli::AdminBackend> LocalAdmin(MetadataStore* store, Clock* clock);

}  // namespace minions::apps
