#include "server/duplicate_ids.h"

#include <openssl/evp.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace minions {

int64_t DuplicateCustomIds::See(std::string_view custom_id, int64_t line) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(custom_id.data(), custom_id.size(), digest, &length, EVP_sha256(), nullptr);
  Key key;
  std::memcpy(&key.high, digest, sizeof key.high);
  std::memcpy(&key.low, digest + sizeof key.high, sizeof key.low);
  auto [it, fresh] = first_line_.try_emplace(key, line);
  if (fresh) return 0;
  ++count_;
  if (first_.size() < kKeptDuplicates) {
    first_.push_back(Duplicate{std::string(custom_id.substr(0, kShownIdBytes)), line, it->second});
  }
  return it->second;
}

std::string DuplicateCustomIds::Describe(const Duplicate& d) {
  return absl::StrCat("custom_id '", d.custom_id, "' on line ", d.line, " is already on line ", d.first_line);
}

std::string DuplicateCustomIds::Refusal() const {
  if (count_ == 0) return "";
  std::string out = Describe(first_.front());
  if (count_ > 1) {
    std::vector<int64_t> lines;
    for (size_t i = 1; i < first_.size(); ++i) lines.push_back(first_[i].line);
    absl::StrAppend(&out, " (", count_ - 1, " more line", count_ > 2 ? "s repeat" : " repeats",
                    " an earlier custom_id: line", lines.size() > 1 ? "s " : " ", absl::StrJoin(lines, ", "),
                    count_ - 1 > static_cast<int64_t>(lines.size()) ? ", ..." : "", ")");
  }
  absl::StrAppend(&out, "; each record needs a custom_id of its own (its answer is found by it)");
  return out;
}

}  // namespace minions
