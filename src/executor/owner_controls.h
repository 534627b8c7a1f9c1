#pragma once
// The owner's tools on the machine itself, besides the control channel: a dry run of the policy
// on live signals, and the service file that runs the executor at boot (a Linux systemd unit or
// a macOS LaunchDaemon; the shipped copies under deploy/ are these files with their defaults).
//
// Threads: plain functions.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "executor/availability_controller.h"

namespace minions {

// Samples the platform's probes twice (`settle` apart, so CPU deltas exist) and says what the
// policy would decide now, for an executor waiting for work and for one running.
std::string AvailabilityDryRun(const AvailabilityOptions& options, Clock* clock,
                               absl::Duration settle = absl::Seconds(1));

struct InstallOptions {
  std::string platform;                       // "linux" or "macos"; default: this machine's
  std::string binary = "/usr/local/bin/minions";
  std::string server = "minions.internal:7070";
  std::string state_dir;                      // default: the platform's usual place
  std::string runner_log;                     // default: the platform's usual place
  // The executor's own unprivileged account; default: minions-executor (Linux), _minions (macOS).
  std::string user;
  std::string mac_account_id = "471";         // macOS: the hidden account's uid and gid, when made
};

// The unit or plist text; an error for an unknown platform.
absl::StatusOr<std::string> ServiceFile(InstallOptions options);
// The commands (argv) that make the executor's account and folders, as far as they are missing
// (`exists` says whether an account exists). `minions executor install` runs them as root.
std::vector<std::vector<std::string>> ServiceAccountCommands(
    InstallOptions options, const std::function<bool(const std::string&)>& exists);
// Where the file goes on that platform.
std::string ServiceFilePath(const std::string& platform);
std::string DefaultPlatform();

}  // namespace minions
