// minions-sandbox: starts a program (a runner) in the runner's sandbox (src/sandbox/sandbox.h).
//
//   minions-sandbox [--read PATH]... [--write PATH]... [--device PATH]... [--env NAME=VALUE]...
//                   [--chdir DIR] [--connect-tcp PORT]... [--bind-tcp PORT]... [--require-landlock]
//                   [--unconfined] [--quiet] [--own-network SOCKET]
//                   -- PROGRAM [ARGS...]
//
// The program gets only the --env variables, starts in --chdir (default: the first --write
// folder), and may read the system's libraries, PROGRAM and the --read paths, read and write the
// --write folders, use the --device files, and reach no network. The system's paths are added
// here; the executor passes the rest. Exits 126 when the sandbox cannot be set up, 127 when
// PROGRAM cannot be executed (with the reason on stderr). --unconfined: only the environment and
// the working folder (an owner who turned the sandbox off). --own-network (Linux; a gang member's
// rpc-server, with its one --bind-tcp port): PROGRAM runs in a network namespace of its own, reached
// only through a bridge on the Unix socket SOCKET (src/sandbox/own_network.h); with or without
// --unconfined.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sandbox/own_network.h"
#include "sandbox/sandbox.h"

namespace {

int Usage(const char* why) {
  fprintf(stderr,
          "minions-sandbox: %s\nusage: minions-sandbox [--read PATH]... [--write PATH]... [--device PATH]... "
          "[--env NAME=VALUE]... [--chdir DIR] [--connect-tcp PORT]... [--bind-tcp PORT]... [--require-landlock] "
          "[--unconfined] [--quiet] [--own-network SOCKET] -- PROGRAM [ARGS...]\n",
          why);
  return 126;
}

}  // namespace

int main(int argc, char** argv) {
  minions::sandbox::Policy policy = minions::sandbox::SystemPolicy();
  std::vector<std::string> env;
  std::string chdir_to, first_write, own_network;
  bool require_landlock = false, quiet = false, unconfined = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--require-landlock") {
      require_landlock = true;
    } else if (arg == "--unconfined") {
      unconfined = true;
    } else if (arg == "--quiet") {
      quiet = true;
    } else if (arg == "--own-network") {
      const char* v = value();
      if (v == nullptr) return Usage("--own-network needs a socket path");
      own_network = v;
    } else if (arg == "--connect-tcp" || arg == "--bind-tcp") {
      const char* v = value();
      int port = v == nullptr ? 0 : std::atoi(v);
      if (port < 1 || port > 65535) return Usage((arg + " needs a port (1-65535)").c_str());
      (arg == "--bind-tcp" ? policy.bind_tcp_ports : policy.connect_tcp_ports).push_back(port);
    } else if (arg == "--read" || arg == "--write" || arg == "--device" || arg == "--env" || arg == "--chdir") {
      const char* v = value();
      if (v == nullptr) return Usage((arg + " needs a value").c_str());
      if (arg == "--read") policy.read_only.push_back(v);
      if (arg == "--write") {
        policy.read_write.push_back(v);
        if (first_write.empty()) first_write = v;
      }
      if (arg == "--device") policy.devices.push_back(v);
      if (arg == "--env") {
        if (std::strchr(v, '=') == nullptr) return Usage("--env needs NAME=VALUE");
        env.push_back(v);
      }
      if (arg == "--chdir") chdir_to = v;
    } else {
      return Usage(("unknown option " + arg).c_str());
    }
  }
  if (i >= argc) return Usage("no program to run");
  std::vector<char*> args(argv + i, argv + argc);
  args.push_back(nullptr);
  const std::string program = args[0];
  policy.read_only.push_back(program);
  if (chdir_to.empty()) chdir_to = first_write;
  if (chdir_to.empty()) chdir_to = "/";
  if (::chdir(chdir_to.c_str()) != 0) {
    fprintf(stderr, "minions-sandbox: cannot enter %s: %s\n", chdir_to.c_str(), std::strerror(errno));
    return 126;
  }
  if (!own_network.empty()) {
    if (policy.bind_tcp_ports.size() != 1) return Usage("--own-network needs exactly one --bind-tcp port");
    absl::Status entered = minions::sandbox::EnterOwnNetwork();
    absl::StatusOr<int> bridge = entered.ok() ? minions::sandbox::StartBridge(own_network, policy.bind_tcp_ports[0])
                                              : absl::StatusOr<int>(entered);
    if (!bridge.ok()) {
      fprintf(stderr, "minions-sandbox: no network of its own: %s\n", std::string(bridge.status().message()).c_str());
      return 126;
    }
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (unconfined) {
    ::execve(program.c_str(), args.data(), envp.data());
    fprintf(stderr, "minions-sandbox: cannot execute %s: %s\n", program.c_str(), std::strerror(errno));
    return 127;
  }
#ifdef __APPLE__
  // sandbox-exec applies the profile, then executes the program (with the environment given here).
  std::string profile = minions::sandbox::MacProfile(policy, program);
  std::vector<char*> mac_args = {const_cast<char*>("sandbox-exec"), const_cast<char*>("-p"), profile.data()};
  mac_args.insert(mac_args.end(), args.begin(), args.end());
  (void)require_landlock;
  if (!quiet) fprintf(stderr, "minions-sandbox: sandbox-exec profile, empty environment\n");
  ::execve("/usr/bin/sandbox-exec", mac_args.data(), envp.data());
  fprintf(stderr, "minions-sandbox: cannot execute /usr/bin/sandbox-exec: %s\n", std::strerror(errno));
  return 127;
#else
  auto applied = minions::sandbox::ApplyToSelf(policy, require_landlock);
  if (!applied.ok()) {
    fprintf(stderr, "minions-sandbox: %s\n", std::string(applied.status().message()).c_str());
    return 126;
  }
  if (!quiet) fprintf(stderr, "minions-sandbox: %s, empty environment\n", applied->c_str());
  ::execve(program.c_str(), args.data(), envp.data());
  fprintf(stderr, "minions-sandbox: cannot execute %s: %s\n", program.c_str(), std::strerror(errno));
  return 127;
#endif
}
