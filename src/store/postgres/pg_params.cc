#include "store/postgres/pg_params.h"

#include <variant>

#include "absl/strings/str_cat.h"

namespace minions::postgres_store {

Params& Params::Value(const store_rows::Value& value) {
  if (const int64_t* number = std::get_if<int64_t>(&value)) return Int(*number);
  if (const std::string* text = std::get_if<std::string>(&value)) return Text(*text);
  return Null();
}

Params& Params::Values(const store_rows::Values& values) {
  for (const store_rows::Value& value : values) Value(value);
  return *this;
}

Params& Params::Columns(const std::vector<store_rows::Values>& rows, int columns) {
  for (int column = 0; column < columns; ++column) {
    std::string array = "{";
    for (size_t row = 0; row < rows.size(); ++row) {
      if (row > 0) array += ',';
      const store_rows::Value& value = rows[row][column];
      if (const int64_t* number = std::get_if<int64_t>(&value)) {
        absl::StrAppend(&array, *number);
      } else if (const std::string* text = std::get_if<std::string>(&value)) {
        array += '"';
        for (char ch : *text) {
          if (ch == '"' || ch == '\\') array += '\\';
          array += ch;
        }
        array += '"';
      } else {
        array += "NULL";
      }
    }
    array += '}';
    Text(std::move(array));
  }
  return *this;
}

}  // namespace minions::postgres_store
