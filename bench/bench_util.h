#pragma once
// Small helpers the benchmark programs share.

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <iterator>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/subprocess.h"

namespace minions::bench {

// The folder of this benchmark binary (the apps sit next to it).
inline std::string BinDir() {
  std::string self = CurrentExecutablePath();
  return self.substr(0, self.rfind('/'));
}

// A whole file ("" when unreadable).
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts a program with its stderr into `log` and its stdin closed; null (and a message) when it
// cannot start.
inline std::unique_ptr<Subprocess> SpawnLogged(const std::vector<std::string>& argv, const std::string& log) {
  Subprocess::Options sp;
  sp.argv = argv;
  sp.stderr_path = log;
  auto p = Subprocess::Start(sp);
  if (!p.ok()) {
    fprintf(stderr, "cannot start %s: %s\n", argv[0].c_str(), std::string(p.status().message()).c_str());
    return nullptr;
  }
  (*p)->CloseStdin();
  return std::move(*p);
}

// Runs a program to completion, its stderr into `log`; `out` gets its stdout (whatever it wrote,
// even when it failed). An error when it cannot start or does not exit 0.
inline absl::Status RunProgram(const std::vector<std::string>& argv, const std::string& log, std::string& out) {
  Subprocess::Options sp;
  sp.argv = argv;
  sp.stderr_path = log;
  auto p = Subprocess::Start(sp);
  if (!p.ok()) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", p.status().message()));
  (*p)->CloseStdin();
  out.clear();
  for (auto line = (*p)->ReadLine(); line.ok(); line = (*p)->ReadLine()) out += *line + "\n";
  auto exit = (*p)->Wait();
  if (!exit.ok() || !exit->exited || exit->code != 0) {
    return absl::InternalError(
        absl::StrCat(argv[0], " failed (", exit.ok() ? exit->ToString() : "no exit status", "); see ", log));
  }
  return absl::OkStatus();
}

// The Python that has Debian's python3-distributed (the system interpreter, not a pyenv one), and
// whether Dask is installed for it: a peer that is missing is skipped, one that fails is an error.
inline std::string SystemPython() {
  return std::ifstream("/usr/bin/python3").good() ? "/usr/bin/python3" : "python3";
}
inline bool DaskInstalled() {
  std::string out;
  return RunProgram({SystemPython(), "-c", "import distributed"}, "/dev/null", out).ok();
}

// CPU seconds (user + system) a process has used so far, from /proc/PID/stat; 0 elsewhere.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields after the command: state(3) ... utime(14) stime(15).
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Resident memory of a process in MiB (VmRSS), 0 when unknown.
inline double RssMiB(pid_t pid) {
  std::string status = Slurp(absl::StrCat("/proc/", pid, "/status"));
  auto at = status.find("VmRSS:");
  if (at == std::string::npos) return 0;
  return std::stod(status.substr(at + 6)) / 1024.0;
}

// The CPU seconds all cores of this machine have spent busy so far (/proc/stat: all but idle and iowait).
inline double MachineCpuSeconds() {
  std::string stat = Slurp("/proc/stat");
  unsigned long long v[10] = {};
  if (sscanf(stat.c_str(), "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
             &v[6], &v[7]) < 8) {
    return 0;
  }
  const double busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);  // not idle (3), iowait (4)
  return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The CPU seconds of a process and all its children (PostgreSQL's postmaster and backends), per
// pid, so that a delta counts backends that started in between.
inline std::map<pid_t, double> TreeCpu(pid_t root) {
  std::map<pid_t, double> cpu;
  if (root <= 0) return cpu;
  cpu[root] = CpuSeconds(root);
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return cpu;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::string stat = Slurp(absl::StrCat("/proc/", pid, "/stat"));
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (sscanf(stat.c_str() + close + 2, "%c %ld", &state, &ppid) == 2 && ppid == root) {
      cpu[static_cast<pid_t>(pid)] = CpuSeconds(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  return cpu;
}

inline double CpuDelta(const std::map<pid_t, double>& before, const std::map<pid_t, double>& after) {
  double total = 0;
  for (const auto& [pid, seconds] : after) {
    auto it = before.find(pid);
    total += seconds - (it == before.end() ? 0 : it->second);
  }
  return total;
}

}  // namespace minions::bench
