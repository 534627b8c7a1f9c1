#pragma once
// Reads what placement needs from a GGUF file's header (ModelFacts): its metadata keys and its
// tensor table. The bytes come from anyone who pushes a model, so the reader trusts nothing: every
// length and count is checked against the bytes there are, and a malformed header is
// InvalidArgument saying what is wrong.
//
// The header is at the start of the file and its size is not known in advance (a tokenizer's
// vocabulary alone may take megabytes): give it a prefix of the file; OutOfRange means the prefix
// ended inside the header, and a longer one (up to the file's end) should be tried.
//
// Pure; any thread.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/types.h"

namespace minions {

// `prefix` is the file's first bytes; `file_size` its full size (a tensor table that points past
// it is refused).
absl::StatusOr<ModelFacts> ReadGgufFacts(std::string_view prefix, int64_t file_size);

// llama.cpp's name for a general.file_type value ("Q4_K_M"); "" for one it does not know.
std::string_view GgufFileTypeName(int64_t file_type);

}  // namespace minions
