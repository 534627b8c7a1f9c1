#include "runner/llama/fingerprint.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "build-info.h"
#include "llama.h"
#include "minions/version.h"

namespace minions::llama_runner {

std::string SystemFingerprint(const llama_model* model) {
  char name[256] = "", arch[64] = "";
  llama_model_meta_val_str(model, "general.name", name, sizeof(name));
  llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
  const std::string facts = absl::StrCat(kVersion, "|", llama_commit(), "|", llama_build_number(), "|", name, "|",
                                         arch, "|", llama_model_n_params(model), "|", llama_model_size(model));
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : facts) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return absl::StrFormat("fp_%016x", hash);
}

}  // namespace minions::llama_runner
