#pragma once
// Minimal leveled logging to stderr, one line per message. Every line about a job carries its ids
// (job= task= attempt= executor=) in the message itself; tests never assert on log text.
// Control characters in a message (newlines, escapes: fields such as executor names come from
// callers) are written escaped (\n, \x1b), so every message stays one line.
// Thread-safe: each message is written with a single write(2).

#include <sstream>
#include <string>
#include <string_view>

namespace minions {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Prefix every line with this process's role (e.g. "runner", "executor-2").
void SetLogComponent(std::string component);
// `text` with every control character (below 0x20, and 0x7f) escaped as \n, \r, \t or \xNN.
std::string EscapeControlCharacters(std::string_view text);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace minions

// A statement of its own in any context (a for header, not an if: no dangling else).
#define MINIONS_LOG(level)                                                                       \
  for (bool _minions_log_once = ::minions::LogLevel::k##level >= ::minions::GetLogLevel();       \
       _minions_log_once; _minions_log_once = false)                                             \
  ::minions::LogMessage(::minions::LogLevel::k##level, __FILE__, __LINE__).stream()
