#pragma once
// How the verbs print: a message as JSON (proto field names, defaults included), a list as a
// JSON array, an error on standard error with exit code 1.

#include <cstdio>
#include <string>

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"

namespace minions::cli {

inline std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

template <typename Messages>
void PrintJsonArray(const Messages& messages) {
  printf("[");
  bool first = true;
  for (const auto& message : messages) {
    printf("%s%s", first ? "" : ",", ToJson(message).c_str());
    first = false;
  }
  printf("]\n");
}

inline int Fail(const absl::Status& status) {
  fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace minions::cli
