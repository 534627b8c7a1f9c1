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
    if (o.user.empty()) o.user = "minions-executor";
    return absl::StrCat(
        "# The executor on a Linux machine with spare capacity (written by `minions executor install`).\n"
        "# It works only while the machine's owner is away (docs/availability.md) and starts the runner\n"
        "# as a child process. The first SIGTERM lets it finish its tasks, a second one hands them back\n"
        "# (as preempted, never counted as failures). The owner controls it with\n"
        "# `sudo minions executor pause|resume|status --state-dir ", o.state_dir, "`.\n",
        "#\n"
        "# Least privilege (docs/operations.md, \"Hardening\"): its own unprivileged account, no\n"
        "# capabilities, a read-only system, no home folders, its own /tmp; it writes only its state and\n"
        "# log folders. Its runner is confined further (Landlock and seccomp: models read-only, no\n"
        "# network, an empty environment). It loads models only from [executor] models in\n"
        "# /etc/minions/minions.toml (default: the models folder of its state folder) and follows object\n"
        "# URLs only to [executor] objects (the object store's https origin).\n"
        "[Unit]\n"
        "Description=Minions executor (leases and runs batch inference tasks)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "User=", o.user, "\n",
        "Group=", o.user, "\n",
        "# Owner activity comes from logind; where logind cannot tell (no seat), grant /dev/input:\n"
        "# SupplementaryGroups=input\n"
        "EnvironmentFile=-/etc/minions/env\n"
        "# MINIONS_TOKEN comes from /etc/minions/env; the executor needs no object-store credentials.\n"
        "# Availability settings: the [availability] section of /etc/minions/minions.toml.\n"
        "Environment=MINIONS_CONFIG=/etc/minions/minions.toml\n"
        "ExecStart=", o.binary, " executor --server ", o.server, " --state-dir ", o.state_dir, " --runner-log ",
        o.runner_log, "\n",
        "StateDirectory=minions-executor\n"
        "StateDirectoryMode=0700\n"
        "LogsDirectory=minions\n"
        "LogsDirectoryMode=0700\n"
        "UMask=0077\n"
        "NoNewPrivileges=yes\n"
        "CapabilityBoundingSet=\n"
        "AmbientCapabilities=\n"
        "ProtectSystem=strict\n"
        "ProtectHome=yes\n"
        "PrivateTmp=yes\n"
        "ProtectKernelTunables=yes\n"
        "ProtectKernelModules=yes\n"
        "ProtectKernelLogs=yes\n"
        "ProtectControlGroups=yes\n"
        "ProtectClock=yes\n"
        "ProtectHostname=yes\n"
        "RestrictNamespaces=yes\n"
        "RestrictRealtime=yes\n"
        "RestrictSUIDSGID=yes\n"
        "LockPersonality=yes\n"
        "RemoveIPC=yes\n"
        "# inet: the server and the object store; unix: logind (D-Bus) and the owner's control socket;\n"
        "# netlink: the network interfaces' addresses.\n"
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK\n"
        "SystemCallArchitectures=native\n"
        "SystemCallFilter=~@mount @reboot @swap @module @raw-io @obsolete @cpu-emulation @clock\n"
        "# GPUs (/dev/nvidia*, /dev/dri) stay visible: PrivateDevices would hide them.\n"
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
    if (o.user.empty()) o.user = "_minions";
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
        "     on AC power. It runs as its own hidden account (UserName), never as root; its runner runs\n"
        "     under sandbox-exec (models read-only, no network, an empty environment).\n"
        "     Install: sudo launchctl bootstrap system /Library/LaunchDaemons/com.minions.executor.plist -->\n"
        "<plist version=\"1.0\">\n"
        "<dict>\n"
        "  <key>Label</key>\n"
        "  <string>com.minions.executor</string>\n"
        "  <key>UserName</key>\n"
        "  <string>", XmlEscape(o.user), "</string>\n",
        "  <key>GroupName</key>\n"
        "  <string>", XmlEscape(o.user), "</string>\n",
        "  <key>Umask</key>\n"
        "  <integer>63</integer>\n"
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

std::vector<std::vector<std::string>> ServiceAccountCommands(InstallOptions o,
                                                             const std::function<bool(const std::string&)>& exists) {
  if (o.platform.empty()) o.platform = DefaultPlatform();
  std::vector<std::vector<std::string>> commands;
  if (o.platform == "linux") {
    if (o.user.empty()) o.user = "minions-executor";
    if (o.state_dir.empty()) o.state_dir = "/var/lib/minions-executor";
    // systemd makes the state and log folders, owned by the account, when the unit starts.
    if (!exists(o.user)) {
      commands.push_back({"useradd", "--system", "--user-group", "--no-create-home", "--home-dir", o.state_dir,
                          "--shell", "/usr/sbin/nologin", "--comment", "Minions executor", o.user});
    }
    return commands;
  }
  if (o.user.empty()) o.user = "_minions";
  if (o.state_dir.empty()) o.state_dir = "/Library/Application Support/Minions/executor";
  if (!exists(o.user)) {
    // A hidden role account, as macOS's own daemons have (an id below 500, no shell, no home).
    const std::string id = o.mac_account_id;
    commands.push_back({"dscl", ".", "-create", "/Groups/" + o.user, "PrimaryGroupID", id});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "UniqueID", id});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "PrimaryGroupID", id});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "UserShell", "/usr/bin/false"});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "NFSHomeDirectory", "/var/empty"});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "RealName", "Minions executor"});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "IsHidden", "1"});
    commands.push_back({"dscl", ".", "-create", "/Users/" + o.user, "Password", "*"});
  }
  // launchd makes no folders: the state (models inside) and the logs, the account's alone.
  commands.push_back({"mkdir", "-p", o.state_dir + "/models", "/Library/Logs/Minions"});
  commands.push_back({"chown", "-R", o.user + ":" + o.user, o.state_dir, "/Library/Logs/Minions"});
  commands.push_back({"chmod", "700", o.state_dir, "/Library/Logs/Minions"});
  return commands;
}

}  // namespace minions
