#pragma once
// SHA-256 of bytes that arrive in pieces (a model pushed in parts, downloaded in ranges, read
// from disk): the digest model bytes are named by ("sha256:<hex>", model/model_ref.h).
// Threads: one Sha256 per thread; Sha256File is thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace minions {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::string_view bytes);
  // 64 lowercase hex digits of everything given; the hasher is spent after this.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "sha256:<hex>" of the file's bytes (read in 1 MiB pieces); NotFound/Unavailable when it cannot
// be read. `progress`, when given, is told the bytes read so far after each piece.
absl::StatusOr<std::string> Sha256File(const std::string& path,
                                       const std::function<void(int64_t)>& progress = nullptr);

}  // namespace minions
