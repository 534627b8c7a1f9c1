#include "availability/macos_parse.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace minions::availability::macos {
namespace {

// A recursive-descent reader of ioreg's value syntax.
class IoregReader {
 public:
  explicit IoregReader(const std::string& text) : s_(text) {}

  absl::StatusOr<Json> Value() {
    Skip();
    if (pos_ >= s_.size()) return Error("a value");
    char c = s_[pos_];
    if (c == '{') return Container('}', true);
    if (c == '(') return Container(')', false);
    if (c == '"') return String();
    if (c == '<') {
      size_t end = s_.find('>', pos_);
      if (end == std::string::npos) return Error("'>'");
      Json data = s_.substr(pos_ + 1, end - pos_ - 1);  // hex digits (or a "quoted" blob) as text
      pos_ = end + 1;
      return data;
    }
    size_t start = pos_;
    while (pos_ < s_.size() && !strchr(",)}=\n", s_[pos_])) ++pos_;
    std::string word(absl::StripAsciiWhitespace(s_.substr(start, pos_ - start)));
    if (word == "Yes") return Json(true);
    if (word == "No") return Json(false);
    int64_t i;
    if (absl::SimpleAtoi(word, &i)) return Json(i);
    uint64_t u;
    if (absl::SimpleAtoi(word, &u)) return Json(u);
    double d;
    if (absl::SimpleAtod(word, &d)) return Json(d);
    if (word.empty()) return Error("a value");
    return Json(word);
  }
  size_t pos() const { return pos_; }

 private:
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  absl::Status Error(const char* wanted) {
    return absl::InvalidArgumentError(absl::StrCat("ioreg value: expected ", wanted, " at offset ", pos_));
  }
  absl::StatusOr<Json> String() {
    std::string out;
    ++pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) return Error("'\"'");
    ++pos_;
    return Json(out);
  }
  absl::StatusOr<Json> Container(char close, bool dict) {
    ++pos_;
    Json out = dict ? Json::object() : Json::array();
    while (true) {
      Skip();
      if (pos_ >= s_.size()) return Error(dict ? "'}'" : "')'");
      if (s_[pos_] == close) {
        ++pos_;
        return out;
      }
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (dict) {
        auto key = String();
        if (!key.ok() || s_[pos_ - 1] != '"') return Error("a \"key\"");
        Skip();
        if (pos_ >= s_.size() || s_[pos_] != '=') return Error("'='");
        ++pos_;
        auto value = Value();
        if (!value.ok()) return value.status();
        out[key->get<std::string>()] = *value;
      } else {
        auto value = Value();
        if (!value.ok()) return value.status();
        out.push_back(*value);
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

double Number(const Json& j, double fallback) { return j.is_number() ? j.get<double>() : fallback; }

}  // namespace

absl::StatusOr<Json> ParseIoregValue(const std::string& text) {
  IoregReader reader(text);
  return reader.Value();
}

Json ParseIoregProperties(const std::string& text) {
  Json out = Json::object();
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // "    |   "HIDIdleTime" = 1234"
    size_t quote = line.find('"');
    if (quote == absl::string_view::npos) continue;
    absl::string_view prefix = line.substr(0, quote);
    if (prefix.find_first_not_of(" |+-o") != absl::string_view::npos) continue;
    size_t end = line.find('"', quote + 1);
    if (end == absl::string_view::npos) continue;
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(end + 1));
    if (!absl::ConsumePrefix(&rest, "=")) continue;
    auto value = ParseIoregValue(std::string(rest));
    if (value.ok()) out[std::string(line.substr(quote + 1, end - quote - 1))] = *value;
  }
  return out;
}

std::optional<absl::Duration> HidIdleTime(const Json& properties) {
  const Json& v = JsonField(properties, "HIDIdleTime");
  if (!v.is_number()) return std::nullopt;
  return absl::Nanoseconds(v.get<double>());
}

ConsoleState ReadConsoleUsers(const Json& users) {
  ConsoleState state;
  if (!users.is_array()) return state;
  for (const Json& user : users) {
    if (!JsonBool(user, "kCGSSessionOnConsoleKey")) continue;
    state.console_user = true;
    state.locked |= JsonBool(user, "CGSSessionScreenIsLocked");
  }
  return state;
}

PowerState ReadPowerSources(const Json& descriptions) {
  PowerState state;
  if (!descriptions.is_array()) return state;
  for (const Json& d : descriptions) {
    if (JsonString(d, "Type") != "InternalBattery") continue;  // a UPS is not "on battery"
    state.on_ac = JsonString(d, "Power Source State") != "Battery Power";
    double current = Number(JsonField(d, "Current Capacity"), -1);
    double max = Number(JsonField(d, "Max Capacity"), 100);
    if (current >= 0 && max > 0) state.battery_percent = 100.0 * current / max;
  }
  return state;
}

absl::StatusOr<PowerState> ParsePmsetBatt(const std::string& text) {
  PowerState state;
  bool header = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, "drawing from")) {
      header = true;
      // A desktop on a UPS draws from 'UPS Power'; only the internal battery counts.
      state.on_ac = !absl::StrContains(line, "'Battery Power'");
    }
    if (absl::StrContains(line, "InternalBattery")) {
      size_t pct = line.find('%');
      if (pct == absl::string_view::npos) continue;
      size_t start = line.find_last_of(" \t", pct);
      double v;
      if (start != absl::string_view::npos && absl::SimpleAtod(line.substr(start + 1, pct - start - 1), &v)) {
        state.battery_percent = v;
      }
    }
  }
  if (!header) return absl::InvalidArgumentError("pmset -g batt: no 'Now drawing from' line");
  return state;
}

bool OthersPreventDisplaySleep(const Json& by_process, int own_pid) {
  if (!by_process.is_object()) return false;
  for (const auto& [pid, list] : by_process.items()) {
    if (pid == std::to_string(own_pid) || !list.is_array()) continue;
    for (const Json& a : list) {
      std::string type = JsonString(a, "AssertType");
      if (type == "PreventUserIdleDisplaySleep" || type == "NoDisplaySleepAssertion") return true;
    }
  }
  return false;
}

bool ParsePmsetAssertionsPreventDisplaySleep(const std::string& text, int own_pid) {
  // "   pid 312(Safari): [0x0000...] 00:10:02 PreventUserIdleDisplaySleep named: "Video Wake Lock""
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "pid ")) continue;
    size_t paren = line.find('(');
    int pid;
    if (paren == absl::string_view::npos || !absl::SimpleAtoi(line.substr(0, paren), &pid) || pid == own_pid) continue;
    if (absl::StrContains(line, " PreventUserIdleDisplaySleep ") || absl::StrContains(line, " NoDisplaySleepAssertion ")) {
      return true;
    }
  }
  return false;
}

Thermal ThermalFromPressureLevel(uint64_t level) {
  switch (level) {
    case 0: return Thermal::kNominal;
    case 1: return Thermal::kFair;
    case 2: return Thermal::kSerious;
    default: return Thermal::kCritical;
  }
}

std::optional<MemoryPressure> MemoryFromPressureLevel(int level) {
  switch (level) {
    case 1: return MemoryPressure::kNormal;
    case 2: return MemoryPressure::kWarn;
    case 4: return MemoryPressure::kCritical;
  }
  return std::nullopt;
}

std::optional<double> AcceleratorUtilization(const Json& stats) {
  const Json& v = JsonField(stats, "Device Utilization %");
  if (!v.is_number()) return std::nullopt;
  return std::clamp(v.get<double>() / 100.0, 0.0, 1.0);
}

}  // namespace minions::availability::macos
