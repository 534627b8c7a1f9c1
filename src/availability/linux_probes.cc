#include "availability/linux_probes.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace minions::availability {
namespace fs = std::filesystem;
namespace {

std::string Path(const std::string& root, const std::string& rel) {
  return (fs::path(root.empty() ? "/" : root) / rel).string();
}

// The entries of folder `rel` under `root`; nullopt, and `signal` unknown, when it is unreadable.
template <typename T>
std::optional<fs::directory_iterator> EntriesOr(const std::string& root, const std::string& rel, Signal<T>* signal) {
  const std::string dir = Path(root, rel);
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    *signal = {};
    signal->source = dir + " unreadable";
    return std::nullopt;
  }
  return it;
}

bool ReadWhole(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return true;
}

std::string ReadTrimmed(const std::string& path) {
  std::string s;
  if (!ReadWhole(path, &s)) return "";
  return std::string(absl::StripAsciiWhitespace(s));
}

bool ReadInt(const std::string& path, int64_t* value) {
  std::string s = ReadTrimmed(path);
  return !s.empty() && absl::SimpleAtoi(s, value);
}

bool IsPid(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// /proc/<pid>/stat after the command name: state ppid ... utime(14) stime(15), counted from 1.
struct ProcStat {
  int pid = 0, ppid = 0;
  int64_t ticks = 0;
};

bool ParseProcStat(const std::string& text, ProcStat* out) {
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> f = absl::StrSplit(text.substr(close + 1), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state); field n is f[n - 3].
  if (f.size() < 13) return false;
  int64_t utime, stime;
  if (!absl::SimpleAtoi(f[1], &out->ppid) || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return false;
  }
  out->ticks = utime + stime;
  return absl::SimpleAtoi(text.substr(0, text.find(' ')), &out->pid);
}

std::vector<ProcStat> AllProcesses(const std::string& root) {
  std::vector<ProcStat> all;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(Path(root, "proc"), ec)) {
    std::string name = entry.path().filename().string();
    if (!IsPid(name)) continue;
    std::string text;
    ProcStat stat;
    if (ReadWhole(entry.path().string() + "/stat", &text) && ParseProcStat(text, &stat)) all.push_back(stat);
  }
  return all;
}

std::vector<int> TreeOf(const std::vector<ProcStat>& all, int top) {
  std::vector<int> tree = {top};
  std::set<int> in_tree = {top};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& p : all) {
      if (in_tree.count(p.ppid) && !in_tree.count(p.pid)) {
        in_tree.insert(p.pid);
        tree.push_back(p.pid);
        grew = true;
      }
    }
  }
  return tree;
}

std::map<std::string, int64_t> MemInfo(const std::string& root) {
  std::map<std::string, int64_t> values;
  std::string text;
  if (!ReadWhole(Path(root, "proc/meminfo"), &text)) return values;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::ByAnyChar(": "), absl::SkipEmpty());
    int64_t v;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &v)) values[parts[0]] = v * 1024;  // kB
  }
  return values;
}

// Our tree through /proc/<pid>/task/<tid>/children (a few small reads, where a full /proc scan
// reads every process's stat file); false where the kernel does not offer those files.
bool TreeFromChildren(const std::string& root, int top, std::vector<int>* tree) {
  tree->assign({top});
  for (size_t i = 0; i < tree->size(); ++i) {
    std::error_code ec;
    fs::directory_iterator tasks(Path(root, absl::StrCat("proc/", (*tree)[i], "/task")), ec);
    if (ec) return i > 0;  // a child that just exited is fine; no task dir for ourselves is not
    for (const auto& task : tasks) {
      std::string children;
      if (!ReadWhole(task.path().string() + "/children", &children)) return false;
      for (absl::string_view pid : absl::StrSplit(children, ' ', absl::SkipWhitespace())) {
        int child;
        if (absl::SimpleAtoi(pid, &child)) tree->push_back(child);
      }
    }
  }
  return true;
}

ProcStat ReadOne(const std::string& root, int pid) {
  ProcStat stat;
  std::string text;
  if (ReadWhole(Path(root, absl::StrCat("proc/", pid, "/stat")), &text)) ParseProcStat(text, &stat);
  stat.pid = pid;
  return stat;
}

}  // namespace

std::vector<int> OwnProcessTree(const std::string& root) {
  std::vector<int> tree;
  if (TreeFromChildren(root, getpid(), &tree)) return tree;
  return TreeOf(AllProcesses(root), getpid());
}

int64_t MemTotalBytes(const std::string& root) {
  auto info = MemInfo(root);
  return info.count("MemTotal") ? info["MemTotal"] : 0;
}

int64_t ProcessRssBytes(const std::string& root, int pid) {
  std::string text;
  if (!ReadWhole(Path(root, absl::StrCat("proc/", pid, "/status")), &text)) return 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmRSS:")) continue;
    int64_t kb;
    std::string value(absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"));
    if (absl::SimpleAtoi(value, &kb)) return kb * 1024;
  }
  return 0;
}

// --- CPU ---

ProcCpuProbe::ProcCpuProbe(std::string root, int own_pid, std::function<std::vector<int>()> own_pids)
    : root_(std::move(root)), own_pid_(own_pid), own_pids_(std::move(own_pids)) {}

void ProcCpuProbe::Fill(Snapshot* s, absl::Time now) {
  std::string text;
  if (!ReadWhole(Path(root_, "proc/stat"), &text) || !absl::StartsWith(text, "cpu ")) {
    s->other_cpu = {};
    s->other_cpu.source = "/proc/stat unreadable";
    return;
  }
  std::vector<std::string> f = absl::StrSplit(text.substr(0, text.find('\n')), ' ', absl::SkipEmpty());
  int64_t total = 0, idle = 0;
  for (size_t i = 1; i < f.size() && i <= 8; ++i) {  // user nice system idle iowait irq softirq steal
    int64_t v = 0;
    (void)absl::SimpleAtoi(f[i], &v);
    total += v;
    if (i == 4 || i == 5) idle += v;
  }
  int64_t busy = total - idle;
  std::map<int, int64_t> ours;
  std::vector<int> tree;
  if (own_pids_) {
    for (int pid : own_pids_()) {
      if (pid > 0) ours[pid] = ReadOne(root_, pid).ticks;
    }
  } else if (TreeFromChildren(root_, own_pid_, &tree)) {
    for (int pid : tree) ours[pid] = ReadOne(root_, pid).ticks;
  } else {
    std::vector<ProcStat> all = AllProcesses(root_);
    for (int pid : TreeOf(all, own_pid_)) {
      for (const auto& p : all) {
        if (p.pid == pid) ours[pid] = p.ticks;
      }
    }
  }
  if (have_baseline_ && total > last_total_) {
    int64_t ours_delta = 0;
    for (const auto& [pid, ticks] : ours) {
      auto it = last_ours_.find(pid);
      ours_delta += std::max<int64_t>(0, ticks - (it == last_ours_.end() ? 0 : it->second));
    }
    double other = static_cast<double>(busy - last_busy_ - ours_delta) / static_cast<double>(total - last_total_);
    s->other_cpu.Set(std::clamp(other, 0.0, 1.0), now, "/proc/stat");
  }
  have_baseline_ = true;
  last_total_ = total;
  last_busy_ = busy;
  last_ours_ = std::move(ours);
}

// --- power ---

void PowerSupplyProbe::Fill(Snapshot* s, absl::Time now) {
  std::optional<fs::directory_iterator> entries = EntriesOr(root_, "sys/class/power_supply", &s->on_ac);
  if (!entries) return;
  bool mains_online = false, have_battery = false, discharging = false;
  double capacity = -1;
  for (const auto& entry : *entries) {
    std::string base = entry.path().string();
    if (ReadTrimmed(base + "/scope") == "Device") continue;  // a mouse's or headset's battery
    std::string type = ReadTrimmed(base + "/type");
    int64_t online = 0;
    if (type == "Mains" || absl::StartsWith(type, "USB")) {
      if (ReadInt(base + "/online", &online) && online == 1) mains_online = true;
    } else if (type == "Battery") {
      have_battery = true;
      int64_t cap;
      if (ReadInt(base + "/capacity", &cap)) capacity = std::max(capacity, static_cast<double>(cap));
      discharging |= ReadTrimmed(base + "/status") == "Discharging";
    }
  }
  if (!have_battery) {
    s->on_ac.Set(true, now, "no internal battery");  // a desktop (a UPS is not "on battery")
    s->battery_percent = {};
    return;
  }
  s->on_ac.Set(mains_online || !discharging, now, "/sys/class/power_supply");
  if (capacity >= 0) {
    s->battery_percent.Set(capacity, now, "/sys/class/power_supply");
  } else {
    s->battery_percent = {};
  }
}

// --- thermal ---

void ThermalZoneProbe::Fill(Snapshot* s, absl::Time now) {
  std::optional<fs::directory_iterator> entries = EntriesOr(root_, "sys/class/thermal", &s->thermal);
  if (!entries) return;
  Thermal level = Thermal::kNominal;
  int zones = 0;
  std::string hottest;
  for (const auto& entry : *entries) {
    std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "thermal_zone")) continue;
    std::string base = entry.path().string();
    int64_t temp;
    if (!ReadInt(base + "/temp", &temp)) continue;
    ++zones;
    int64_t fair = 80000, serious = 90000, critical = 100000;
    bool trips = false;
    for (int i = 0; i < 32; ++i) {
      std::string type = ReadTrimmed(absl::StrCat(base, "/trip_point_", i, "_type"));
      int64_t t;
      if (type.empty() || !ReadInt(absl::StrCat(base, "/trip_point_", i, "_temp"), &t) || t <= 0) continue;
      if (!trips) fair = serious = critical = INT64_MAX;
      trips = true;
      if (type == "passive" || type == "active") fair = std::min(fair, t);
      if (type == "hot") serious = std::min(serious, t);
      if (type == "critical") critical = std::min(critical, t);
    }
    serious = std::min(serious, critical);
    fair = std::min(fair, serious);
    Thermal zone = temp >= critical  ? Thermal::kCritical
                   : temp >= serious ? Thermal::kSerious
                   : temp >= fair    ? Thermal::kFair
                                     : Thermal::kNominal;
    if (zone > level || hottest.empty()) {
      if (zone > level) level = zone;
      hottest = absl::StrCat(name, " ", temp / 1000, " C");
    }
  }
  // No zones at all: the OS reports no temperatures (many VMs); nothing to protect from here.
  s->thermal.Set(level, now, zones == 0 ? "no thermal zones" : absl::StrCat("thermal_zone (", hottest, ")"));
}

// --- memory ---

void MemoryProbe::Fill(Snapshot* s, absl::Time now) {
  auto info = MemInfo(root_);
  if (!info.count("MemTotal") || !info.count("MemAvailable") || info["MemTotal"] <= 0) {
    s->memory = {};
    s->memory.source = "/proc/meminfo unreadable";
    return;
  }
  double available = static_cast<double>(info["MemAvailable"]) / static_cast<double>(info["MemTotal"]);
  MemoryPressure level = available < 0.05 ? MemoryPressure::kCritical
                         : available < 0.10 ? MemoryPressure::kWarn
                                            : MemoryPressure::kNormal;
  std::string source = "/proc/meminfo";
  std::string psi;
  if (ReadWhole(Path(root_, "proc/pressure/memory"), &psi)) {
    source = "/proc/pressure/memory";
    for (absl::string_view line : absl::StrSplit(psi, '\n')) {
      bool full = absl::StartsWith(line, "full ");
      size_t at = line.find("avg10=");
      double avg10;
      if (at == absl::string_view::npos) continue;
      absl::string_view value = line.substr(at + 6);
      value = value.substr(0, value.find(' '));
      if (!absl::SimpleAtod(value, &avg10)) continue;
      if (full && avg10 > 10) level = MemoryPressure::kCritical;
      if (!full && avg10 > 20) level = std::max(level, MemoryPressure::kWarn);
    }
  }
  s->memory.Set(level, now, source);
}

// --- input devices ---

InputDeviceProbe::~InputDeviceProbe() { CloseAll(); }

void InputDeviceProbe::CloseAll() {
  for (auto& [path, fd] : fds_) close(fd);
  fds_.clear();
  last_scan_ = absl::InfinitePast();
  watching_since_ = absl::InfinitePast();
}

void InputDeviceProbe::Rescan(absl::Time now) {
  last_scan_ = now;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(Path(root_, "dev/input"), ec)) {
    std::string path = entry.path().string();
    if (!absl::StartsWith(entry.path().filename().string(), "event") || fds_.count(path)) continue;
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) fds_[path] = fd;
  }
}

void InputDeviceProbe::Fill(Snapshot* s, absl::Time now) {
  if (defer_to_logind_ && s->console_user.known() && s->console_user.source == "logind" && *s->console_user.value) {
    CloseAll();  // logind tells the owner's idle time for the seat: no device is read
    return;
  }
  if (now - last_scan_ >= absl::Seconds(30)) Rescan(now);  // hot-plugged keyboards
  if (fds_.empty()) {
    s->last_input = {};
    s->last_input.source = "no readable /dev/input/event* (needs root or the input group)";
    return;
  }
  if (watching_since_ == absl::InfinitePast()) watching_since_ = now;
  std::vector<pollfd> polls;
  for (auto& [path, fd] : fds_) polls.push_back({fd, POLLIN, 0});
  if (poll(polls.data(), polls.size(), 0) > 0) {
    char buffer[4096];
    for (const auto& p : polls) {
      if (p.revents & POLLIN) {
        while (read(p.fd, buffer, sizeof buffer) > 0) {
        }
        last_event_ = now;
      }
      if (p.revents & (POLLERR | POLLNVAL)) {  // unplugged: forget it, the next scan finds it again
        for (auto it = fds_.begin(); it != fds_.end(); ++it) {
          if (it->second == p.fd) {
            close(p.fd);
            fds_.erase(it);
            break;
          }
        }
      }
    }
  }
  // Before the first event we only know there was none since we started watching.
  absl::Time last = std::max(last_event_, watching_since_);
  // Signals from other sources (logind) may know an earlier or later time; keep the latest.
  if (!s->last_input.known() || s->last_input.source == name() || *s->last_input.value < last) {
    s->last_input.Set(last, now, name());
  }
}

// --- protected apps ---

void ProtectedAppProbe::Fill(Snapshot* s, absl::Time now) {
  std::error_code ec;
  fs::directory_iterator it(Path(root_, "proc"), ec);
  if (ec) {
    s->protected_app = {};
    s->protected_app.source = "/proc unreadable";
    return;
  }
  for (const auto& entry : it) {
    if (!IsPid(entry.path().filename().string())) continue;
    std::string comm = ReadTrimmed(entry.path().string() + "/comm");
    for (const auto& name : names_) {
      // comm is cut at 15 characters.
      if (!comm.empty() && (comm == name || (comm.size() == 15 && absl::StartsWith(name, comm)))) {
        s->protected_app.Set(name, now, "/proc/*/comm");
        return;
      }
    }
  }
  s->protected_app.Set("", now, "/proc/*/comm");
}

}  // namespace minions::availability
