#include "model/model_ref.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace minions {
namespace {

constexpr std::string_view kSha256Prefix = "sha256:";

bool EndsWithGguf(std::string_view text) {
  if (text.size() < 5) return false;
  std::string tail(text.substr(text.size() - 5));
  for (char& c : tail) c = absl::ascii_tolower(static_cast<unsigned char>(c));
  return tail == ".gguf";
}

bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; }

}  // namespace

absl::Status ValidateModelName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 128 && absl::ascii_isalnum(static_cast<unsigned char>(name[0])) &&
            !EndsWithGguf(name);
  for (char c : name) ok = ok && IsNameChar(c);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(name.substr(0, 140)),
                   "' is not a model name: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
                   "digit, not ending in .gguf"));
}

absl::Status ValidateModelDigest(std::string_view digest) {
  bool ok = digest.starts_with(kSha256Prefix) && digest.size() == kSha256Prefix.size() + 64;
  for (char c : digest.substr(std::min(digest.size(), kSha256Prefix.size()))) {
    ok = ok && (absl::ascii_isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'));
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(digest.substr(0, 80)), "' is not a model digest: use sha256: and 64 lowercase hex digits"));
}

absl::Status ValidateRunnerName(std::string_view runner) {
  bool ok = !runner.empty() && runner.size() <= 64 && absl::ascii_islower(static_cast<unsigned char>(runner[0]));
  for (char c : runner) {
    ok = ok && (absl::ascii_islower(static_cast<unsigned char>(c)) || absl::ascii_isdigit(static_cast<unsigned char>(c)) ||
                c == '_' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("'", std::string(runner.substr(0, 80)),
                                                 "' is not a runner name: use 1-64 of a-z, 0-9, '_' or '-', "
                                                 "starting with a letter"));
}

std::string_view DigestHex(std::string_view digest) {
  return digest.starts_with(kSha256Prefix) ? digest.substr(kSha256Prefix.size()) : digest;
}

absl::StatusOr<ModelRef> ParseModelRef(std::string_view text) {
  ModelRef ref;
  if (text.empty()) return absl::InvalidArgumentError("no model given: name a registry model or a GGUF path");
  if (text.find('/') != std::string_view::npos || EndsWithGguf(text)) {
    ref.name = std::string(text);
    ref.is_path = true;
    return ref;
  }
  std::string_view name = text;
  if (size_t at = text.find('@'); at != std::string_view::npos) {
    name = text.substr(0, at);
    std::string_view digest = text.substr(at + 1);
    if (absl::Status s = ValidateModelDigest(digest); !s.ok()) return s;
    ref.digest = std::string(digest);
  }
  if (absl::Status s = ValidateModelName(name); !s.ok()) return s;
  ref.name = std::string(name);
  return ref;
}

std::string ShownModel(const std::string& digest, const std::map<std::string, std::string>& names_by_digest) {
  constexpr size_t kShownHex = 12;
  if (!ValidateModelDigest(digest).ok()) return digest;
  const std::string shortened = "sha256:" + std::string(DigestHex(digest).substr(0, kShownHex));
  auto name = names_by_digest.find(digest);
  return name == names_by_digest.end() ? shortened : absl::StrCat(name->second, "@", shortened);
}

VisibleModels ModelsVisibleTo(bool admin, bool runs_callers_work, const ExecutorInfo& info,
                              const std::map<std::string, std::string>& names_by_digest) {
  VisibleModels out;
  if (admin) {
    out.cached = info.models;
    out.loaded = info.model_loaded;
    return out;
  }
  for (const std::string& digest : info.models) {
    if (names_by_digest.count(digest) > 0) out.cached.push_back(digest);
  }
  if (runs_callers_work || names_by_digest.count(info.model_loaded) > 0) {
    out.loaded = info.model_loaded;
  } else {
    out.loaded_hidden = !info.model_loaded.empty();
  }
  return out;
}

absl::Time HeartbeatShown(bool admin, absl::Time beat) {
  if (admin || beat == absl::InfinitePast()) return beat;
  return absl::FromUnixMillis(absl::ToUnixMillis(beat) / absl::ToInt64Milliseconds(kHeartbeatShownGrain) *
                              absl::ToInt64Milliseconds(kHeartbeatShownGrain));
}

std::map<std::string, std::string> ModelNamesByDigest(const std::vector<ModelRecord>& models) {
  std::map<std::string, std::string> names;
  for (const ModelRecord& m : models) names.emplace(m.digest, m.name);
  return names;
}

}  // namespace minions
