#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string_view>

namespace minions {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_component_mu;
std::string& Component() {
  static std::string* component = new std::string("minions");
  return *component;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogComponent(std::string component) {
  std::lock_guard<std::mutex> lock(g_component_mu);
  Component() = std::move(component);
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  // Wall-clock time is fine here: log stamps are for people, never for decisions.
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  std::string component;
  {
    std::lock_guard<std::mutex> lock(g_component_mu);
    component = Component();
  }
  stream_ << LevelName(level) << ' ' << stamp << '.' << (millis < 100 ? (millis < 10 ? "00" : "0") : "")
          << millis << ' ' << component << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

std::string EscapeControlCharacters(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out.push_back(c);
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\x";
        out.push_back(kHex[u >> 4]);
        out.push_back(kHex[u & 15]);
      }
    }
  }
  return out;
}

LogMessage::~LogMessage() {
  // One line per message, whatever its fields hold: an executor's name, a job's error or a model's
  // path can come from anyone, and a newline or a terminal escape in them must not forge a line.
  std::string text = EscapeControlCharacters(stream_.str());
  text.push_back('\n');
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  (void)level_;
}

}  // namespace minions
