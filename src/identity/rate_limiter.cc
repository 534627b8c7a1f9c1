#include "identity/rate_limiter.h"

#include <algorithm>

namespace minions {

bool RateLimiter::Admit(const std::string& key, int64_t per_second, absl::Time now) {
  if (per_second <= 0) return true;
  const double rate = static_cast<double>(per_second);
  const double capacity = 2 * rate;
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(key, Bucket{capacity, now});
  Bucket& bucket = it->second;
  if (!fresh && now > bucket.refilled_at) {
    bucket.tokens = std::min(capacity, bucket.tokens + rate * absl::ToDoubleSeconds(now - bucket.refilled_at));
    bucket.refilled_at = now;
  }
  // A lowered rate takes effect at once.
  bucket.tokens = std::min(bucket.tokens, capacity);
  if (bucket.tokens < 1) return false;
  bucket.tokens -= 1;
  return true;
}

}  // namespace minions
