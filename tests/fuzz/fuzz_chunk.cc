// A chunk as an executor may upload it: the task's records, its output object and its error object
// (three parts of the input, split at NUL bytes) through the server's check. Never a crash.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runner/batch_record.h"
#include "server/chunk_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace minions;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  size_t a = text.find('\0');
  size_t b = a == std::string_view::npos ? std::string_view::npos : text.find('\0', a + 1);
  std::string_view records_text = text.substr(0, a);
  std::string_view output = a == std::string_view::npos ? "" : text.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
  std::string_view errors = b == std::string_view::npos ? "" : text.substr(b + 1);
  std::vector<std::string> records = SplitRecordLines(records_text);
  const int64_t n = static_cast<int64_t>(records.size());
  std::vector<std::string> ids = ExpectedCustomIds(records, 0, n);
  for (int64_t failed = 0; failed <= 1; ++failed) {
    Chunk chunk{1, 0, 0, n, failed};
    (void)VerifyChunk(chunk, output, errors, ids);
    Chunk tail{1, 1, n > 0 ? n - 1 : 0, n, failed};
    (void)VerifyChunk(tail, output, errors, ExpectedCustomIds(records, tail.begin, tail.end));
  }
  return 0;
}
