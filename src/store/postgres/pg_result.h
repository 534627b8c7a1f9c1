#pragma once
// PgResult: an owned libpq result in text format, and Row, one row of it read as a SQLite
// statement's current row is (store/common/store_rows.h's readers take either). Owns the PGresult;
// the thread that holds it.

#include <libpq-fe.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"

namespace minions::postgres_store {

// An owned PGresult in text format.
class PgResult {
 public:
  explicit PgResult(PGresult* result) : result_(result) {}
  PgResult(PgResult&& other) noexcept : result_(std::exchange(other.result_, nullptr)) {}
  PgResult& operator=(PgResult&&) = delete;
  ~PgResult() {
    if (result_ != nullptr) PQclear(result_);
  }

  int Rows() const { return PQntuples(result_); }
  bool IsNull(int row, int column) const { return PQgetisnull(result_, row, column) != 0; }
  std::string Text(int row, int column) const {
    return std::string(PQgetvalue(result_, row, column), PQgetlength(result_, row, column));
  }
  int64_t Int(int row, int column) const { return std::strtoll(PQgetvalue(result_, row, column), nullptr, 10); }
  bool Bool(int row, int column) const { return PQgetvalue(result_, row, column)[0] == 't'; }
  absl::Time Time(int row, int column) const { return absl::FromUnixMicros(Int(row, column)); }
  std::optional<absl::Time> OptTime(int row, int column) const {
    if (IsNull(row, column)) return std::nullopt;
    return Time(row, column);
  }
  std::optional<int64_t> OptInt(int row, int column) const {
    if (IsNull(row, column)) return std::nullopt;
    return Int(row, column);
  }
  const PGresult* get() const { return result_; }
  // Rows an INSERT/UPDATE/DELETE touched.
  int64_t Affected() const {
    const char* count = PQcmdTuples(result_);
    return count[0] != '\0' ? std::strtoll(count, nullptr, 10) : 0;
  }

 private:
  PGresult* result_;
};

// One row of a result, read like a SQLite statement's current row.
struct Row {
  const PgResult& result;
  int row;
  std::string Text(int column) const { return result.Text(row, column); }
  int64_t Int(int column) const { return result.Int(row, column); }
  bool Bool(int column) const { return result.Bool(row, column); }
  absl::Time Time(int column) const { return result.Time(row, column); }
  std::optional<absl::Time> OptTime(int column) const { return result.OptTime(row, column); }
  std::optional<int64_t> OptInt(int column) const { return result.OptInt(row, column); }
};

}  // namespace minions::postgres_store
