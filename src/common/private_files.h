#pragma once
// Files and folders only their owner may read: data folders (the SQLite database, the object
// store, an executor's state) are created 0700 and their files 0600, whatever the umask, so other
// accounts on a shared machine read nothing of a team's inputs and outputs.
// Any thread.

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace minions {

inline constexpr unsigned kPrivateDirMode = 0700;
inline constexpr unsigned kPrivateFileMode = 0600;

// Creates `path` and its missing parents, each new one with mode 0700 (folders that exist are left
// as they are). InternalError with the reason when one cannot be created.
absl::Status MakePrivateDirectories(const std::string& path);

// Writes `data` to `path` atomically (a temporary file renamed into place) with mode 0600,
// creating missing parent folders 0700.
absl::Status WritePrivateFile(const std::string& path, std::string_view data);

// Makes the process create private files from now on (umask 077), for the long-running processes
// whose every file is data: the server, the watchdog, executors, a local pool.
void UsePrivateUmask();

}  // namespace minions
