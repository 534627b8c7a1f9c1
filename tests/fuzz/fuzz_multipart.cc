// A multipart/form-data body as a hostile client sends it to POST /v1/files, fed to the streaming
// reader in reads of varying sizes: parts and their bytes come out or a clear error; never a
// crash, never more buffered than a read plus a boundary.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "openai/multipart_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t step = 1 + data[0] % 64;  // the first byte picks the read size
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  size_t pos = 0;
  minions::openai::MultipartReader form("b0undary", [&](char* buffer, size_t n) -> absl::StatusOr<size_t> {
    size_t take = std::min({n, step, body.size() - pos});
    memcpy(buffer, body.data() + pos, take);
    pos += take;
    return take;
  });
  minions::openai::FormPart part;
  for (int parts = 0; parts < 1000; ++parts) {
    auto next = form.NextPart(&part);
    if (!next.ok() || !*next) break;
    while (true) {
      auto chunk = form.ReadChunk(1 + parts % 7);
      if (!chunk.ok() || chunk->empty()) break;
    }
  }
  return 0;
}
