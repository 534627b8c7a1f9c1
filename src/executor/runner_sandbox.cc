#include "executor/runner_sandbox.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/private_files.h"
#include "common/subprocess.h"

namespace minions {
namespace {

bool LooksLikeACredential(const std::string& name) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (absl::StartsWith(upper, "AWS_") || upper == "MINIONS_TOKEN") return true;
  for (const char* word : {"TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "PASSWD", "API_KEY", "PRIVATE_KEY"}) {
    if (upper.find(word) != std::string::npos) return true;
  }
  return false;
}

// `program` as an absolute path: itself when it has a '/', else the first match on PATH.
std::string Absolute(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    std::error_code ec;
    auto absolute = std::filesystem::absolute(program, ec);
    return ec ? program : absolute.lexically_normal().string();
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return program;
}

// Ends a launcher's command with `command`, its program made absolute and its folder readable
// (its libraries, or the script an interpreter loads).
void AppendProgram(const std::vector<std::string>& command, std::vector<std::string>* wrapped) {
  if (command.empty()) return;
  std::string program = Absolute(command[0]);
  wrapped->insert(wrapped->end(), {"--read", std::filesystem::path(program).parent_path().string(), "--"});
  wrapped->push_back(program);
  wrapped->insert(wrapped->end(), command.begin() + 1, command.end());
}

}  // namespace

absl::StatusOr<std::string> ResolveRunnerSandboxMode(const std::string& mode, int landlock_abi) {
  if (mode == "on" || mode == "required" || mode == "off") return mode;
  if (mode == "auto") return std::string(landlock_abi >= 4 ? "required" : "on");
  return absl::InvalidArgumentError(absl::StrCat("--runner-sandbox is auto, on, required or off, not '", mode, "'"));
}

absl::StatusOr<std::shared_ptr<const RunnerSandbox>> RunnerSandbox::Create(RunnerSandboxOptions options) {
  if (options.launcher.empty()) options.launcher = SiblingProgram("minions-sandbox");
  options.launcher = Absolute(options.launcher);
  if (::access(options.launcher.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("the runner's sandbox launcher ", options.launcher,
                                                      " is missing (it is installed next to minions)"));
  }
  if (options.scratch_dir.empty() || options.scratch_dir[0] != '/') {
    return absl::InvalidArgumentError("the runner's scratch folder must be an absolute path");
  }
  if (absl::Status s = MakePrivateDirectories(options.scratch_dir); !s.ok()) return s;
  for (const std::string& pair : options.env) {
    std::string name = pair.substr(0, pair.find('='));
    if (pair.find('=') == std::string::npos || name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("runner environment '", pair, "' is not NAME=VALUE"));
    }
    if (LooksLikeACredential(name)) {
      return absl::InvalidArgumentError(absl::StrCat("runner environment ", name,
                                                     " looks like a credential; runners never get those"));
    }
  }
  return std::shared_ptr<const RunnerSandbox>(new RunnerSandbox(std::move(options)));
}

std::vector<std::string> RunnerSandbox::Wrap(const std::vector<std::string>& command,
                                             const std::vector<int>& connect_tcp_ports) const {
  std::vector<std::string> wrapped = {options_.launcher, "--quiet"};
  for (int port : connect_tcp_ports) wrapped.insert(wrapped.end(), {"--connect-tcp", std::to_string(port)});
  if (!options_.confine) wrapped.push_back("--unconfined");
  if (options_.require_landlock) wrapped.push_back("--require-landlock");
  for (const std::string& folder : options_.model_folders) {
    if (std::filesystem::exists(folder)) wrapped.insert(wrapped.end(), {"--read", folder});
  }
  wrapped.insert(wrapped.end(), {"--write", options_.scratch_dir, "--chdir", options_.scratch_dir});
  wrapped.insert(wrapped.end(), {"--env", "HOME=" + options_.scratch_dir, "--env", "TMPDIR=" + options_.scratch_dir});
  for (const std::string& pair : options_.env) wrapped.insert(wrapped.end(), {"--env", pair});
  // A runner given as a script reads its own folder (the interpreter loads it).
  AppendProgram(command, &wrapped);
  return wrapped;
}

std::vector<std::string> RunnerSandbox::WrapRpcServer(const std::vector<std::string>& command, int port,
                                                     const std::string& bridge) const {
  std::vector<std::string> wrapped = {options_.launcher, "--quiet", "--bind-tcp", std::to_string(port)};
  if (!bridge.empty()) wrapped.insert(wrapped.end(), {"--own-network", bridge});
  if (!options_.confine) wrapped.push_back("--unconfined");
  if (options_.require_landlock) wrapped.push_back("--require-landlock");
  wrapped.insert(wrapped.end(), {"--chdir", "/"});
  AppendProgram(command, &wrapped);
  return wrapped;
}

std::string RunnerSandbox::Describe() const {
  return absl::StrCat("runner sandboxed by ", options_.launcher, ": models read-only (",
                      options_.model_folders.empty() ? "none" : absl::StrJoin(options_.model_folders, ", "),
                      "), scratch ", options_.scratch_dir, ", no network, environment: ",
                      options_.env.empty() ? "empty" : absl::StrCat(options_.env.size(), " variables given"));
}

}  // namespace minions
