#include "openai/multipart_reader.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace minions::openai {
namespace {

constexpr size_t kMaxPartHeaders = 16 << 10;
constexpr size_t kReadSize = 256 << 10;

// The value of `key` in a header's parameters ('; name="x"'); "" when absent.
std::string Parameter(const std::string& header, const std::string& key) {
  for (absl::string_view piece : absl::StrSplit(header, ';')) {
    piece = absl::StripAsciiWhitespace(piece);
    auto eq = piece.find('=');
    if (eq == absl::string_view::npos) continue;
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(piece.substr(0, eq)), key)) continue;
    absl::string_view value = absl::StripAsciiWhitespace(piece.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    return std::string(value);
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> MultipartBoundary(const std::string& content_type) {
  if (!absl::StartsWithIgnoreCase(content_type, "multipart/form-data")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the upload must be multipart/form-data (fields 'file' and 'purpose'); the Content-Type was '",
                     content_type.substr(0, 80), "'"));
  }
  std::string boundary = Parameter(content_type, "boundary");
  if (boundary.empty() || boundary.size() > 200) {
    return absl::InvalidArgumentError("the multipart/form-data Content-Type names no usable boundary");
  }
  return boundary;
}

MultipartReader::MultipartReader(std::string boundary, ReadFn read)
    : delimiter_("\r\n--" + boundary), read_(std::move(read)), buffer_("\r\n") {}

absl::StatusOr<bool> MultipartReader::More() {
  if (eof_) return false;
  Compact();
  size_t old = buffer_.size();
  buffer_.resize(old + kReadSize);
  auto n = read_(buffer_.data() + old, kReadSize);
  if (!n.ok()) {
    buffer_.resize(old);
    return n.status();
  }
  buffer_.resize(old + *n);
  if (*n == 0) eof_ = true;
  return *n > 0;
}

void MultipartReader::Compact() {
  if (pos_ > 0 && pos_ >= buffer_.size() / 2) {
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
}

absl::StatusOr<std::string> MultipartReader::ReadChunk(size_t max) {
  if (!in_part_ || part_done_) return std::string();
  max = std::max<size_t>(max, 1);
  while (true) {
    size_t found = buffer_.find(delimiter_, pos_);
    if (found != std::string::npos) {
      size_t n = std::min(max, found - pos_);
      std::string out = buffer_.substr(pos_, n);
      pos_ += n;
      if (pos_ == found) {
        pos_ += delimiter_.size();
        part_done_ = true;
      }
      if (!out.empty() || part_done_) return out;
    }
    // Bytes that cannot begin the delimiter are the part's for sure.
    size_t available = buffer_.size() - pos_;
    if (found == std::string::npos && available >= delimiter_.size() && available - (delimiter_.size() - 1) >= max) {
      std::string out = buffer_.substr(pos_, max);
      pos_ += max;
      return out;
    }
    auto more = More();
    if (!more.ok()) return more.status();
    if (!*more) {
      if (found != std::string::npos) continue;
      return absl::InvalidArgumentError("the multipart body ended before its closing boundary");
    }
  }
}

absl::StatusOr<std::string> MultipartReader::ReadAll(size_t max) {
  std::string all;
  while (true) {
    auto chunk = ReadChunk(64 << 10);
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) return all;
    all += *chunk;
    if (all.size() > max) return absl::InvalidArgumentError(absl::StrCat("a form field is longer than ", max, " bytes"));
  }
}

absl::StatusOr<bool> MultipartReader::NextPart(FormPart* part) {
  if (finished_) return false;
  while (in_part_ && !part_done_) {
    auto chunk = ReadChunk(kReadSize);
    if (!chunk.ok()) return chunk.status();
  }
  // After a delimiter: "--" closes the form; otherwise optional whitespace, then CRLF.
  while (buffer_.size() - pos_ < 2) {
    auto more = More();
    if (!more.ok()) return more.status();
    if (!*more) return absl::InvalidArgumentError("the multipart body ended after a boundary");
  }
  if (buffer_.compare(pos_, 2, "--") == 0) {
    finished_ = true;
    in_part_ = false;
    return false;
  }
  size_t end;
  while ((end = buffer_.find("\r\n\r\n", pos_)) == std::string::npos) {
    if (buffer_.size() - pos_ > kMaxPartHeaders) return absl::InvalidArgumentError("a form part's headers are too long");
    auto more = More();
    if (!more.ok()) return more.status();
    if (!*more) return absl::InvalidArgumentError("the multipart body ended inside a part's headers");
  }
  if (end - pos_ > kMaxPartHeaders) return absl::InvalidArgumentError("a form part's headers are too long");
  std::string headers = buffer_.substr(pos_, end - pos_);
  pos_ = end + 4;
  *part = FormPart{};
  bool disposition = false;
  for (absl::string_view line : absl::StrSplit(headers, "\r\n", absl::SkipEmpty())) {
    auto colon = line.find(':');
    if (colon == absl::string_view::npos) continue;  // the rest of the boundary line, or padding
    std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (name == "content-disposition") {
      if (!absl::StartsWithIgnoreCase(value, "form-data")) {
        return absl::InvalidArgumentError("a form part's Content-Disposition is not form-data");
      }
      disposition = true;
      part->name = Parameter(value, "name");
      part->filename = Parameter(value, "filename");
    } else if (name == "content-type") {
      part->content_type = value;
    }
  }
  if (!disposition || part->name.empty()) {
    return absl::InvalidArgumentError("a form part has no Content-Disposition with a name");
  }
  in_part_ = true;
  part_done_ = false;
  return true;
}

}  // namespace minions::openai
