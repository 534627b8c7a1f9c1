#pragma once
// How the verbs print: a message as JSON (proto field names, defaults included), a list as a
// JSON array, an error on standard error with exit code 1.

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

// What a verb prints once the server answered: the answer as JSON with --json, else what `say`
// prints of it for people. Returns the exit code (0).
template <typename Message, typename Say>
int PrintAnswer(const Message& answer, bool json, Say say) {
  if (json) {
    printf("%s\n", ToJson(answer).c_str());
  } else {
    say(answer);
  }
  return 0;
}

// A file a verb cannot read, and why (`error`: the errno of the failed open): missing, a folder,
// not permitted.
inline absl::Status CannotRead(const std::string& path, int error) {
  std::error_code ec;
  const std::string why = std::filesystem::is_directory(path, ec) ? "it is a folder, not a file"
                          : error != 0                            ? std::strerror(error)
                                                                  : "it cannot be opened";
  return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", why));
}

inline int Fail(const absl::Status& status) {
  fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace minions::cli
