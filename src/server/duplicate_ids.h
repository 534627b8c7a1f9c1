#pragma once
// DuplicateCustomIds: finds the custom_ids an input uses more than once, as its lines stream by,
// in memory bounded by the number of records, not by the ids' sizes: it keeps, per id, the first
// 128 bits of its SHA-256 and the line it was first seen on (an attacker cannot make two ids look
// alike, and an input of long ids costs what one of short ids does). Every submission path checks
// an input through it (the splitter behind `minions submit` and the gRPC API, the OpenAI API's
// batch validation), so they refuse the same inputs with the same words.
// Threads: one instance per input, used by one thread at a time.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace minions {

class DuplicateCustomIds {
 public:
  // One use of an id already seen.
  struct Duplicate {
    std::string custom_id;  // at most kShownIdBytes of it
    int64_t line = 0;       // 1-based line numbers of the input, blank lines counted
    int64_t first_line = 0;
  };
  static constexpr size_t kShownIdBytes = 64;
  static constexpr size_t kKeptDuplicates = 5;

  // `custom_id` is on line `line` (lines in increasing order). Returns the line it was first seen
  // on when it was seen before, else 0 (and remembers it).
  int64_t See(std::string_view custom_id, int64_t line);

  int64_t count() const { return count_; }
  // The first kKeptDuplicates duplicates, in input order.
  const std::vector<Duplicate>& first() const { return first_; }
  // "custom_id 'r3' is on line 7 and on line 3 (2 more repeated ids: lines 9, 12); each record needs
  // a custom_id of its own", or "" when there is none: the refusal both submission paths give.
  std::string Refusal() const;
  // One duplicate's words (the OpenAI API's error line of it).
  static std::string Describe(const Duplicate& d);

 private:
  struct Key {
    uint64_t high = 0, low = 0;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.high, k.low);
    }
  };
  absl::flat_hash_map<Key, int64_t> first_line_;
  int64_t count_ = 0;
  std::vector<Duplicate> first_;
};

}  // namespace minions
