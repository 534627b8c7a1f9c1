#include "cli/credentials.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_port.h"
#include "common/private_files.h"
#include "common/subprocess.h"

namespace minions::cli {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::InvalidArgumentError(absl::StrCat("cannot read token file ", path));
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, " is readable by other users (mode ",
                     absl::StrFormat("%04o", st.st_mode & 07777), "): chmod 600 ", path));
  }
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token)) return absl::InvalidArgumentError(absl::StrCat("cannot read token file ", path));
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  return WritePrivateFile(path, token + "\n");
}

absl::StatusOr<std::string> KeychainToken(const std::string& server) {
#ifdef __APPLE__
  Subprocess::Options options;
  options.argv = {"/usr/bin/security", "find-generic-password", "-s", "minions", "-a", server, "-w"};
  options.stderr_path = "/dev/null";
  auto process = Subprocess::Start(options);
  if (!process.ok()) return absl::NotFoundError("no Keychain");
  (*process)->CloseStdin();
  auto line = (*process)->ReadLine();
  auto exit = (*process)->Wait(absl::Seconds(10));
  if (!line.ok() || !exit.ok() || !exit->exited || exit->code != 0) {
    return absl::NotFoundError(absl::StrCat("no Keychain item for ", server));
  }
  std::string token(absl::StripAsciiWhitespace(*line));
  if (token.empty()) return absl::NotFoundError(absl::StrCat("no Keychain item for ", server));
  return token;
#else
  return absl::NotFoundError("the Keychain is a macOS thing");
#endif
}

absl::Status WriteTokenServer(const std::string& token_path, const std::string& address, int64_t pid) {
  return WritePrivateFile(token_path + ".server", absl::StrCat(address, " ", pid, "\n"));
}

bool TokenBelongsTo(const std::string& token_path, const std::string& server) {
  std::ifstream in(token_path + ".server");
  std::string address;
  int64_t pid = 0;
  if (!(in >> address >> pid) || pid <= 0) return false;
  std::string recorded_host, asked_host;
  int recorded_port = 0, asked_port = 0;
  if (!SplitHostPort(address, &recorded_host, &recorded_port).ok() ||
      !SplitHostPort(server, &asked_host, &asked_port).ok()) {
    return false;
  }
  if (recorded_port != asked_port || !IsLoopbackHost(asked_host)) return false;
  // The very socket it listens on: another loopback address with the same port (127.0.0.2, ::1,
  // or "localhost", which may resolve to either) is a socket anyone may open. A server on every
  // interface listens on each loopback address of its family ("::": both, where dual-stack).
  const std::string recorded = absl::AsciiStrToLower(recorded_host);
  const std::string asked = absl::AsciiStrToLower(asked_host);
  in_addr v4{};
  const bool asked_v4 = inet_pton(AF_INET, asked.c_str(), &v4) == 1;
  const bool same = recorded == asked || (recorded == "0.0.0.0" && asked_v4) ||
                    (recorded == "::" && asked != "localhost");
  if (!same) return false;
  // The server that minted it still runs (signal 0 checks without sending): after it ends, any
  // local user could open its port.
  return kill(static_cast<pid_t>(pid), 0) == 0;
}

std::vector<std::string> LocalAdminTokenFiles(const std::string& minions_home) {
  return {minions_home + "/pool/admin-token", minions_home + "/server/admin-token"};
}

}  // namespace minions::cli
