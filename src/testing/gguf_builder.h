#pragma once
// GGUF bytes built by hand, for tests of what reads GGUF headers (model/gguf_header.h, the model
// registry): a header with chosen metadata and tensors, and TinyGguf(), a small "llama" model file
// (header plus padding; no runner can load it).

#include <cstdint>
#include <string>
#include <vector>

namespace minions::testing {

// The metadata and tensor table of a GGUF file, written as llama.cpp writes them.
class GgufBuilder {
 public:
  GgufBuilder& Kv(const std::string& key, uint32_t value) {
    Key(key, 4);
    Raw(value);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& Kv(const std::string& key, const std::string& value) {
    Key(key, 8);
    String(value);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& Float(const std::string& key, float value) {
    Key(key, 6);
    Raw(value);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& Strings(const std::string& key, int n) {
    Key(key, 9);
    Raw(uint32_t{8});
    Raw(uint64_t(n));
    for (int i = 0; i < n; ++i) String("t" + std::to_string(i));
    ++n_kv_;
    return *this;
  }
  // The metadata of a "llama" model named "tiny": its file type (1: F16, 15: Q4_K_M), context
  // length, blocks and embedding width; 4 attention heads, 2 of them for keys and values.
  GgufBuilder& Llama(uint32_t file_type, uint32_t context_length, uint32_t blocks, uint32_t embedding) {
    return Kv("general.architecture", std::string("llama"))
        .Kv("general.name", std::string("tiny"))
        .Kv("general.file_type", file_type)
        .Kv("llama.context_length", context_length)
        .Kv("llama.block_count", blocks)
        .Kv("llama.embedding_length", embedding)
        .Kv("llama.attention.head_count", uint32_t{4})
        .Kv("llama.attention.head_count_kv", uint32_t{2});
  }
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims) {
    String(tensors_, name);
    Raw(tensors_, uint32_t(dims.size()));
    for (uint64_t d : dims) Raw(tensors_, d);
    Raw(tensors_, uint32_t{0});
    Raw(tensors_, uint64_t{0});
    ++n_tensors_;
    return *this;
  }
  std::string Build(uint32_t version = 3) const {
    std::string out = "GGUF";
    Raw(out, version);
    Raw(out, n_tensors_);
    Raw(out, n_kv_);
    return out + kv_ + tensors_;
  }

 private:
  template <typename T>
  static void Raw(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  template <typename T>
  void Raw(T value) {
    Raw(kv_, value);
  }
  static void String(std::string& out, const std::string& s) {
    Raw(out, uint64_t(s.size()));
    out += s;
  }
  void String(const std::string& s) { String(kv_, s); }
  void Key(const std::string& key, uint32_t type) {
    String(key);
    Raw(type);
  }
  std::string kv_, tensors_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// A small GGUF "llama" file of about `size` bytes (the header, then `fill` bytes up to size).
inline std::string TinyGguf(size_t size = 4096, char fill = 'x') {
  std::string bytes = GgufBuilder()
                          .Llama(/*file_type=*/1, /*context_length=*/2048, /*blocks=*/2, /*embedding=*/64)
                          .Strings("tokenizer.ggml.tokens", 100)
                          .Tensor("token_embd.weight", {64, 100})
                          .Build();
  if (bytes.size() < size) bytes.append(size - bytes.size(), fill);
  return bytes;
}

}  // namespace minions::testing
