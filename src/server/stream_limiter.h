#pragma once
// StreamLimiter: a counter of long-lived calls of one kind (WatchJob streams) with a ceiling, so
// that a client opening many cannot take every thread of the server. Acquire() hands out a slot
// that gives itself back when it goes out of scope.
// Threads: thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace minions {

class StreamLimiter {
 public:
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        owner_ = other.owner_;
        other.owner_ = nullptr;
      }
      return *this;
    }
    ~Slot() { Release(); }
    explicit operator bool() const { return owner_ != nullptr; }

   private:
    friend class StreamLimiter;
    explicit Slot(StreamLimiter* owner) : owner_(owner) {}
    void Release() {
      if (owner_ != nullptr) owner_->Release();
      owner_ = nullptr;
    }
    StreamLimiter* owner_ = nullptr;
  };

  explicit StreamLimiter(int64_t limit) : limit_(limit) {}

  // A slot, or an empty one when `limit` are held already.
  Slot Acquire() {
    absl::MutexLock lock(&mu_);
    if (open_ >= limit_) return Slot();
    ++open_;
    return Slot(this);
  }
  int64_t open() const {
    absl::MutexLock lock(&mu_);
    return open_;
  }
  // The error for a refused call.
  absl::Status Refusal(std::string_view what) const {
    return absl::ResourceExhaustedError(absl::StrCat("this server has ", limit_, " ", std::string(what),
                                                     " open, its limit; try again later"));
  }

 private:
  void Release() {
    absl::MutexLock lock(&mu_);
    --open_;
  }

  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace minions
