#pragma once
// MultipartReader: reads a multipart/form-data body (RFC 7578) part by part as it arrives, so a
// large file part can be streamed on without the body ever being held whole: at most one chunk
// plus one boundary is buffered.
// Ownership: borrows the body's reader. Threads: one at a time.

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace minions::openai {

// The boundary of a "multipart/form-data; boundary=..." Content-Type; InvalidArgument otherwise.
absl::StatusOr<std::string> MultipartBoundary(const std::string& content_type);

struct FormPart {
  std::string name;      // of its Content-Disposition
  std::string filename;  // "" for a plain field
  std::string content_type;
};

class MultipartReader {
 public:
  // Reads up to `size` bytes of the body into the buffer; 0 at its end.
  using ReadFn = std::function<absl::StatusOr<size_t>(char* buffer, size_t size)>;
  MultipartReader(std::string boundary, ReadFn read);

  // Moves to the next part (skipping what is left of the current one) and reads its headers;
  // false after the closing boundary. InvalidArgument for a malformed form.
  absl::StatusOr<bool> NextPart(FormPart* part);
  // The current part's next bytes (at most `max`); "" at its end.
  absl::StatusOr<std::string> ReadChunk(size_t max);
  // The whole current part, refused past `max` bytes (for small fields).
  absl::StatusOr<std::string> ReadAll(size_t max);

 private:
  // Reads more of the body into buffer_; false at its end.
  absl::StatusOr<bool> More();
  void Compact();

  const std::string delimiter_;  // "\r\n--" + boundary
  ReadFn read_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  bool in_part_ = true;    // the preamble counts as a part to skip
  bool part_done_ = false;
  bool finished_ = false;  // the closing boundary was read
};

}  // namespace minions::openai
