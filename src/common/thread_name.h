#pragma once
// NameThisThread: names the calling thread as `top -H`, `ps -L`, perf and gdb show it, so that an
// operator can tell which of a server's threads takes the CPU (the heartbeat committer, a lease
// thread, ...). Linux keeps the first 15 bytes; a longer name is cut.
// Threads: any; it names only the thread that calls it.

#include <pthread.h>

#include <string>
#include <string_view>

namespace minions {

inline void NameThisThread(std::string_view name) {
  const std::string cut(name.substr(0, 15));
#if defined(__APPLE__)
  pthread_setname_np(cut.c_str());
#elif defined(__linux__)
  pthread_setname_np(pthread_self(), cut.c_str());
#else
  (void)cut;  // elsewhere threads stay unnamed
#endif
}

}  // namespace minions
