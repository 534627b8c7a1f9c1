#pragma once
// The SQLite store's plumbing (sqlite_connection.h, sqlite_transaction.h): errors, and a prepared
// statement in use. Internal to minions_store_sqlite.
// Threads: a Statement belongs to the transaction (and so the lock) it runs in.

#include <sqlite3.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "store/common/store_rows.h"

namespace minions {
namespace sqlite_store {

inline absl::Status SqliteError(sqlite3* db, int rc, std::string_view what) {
  std::string message = absl::StrCat("sqlite: ", std::string(what), ": ", sqlite3_errstr(rc));
  if (db != nullptr && sqlite3_errcode(db) == rc) absl::StrAppend(&message, " (", sqlite3_errmsg(db), ")");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

inline std::optional<absl::Time> OptionalTime(sqlite3_stmt* stmt, int column) {
  if (sqlite3_column_type(stmt, column) == SQLITE_NULL) return std::nullopt;
  return absl::FromUnixMicros(sqlite3_column_int64(stmt, column));
}

// A cached prepared statement in use: binds parameters by name, steps, reads columns. Resets the
// statement (and clears its bindings) when it goes out of scope, so the cache can hand it out
// again. A statement must not be used twice at once: callers collect keys first, then load rows.
class Statement {
 public:
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Statement(Statement&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), bind_error_(std::move(other.bind_error_)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() {
    if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
    }
  }

  Statement& BindInt(const char* name, int64_t value) {
    if (int i = Index(name)) Check(sqlite3_bind_int64(stmt_, i, value), name);
    return *this;
  }
  Statement& BindText(const char* name, const std::string& value) {
    if (int i = Index(name)) {
      Check(sqlite3_bind_text(stmt_, i, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT), name);
    }
    return *this;
  }
  Statement& BindNull(const char* name) {
    if (int i = Index(name)) Check(sqlite3_bind_null(stmt_, i), name);
    return *this;
  }
  Statement& BindTime(const char* name, absl::Time value) { return BindInt(name, absl::ToUnixMicros(value)); }
  // Binds `values` to the positional parameters ?1, ?2, ... in order.
  Statement& BindValues(const store_rows::Values& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      const int index = static_cast<int>(i + 1);
      const char* what = "a row value";
      if (const int64_t* number = std::get_if<int64_t>(&values[i])) {
        Check(sqlite3_bind_int64(stmt_, index, *number), what);
      } else if (const std::string* text = std::get_if<std::string>(&values[i])) {
        Check(sqlite3_bind_text(stmt_, index, text->data(), static_cast<int>(text->size()), SQLITE_TRANSIENT), what);
      } else {
        Check(sqlite3_bind_null(stmt_, index), what);
      }
    }
    return *this;
  }
  Statement& BindTime(const char* name, const std::optional<absl::Time>& value) {
    return value ? BindTime(name, *value) : BindNull(name);
  }

  // Advances to the next row: true when there is one, false when the statement is done.
  absl::StatusOr<bool> Step() {
    RETURN_IF_ERROR(bind_error_);
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, Excerpt(sqlite3_sql(stmt_), 60));
  }
  // Runs a statement that returns no rows.
  absl::Status Run() {
    ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return absl::OkStatus();
  }
  int Changes() const { return sqlite3_changes(db_); }

  int64_t Int(int column) const { return sqlite3_column_int64(stmt_, column); }
  bool Bool(int column) const { return Int(column) != 0; }
  std::string Text(int column) const {
    const unsigned char* text = sqlite3_column_text(stmt_, column);
    if (text == nullptr) return "";
    return std::string(reinterpret_cast<const char*>(text), sqlite3_column_bytes(stmt_, column));
  }
  absl::Time Time(int column) const { return absl::FromUnixMicros(Int(column)); }
  std::optional<absl::Time> OptTime(int column) const { return OptionalTime(stmt_, column); }
  std::optional<int64_t> OptInt(int column) const {
    if (sqlite3_column_type(stmt_, column) == SQLITE_NULL) return std::nullopt;
    return Int(column);
  }

 private:
  int Index(const char* name) {
    int i = sqlite3_bind_parameter_index(stmt_, name);
    if (i == 0 && bind_error_.ok()) {
      bind_error_ = absl::InternalError(absl::StrCat("no parameter ", name, " in: ", sqlite3_sql(stmt_)));
    }
    return i;
  }
  void Check(int rc, const char* name) {
    if (rc != SQLITE_OK && bind_error_.ok()) bind_error_ = SqliteError(db_, rc, absl::StrCat("bind ", name));
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  absl::Status bind_error_;
};

}  // namespace sqlite_store

}  // namespace minions
