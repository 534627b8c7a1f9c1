#include "cli/credentials.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

std::vector<std::string> LocalAdminTokenFiles(const std::string& minions_home) {
  return {minions_home + "/pool/admin-token", minions_home + "/server/admin-token"};
}

}  // namespace minions::cli
