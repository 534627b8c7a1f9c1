#include "store/common/id_generator.h"

#include <cstdint>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace minions {

std::string IdGenerator::NewId(const char* prefix) {
  uint64_t bits;
  {
    absl::MutexLock lock(&mu_);
    bits = random_();
  }
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%012llx", static_cast<unsigned long long>(bits & 0xffffffffffffULL));
  return absl::StrCat(prefix, hex);
}

}  // namespace minions
