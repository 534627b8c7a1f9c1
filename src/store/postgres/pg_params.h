#pragma once
// Params: the bound parameters of a PostgreSQL statement (pg_connection.h runs it), sent as text.
// A value type; any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "store/common/store_rows.h"

namespace minions::postgres_store {

// Query parameters, sent as text (NULL as nullopt).
class Params {
 public:
  Params& Text(std::string value) {
    values_.emplace_back(std::move(value));
    return *this;
  }
  Params& Int(int64_t value) { return Text(std::to_string(value)); }
  Params& Bool(bool value) { return Text(value ? "true" : "false"); }
  Params& Null() {
    values_.emplace_back(std::nullopt);
    return *this;
  }
  Params& Time(absl::Time value) { return Int(absl::ToUnixMicros(value)); }
  Params& Time(const std::optional<absl::Time>& value) { return value ? Time(*value) : Null(); }
  // A LIMIT: none (NULL, i.e. LIMIT ALL) unless positive.
  Params& Limit(int limit) { return limit > 0 ? Int(limit) : Null(); }
  Params& Value(const store_rows::Value& value);
  // One row's values, as $n, $n+1, ...
  Params& Values(const store_rows::Values& values);
  // Rows of `columns` values each, as one array parameter per column (for unnest(...)).
  Params& Columns(const std::vector<store_rows::Values>& rows, int columns);
  const std::vector<std::optional<std::string>>& values() const { return values_; }

 private:
  std::vector<std::optional<std::string>> values_;
};

}  // namespace minions::postgres_store
