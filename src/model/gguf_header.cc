#include "model/gguf_header.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace minions {
namespace {

enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

int64_t ScalarSize(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: return 0;
  }
}

// Most metadata keys and tensors a header may declare: far above any real model, low enough
// that a hostile count cannot make the reader loop for long.
constexpr uint64_t kMaxEntries = uint64_t{1} << 24;
constexpr uint64_t kMaxDims = 8;

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  absl::Status Need(uint64_t n) const {
    if (n > bytes_.size() - pos_) return absl::OutOfRangeError("the GGUF header goes on past the bytes read");
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read() {
    if (absl::Status s = Need(sizeof(T)); !s.ok()) return s;
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));  // GGUF is little-endian, as are our hosts
    pos_ += sizeof(T);
    return value;
  }
  absl::StatusOr<std::string_view> String() {
    absl::StatusOr<uint64_t> length = Read<uint64_t>();
    if (!length.ok()) return length.status();
    if (absl::Status s = Need(*length); !s.ok()) return s;
    std::string_view text = bytes_.substr(pos_, *length);
    pos_ += *length;
    return text;
  }
  absl::Status Skip(uint64_t n) {
    if (absl::Status s = Need(n); !s.ok()) return s;
    pos_ += n;
    return absl::OkStatus();
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

#define GGUF_ASSIGN(lhs, expr)             \
  auto lhs##_or = (expr);                  \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *lhs##_or

// One metadata value: integers are returned (when `number` is given), strings kept, arrays
// skipped but counted.
struct Value {
  bool is_int = false;
  int64_t number = 0;
  std::string_view text;
  uint64_t array_length = 0;
};

absl::StatusOr<Value> ReadValue(Reader& reader, uint32_t type, int depth) {
  Value value;
  switch (type) {
    case kU8: { GGUF_ASSIGN(v, reader.Read<uint8_t>()); value.is_int = true; value.number = v; break; }
    case kI8: { GGUF_ASSIGN(v, reader.Read<int8_t>()); value.is_int = true; value.number = v; break; }
    case kU16: { GGUF_ASSIGN(v, reader.Read<uint16_t>()); value.is_int = true; value.number = v; break; }
    case kI16: { GGUF_ASSIGN(v, reader.Read<int16_t>()); value.is_int = true; value.number = v; break; }
    case kU32: { GGUF_ASSIGN(v, reader.Read<uint32_t>()); value.is_int = true; value.number = v; break; }
    case kI32: { GGUF_ASSIGN(v, reader.Read<int32_t>()); value.is_int = true; value.number = v; break; }
    case kU64: {
      GGUF_ASSIGN(v, reader.Read<uint64_t>());
      value.is_int = v <= static_cast<uint64_t>(INT64_MAX);
      value.number = static_cast<int64_t>(v);
      break;
    }
    case kI64: { GGUF_ASSIGN(v, reader.Read<int64_t>()); value.is_int = true; value.number = v; break; }
    case kF32: case kF64: case kBool: {
      if (absl::Status s = reader.Skip(ScalarSize(type)); !s.ok()) return s;
      break;
    }
    case kString: { GGUF_ASSIGN(v, reader.String()); value.text = v; break; }
    case kArray: {
      if (depth > 0) return absl::InvalidArgumentError("a GGUF array inside an array");
      GGUF_ASSIGN(item_type, reader.Read<uint32_t>());
      GGUF_ASSIGN(n, reader.Read<uint64_t>());
      value.array_length = n;
      if (int64_t size = ScalarSize(item_type); size > 0) {
        if (n > UINT64_MAX / static_cast<uint64_t>(size)) return absl::InvalidArgumentError("a GGUF array too long");
        if (absl::Status s = reader.Skip(n * static_cast<uint64_t>(size)); !s.ok()) return s;
      } else if (item_type == kString) {
        for (uint64_t i = 0; i < n; ++i) {
          if (absl::Status s = reader.String().status(); !s.ok()) return s;
        }
      } else {
        return absl::InvalidArgumentError(absl::StrCat("a GGUF array of unknown type ", item_type));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("a GGUF value of unknown type ", type));
  }
  return value;
}

}  // namespace

std::string_view GgufFileTypeName(int64_t file_type) {
  switch (file_type) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 14: return "Q4_K_S";
    case 15: return "Q4_K_M";
    case 16: return "Q5_K_S";
    case 17: return "Q5_K_M";
    case 18: return "Q6_K";
    case 19: return "IQ2_XXS";
    case 20: return "IQ2_XS";
    case 21: return "Q2_K_S";
    case 22: return "IQ3_XS";
    case 23: return "IQ3_XXS";
    case 24: return "IQ1_S";
    case 25: return "IQ4_NL";
    case 26: return "IQ3_S";
    case 27: return "IQ3_M";
    case 28: return "IQ2_S";
    case 29: return "IQ2_M";
    case 30: return "IQ4_XS";
    case 31: return "IQ1_M";
    case 32: return "BF16";
    case 36: return "TQ1_0";
    case 37: return "TQ2_0";
    default: return "";
  }
}

absl::StatusOr<ModelFacts> ReadGgufFacts(std::string_view prefix, int64_t file_size) {
  Reader reader(prefix);
  GGUF_ASSIGN(magic, reader.Read<uint32_t>());
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError("not a GGUF file (it does not start with \"GGUF\")");
  }
  GGUF_ASSIGN(version, reader.Read<uint32_t>());
  if (version < 2 || version > 3) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF version ", version, " is not supported (2 or 3)"));
  }
  GGUF_ASSIGN(n_tensors, reader.Read<uint64_t>());
  GGUF_ASSIGN(n_kv, reader.Read<uint64_t>());
  if (n_tensors > kMaxEntries || n_kv > kMaxEntries) {
    return absl::InvalidArgumentError("the GGUF header declares more entries than any model has");
  }

  ModelFacts facts;
  facts.format = "gguf";
  // Keys of the architecture ("llama.block_count") are read once the architecture is known;
  // general.architecture comes first in every file llama.cpp writes, but keep them all to be sure.
  struct Keyed {
    std::string key;
    int64_t number;
  };
  std::vector<Keyed> numbers;
  int64_t file_type = -1;
  for (uint64_t i = 0; i < n_kv; ++i) {
    GGUF_ASSIGN(key, reader.String());
    GGUF_ASSIGN(type, reader.Read<uint32_t>());
    GGUF_ASSIGN(value, ReadValue(reader, type, 0));
    if (key == "general.architecture") facts.architecture = std::string(value.text);
    else if (key == "general.name") facts.name = std::string(value.text);
    else if (key == "general.file_type" && value.is_int) file_type = value.number;
    else if (key == "tokenizer.ggml.tokens") facts.vocab_size = static_cast<int64_t>(value.array_length);
    else if (value.is_int) numbers.push_back({std::string(key), value.number});
  }
  if (facts.architecture.empty()) return absl::InvalidArgumentError("the GGUF header names no general.architecture");
  const std::string arch = facts.architecture + ".";
  for (const Keyed& k : numbers) {
    if (k.key.rfind(arch, 0) != 0) continue;
    std::string_view name = std::string_view(k.key).substr(arch.size());
    if (name == "context_length") facts.context_length = k.number;
    else if (name == "block_count") facts.layers = k.number;
    else if (name == "embedding_length") facts.embedding_size = k.number;
    else if (name == "attention.head_count") facts.heads = k.number;
    else if (name == "attention.head_count_kv") facts.kv_heads = k.number;
    else if (name == "attention.key_length") facts.head_dim = k.number;
    else if (name == "vocab_size" && facts.vocab_size == 0) facts.vocab_size = k.number;
  }
  if (facts.kv_heads == 0) facts.kv_heads = facts.heads;
  if (facts.head_dim == 0 && facts.heads > 0) facts.head_dim = facts.embedding_size / facts.heads;
  if (file_type >= 0) facts.quantization = std::string(GgufFileTypeName(file_type));

  int64_t parameters = 0;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GGUF_ASSIGN(name, reader.String());
    (void)name;
    GGUF_ASSIGN(n_dims, reader.Read<uint32_t>());
    if (n_dims == 0 || n_dims > kMaxDims) return absl::InvalidArgumentError("a GGUF tensor with a bad dimension count");
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      GGUF_ASSIGN(dim, reader.Read<uint64_t>());
      if (dim == 0 || dim > static_cast<uint64_t>(file_size) * 8 ||
          static_cast<uint64_t>(elements) > static_cast<uint64_t>(INT64_MAX) / dim) {
        return absl::InvalidArgumentError("a GGUF tensor larger than its file");
      }
      elements *= static_cast<int64_t>(dim);
    }
    GGUF_ASSIGN(tensor_type, reader.Read<uint32_t>());
    (void)tensor_type;
    GGUF_ASSIGN(offset, reader.Read<uint64_t>());
    if (offset > static_cast<uint64_t>(file_size)) return absl::InvalidArgumentError("a GGUF tensor past the file's end");
    if (elements > INT64_MAX - parameters) return absl::InvalidArgumentError("GGUF tensors too large");
    parameters += elements;
  }
  facts.parameters = parameters;
  return facts;
}

}  // namespace minions
