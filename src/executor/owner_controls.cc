#include "executor/owner_controls.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "availability/sampler.h"

namespace minions {
namespace {

using availability::Phase;

std::string Explain(const availability::PolicyConfig& config, const availability::Snapshot& s, Phase phase,
                    absl::Time now) {
  availability::PolicyState state;
  state.phase = phase;
  state.phase_since = state.running_since = state.paused_since = now - absl::Hours(1);
  state.holds_work = phase != Phase::kWaiting;
  availability::Decision d = availability::Decide(config, s, state, now);
  return absl::StrCat("  ", availability::PhaseName(phase), ": ", availability::ActionName(d.action), " (", d.reason,
                      ")\n");
}

std::string XmlEscape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}});
}

}  // namespace

std::string AvailabilityDryRun(const AvailabilityOptions& options, Clock* clock, absl::Duration settle) {
  availability::Sampler sampler(availability::PlatformProbes(options.probes));
  (void)sampler.Sample(clock->Now());
  clock->SleepFor(settle);
  absl::Time now = clock->Now();
  availability::Snapshot s = sampler.Sample(now, /*all=*/true);
  availability::PolicyConfig config = options.policy;
  config.dedicated = options.mode == AvailabilityOptions::Mode::kDedicated;
  config.time_zone = absl::LocalTimeZone();
  std::string out = absl::StrCat("signals\n", availability::DescribeSnapshot(s, now), "the policy would decide, for an executor\n");
  if (options.mode == AvailabilityOptions::Mode::kOff) {
    absl::StrAppend(&out, "  (availability is off: the executor works whatever the owner does)\n");
  }
  for (Phase phase : {Phase::kWaiting, Phase::kRunning, Phase::kPaused}) absl::StrAppend(&out, Explain(config, s, phase, now));
  return out;
}

std::string DefaultPlatform() {
#ifdef __APPLE__
  return "macos";
#else
  return "linux";
#endif
}

std::string ServiceFilePath(const std::string& platform) {
  return platform == "macos" ? "/Library/LaunchDaemons/com.minions.executor.plist"
                             : "/etc/systemd/system/minions-executor.service";
}

absl::StatusOr<std::string> ServiceFile(InstallOptions o) {
  if (o.platform.empty()) o.platform = DefaultPlatform();
  if (o.platform == "linux") {
    if (o.state_dir.empty()) o.state_dir = "/var/lib/minions-executor";
    if (o.runner_log.empty()) o.runner_log = "/var/log/minions/runner.log";
    return absl::StrCat(
        "# The executor on a Linux machine with spare capacity (written by `minions executor install`).\n"
        "# It works only while the machine's owner is away (docs/availability.md) and starts the runner\n"
        "# as a child process. The first SIGTERM lets it finish its tasks, a second one hands them back\n"
        "# (as preempted, never counted as failures). The owner controls it with\n"
        "# `minions executor pause|resume|status --state-dir ", o.state_dir, "`.\n",
        "[Unit]\n"
        "Description=Minions executor (leases and runs batch inference tasks)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "User=", o.user, "\n",
        "Group=", o.user, "\n",
        "# /dev/input: owner activity on machines without a desktop session in logind.\n"
        "SupplementaryGroups=input\n"
        "EnvironmentFile=-/etc/minions/env\n"
        "# MINIONS_TOKEN comes from /etc/minions/env; the executor needs no object-store credentials.\n"
        "# Availability settings: the [availability] section of /etc/minions/minions.toml.\n"
        "Environment=MINIONS_CONFIG=/etc/minions/minions.toml\n"
        "ExecStart=", o.binary, " executor --server ", o.server, " --state-dir ", o.state_dir, " --runner-log ",
        o.runner_log, "\n",
        "StateDirectory=minions-executor\n"
        "LogsDirectory=minions\n"
        "Restart=always\n"
        "RestartSec=5\n"
        "KillSignal=SIGTERM\n"
        "TimeoutStopSec=120\n"
        "# Be a good guest: the owner's work comes first.\n"
        "Nice=10\n"
        "IOSchedulingClass=idle\n"
        "CPUWeight=20\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n");
  }
  if (o.platform == "macos") {
    if (o.state_dir.empty()) o.state_dir = "/Library/Application Support/Minions/executor";
    if (o.runner_log.empty()) o.runner_log = "/Library/Logs/Minions/runner.log";
    std::vector<std::string> args = {o.binary, "executor", "--server", o.server, "--state-dir", o.state_dir,
                                     "--runner-log", o.runner_log};
    std::string arguments;
    for (const auto& a : args) absl::StrAppend(&arguments, "    <string>", XmlEscape(a), "</string>\n");
    return absl::StrCat(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n"
        "<!-- The Minions executor as a LaunchDaemon (written by `minions executor install`). It reads the\n"
        "     owner's idle time, lock state, power and thermal state from IOKit (docs/availability.md),\n"
        "     works only while the owner is away, and keeps the Mac from idle sleep only while running\n"
        "     on AC power. Install: sudo launchctl bootstrap system /Library/LaunchDaemons/com.minions.executor.plist -->\n"
        "<plist version=\"1.0\">\n"
        "<dict>\n"
        "  <key>Label</key>\n"
        "  <string>com.minions.executor</string>\n"
        "  <key>ProgramArguments</key>\n"
        "  <array>\n",
        arguments,
        "  </array>\n"
        "  <key>EnvironmentVariables</key>\n"
        "  <dict>\n"
        "    <key>MINIONS_CONFIG</key>\n"
        "    <string>/Library/Application Support/Minions/minions.toml</string>\n"
        "  </dict>\n"
        "  <key>RunAtLoad</key>\n"
        "  <true/>\n"
        "  <key>KeepAlive</key>\n"
        "  <true/>\n"
        "  <key>ProcessType</key>\n"
        "  <string>Background</string>\n"
        "  <key>LowPriorityIO</key>\n"
        "  <true/>\n"
        "  <key>Nice</key>\n"
        "  <integer>10</integer>\n"
        "  <key>ExitTimeOut</key>\n"
        "  <integer>120</integer>\n"
        "  <key>StandardErrorPath</key>\n"
        "  <string>/Library/Logs/Minions/executor.log</string>\n"
        "</dict>\n"
        "</plist>\n");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown platform '", o.platform, "': use linux or macos"));
}

}  // namespace minions
