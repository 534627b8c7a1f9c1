#pragma once
// ThreadRole: "this runs on that thread", as a capability the compiler checks. State that only
// one thread touches (an agent's main loop, its heartbeat) is ABSL_GUARDED_BY(role) and the
// functions that touch it ABSL_EXCLUSIVE_LOCKS_REQUIRED(role); the loop's entry point claims the
// role with a ThreadRoleScope. clang's -Wthread-safety then rejects any other thread's code that
// reaches that state, just as it rejects unlocked access to state guarded by a mutex.
//
// A role is not a lock: claiming it never waits. It checks at run time that no two threads hold
// it at once (a broken promise aborts with the role's name).
// Threads: any (that is the point).

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"

namespace minions {

class ABSL_LOCKABLE ThreadRole {
 public:
  explicit constexpr ThreadRole(const char* name) : name_(name) {}
  ThreadRole(const ThreadRole&) = delete;
  ThreadRole& operator=(const ThreadRole&) = delete;

  void Claim() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (held_.exchange(true)) {
      std::fprintf(stderr, "two threads claimed the thread role '%s' at once\n", name_);
      std::abort();
    }
  }
  void Release() ABSL_UNLOCK_FUNCTION() { held_ = false; }

 private:
  const char* name_;
  std::atomic<bool> held_{false};
};

class ABSL_SCOPED_LOCKABLE ThreadRoleScope {
 public:
  explicit ThreadRoleScope(ThreadRole* role) ABSL_EXCLUSIVE_LOCK_FUNCTION(role) : role_(role) { role_->Claim(); }
  ~ThreadRoleScope() ABSL_UNLOCK_FUNCTION() { role_->Release(); }
  ThreadRoleScope(const ThreadRoleScope&) = delete;
  ThreadRoleScope& operator=(const ThreadRoleScope&) = delete;

 private:
  ThreadRole* role_;
};

}  // namespace minions
