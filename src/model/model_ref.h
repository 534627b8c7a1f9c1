#pragma once
// How a job names its model (JobSpec::model): a registry name of its team ("llama-3b"), a name
// pinned to a digest ("llama-3b@sha256:<64 hex>"), or a GGUF path on the executors (anything with
// a '/' or ending in ".gguf": a loopback pool, or a folder the executors allow). Registry names
// are 1-128 of [A-Za-z0-9._-], starting with a letter or digit, and never end in ".gguf".
//
// Pure; any thread.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/types.h"

namespace minions {

struct ModelRef {
  std::string name;    // a registry name, or the path when is_path
  std::string digest;  // "sha256:<64 lowercase hex>" when pinned; "" otherwise
  bool is_path = false;
};

// InvalidArgument, saying what a reference looks like, for one that is neither.
absl::StatusOr<ModelRef> ParseModelRef(std::string_view text);

// InvalidArgument unless `name` is a valid registry name.
absl::Status ValidateModelName(std::string_view name);
// InvalidArgument unless `digest` is "sha256:" and 64 lowercase hex digits.
absl::Status ValidateModelDigest(std::string_view digest);

// InvalidArgument unless `runner` is a runner name: 1-64 of [a-z0-9_-], starting with a letter.
absl::Status ValidateRunnerName(std::string_view runner);

// "sha256:<hex>" -> "<hex>" (the digest's form in object keys and cache file names).
std::string_view DigestHex(std::string_view digest);

// How people are shown a model an executor holds: "NAME@sha256:<first 12 hex>" with the registry
// name `names_by_digest` gives the digest (the viewer's teams' models: ModelNamesByDigest), the
// short digest alone when it has none, and anything else (a path) as it is.
std::string ShownModel(const std::string& digest, const std::map<std::string, std::string>& names_by_digest);
// Digest -> name over `models` (several names: the first in order).
std::map<std::string, std::string> ModelNamesByDigest(const std::vector<ModelRecord>& models);

// What a caller sees of an executor's models. An admin: every digest and the loaded model. A team:
// only the digests its own registry names (`names_by_digest` is then that team's), and the loaded
// model when its registry names it or the executor runs the team's work (`runs_callers_work`);
// another team's cached digests and loaded model (a digest or a path) are dropped, since they
// tell which work runs where. `loaded_hidden` is true when a loaded model was dropped.
struct VisibleModels {
  std::vector<std::string> cached;
  std::string loaded;
  bool loaded_hidden = false;
};
// How a hidden loaded model is shown (the executor is busy with a model; whose is not said).
inline constexpr std::string_view kAnotherTeamsModel = "(another team's model)";
VisibleModels ModelsVisibleTo(bool admin, bool runs_callers_work, const ExecutorInfo& info,
                              const std::map<std::string, std::string>& names_by_digest);

// The heartbeat time a caller is shown: exact for an admin, rounded down to kHeartbeatShownGrain
// for a team (the second an owner's machine beat tells other teams when it woke or slept).
inline constexpr absl::Duration kHeartbeatShownGrain = absl::Seconds(30);
absl::Time HeartbeatShown(bool admin, absl::Time beat);

}  // namespace minions
