#include "openai/multipart_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

namespace minions::openai {
namespace {

// A reader over `body` that gives at most `step` bytes a call.
MultipartReader::ReadFn Over(const std::string& body, size_t step) {
  auto pos = std::make_shared<size_t>(0);
  return [body, step, pos](char* buffer, size_t size) -> absl::StatusOr<size_t> {
    size_t n = std::min({size, step, body.size() - *pos});
    memcpy(buffer, body.data() + *pos, n);
    *pos += n;
    return n;
  };
}

std::string Form(const std::string& boundary, const std::string& file) {
  return "--" + boundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--" + boundary +
         "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: "
         "application/jsonl\r\n\r\n" +
         file + "\r\n--" + boundary + "--\r\n";
}

TEST(MultipartReaderTest, ReadsEveryPartWhateverTheReadSizes) {
  // A file holding pieces of the delimiter, read 1, 3, 7 ... bytes at a time, comes back whole.
  std::string file = "line one\r\n--bound not quite\r\n--boun\r\n\r\n--";
  for (int i = 0; i < 1000; ++i) file += static_cast<char>('a' + i % 26);
  for (size_t step : {1u, 3u, 7u, 64u, 100000u}) {
    MultipartReader form("boundXYZ", Over(Form("boundXYZ", file), step));
    FormPart part;
    ASSERT_TRUE(*form.NextPart(&part));
    EXPECT_EQ(part.name, "purpose");
    EXPECT_EQ(*form.ReadAll(100), "batch");
    ASSERT_TRUE(*form.NextPart(&part));
    EXPECT_EQ(part.name, "file");
    EXPECT_EQ(part.filename, "in.jsonl");
    std::string got;
    while (true) {
      auto chunk = form.ReadChunk(5);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      if (chunk->empty()) break;
      EXPECT_LE(chunk->size(), 5u);
      got += *chunk;
    }
    EXPECT_EQ(got, file) << "step " << step;
    EXPECT_FALSE(*form.NextPart(&part));
  }
}

TEST(MultipartReaderTest, SkipsAPartNotRead) {
  MultipartReader form("b", Over(Form("b", "ignored"), 2));
  FormPart part;
  ASSERT_TRUE(*form.NextPart(&part));
  ASSERT_TRUE(*form.NextPart(&part));  // the purpose is skipped
  EXPECT_EQ(part.name, "file");
  ASSERT_TRUE(*form.NextPart(&part) == false);
}

TEST(MultipartReaderTest, RefusesMalformedForms) {
  FormPart part;
  {  // no closing boundary
    MultipartReader form("b", Over("--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc", 4));
    ASSERT_TRUE(*form.NextPart(&part));
    absl::Status status;
    while (true) {
      auto chunk = form.ReadChunk(10);
      if (!chunk.ok()) {
        status = chunk.status();
        break;
      }
      ASSERT_FALSE(chunk->empty()) << "the part must not end without its boundary";
    }
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  }
  {  // a part without a name
    MultipartReader form("b", Over("--b\r\nContent-Type: text/plain\r\n\r\nabc\r\n--b--\r\n", 4));
    EXPECT_TRUE(absl::IsInvalidArgument(form.NextPart(&part).status()));
  }
  {  // headers that never end
    MultipartReader form("b", Over("--b\r\n" + std::string(100000, 'x'), 1000));
    EXPECT_TRUE(absl::IsInvalidArgument(form.NextPart(&part).status()));
  }
  {  // nothing at all
    MultipartReader form("b", Over("", 4));
    EXPECT_FALSE(form.NextPart(&part).ok());
  }
  EXPECT_FALSE(MultipartBoundary("application/json").ok());
  EXPECT_FALSE(MultipartBoundary("multipart/form-data").ok());
  EXPECT_EQ(*MultipartBoundary("multipart/form-data; boundary=\"abc\""), "abc");
}

}  // namespace
}  // namespace minions::openai
