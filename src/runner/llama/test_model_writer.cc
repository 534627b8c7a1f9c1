#include "runner/llama/test_model_writer.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ggml.h"
#include "gguf.h"

namespace minions::llama_runner {

const char kTestModelChatTemplate[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

namespace fs = std::filesystem;

// Bounds that keep every size computation far from overflow and the files test-sized.
constexpr int kMaxDim = 1 << 20;
constexpr int kMaxLayers = 512;  // LLAMA_MAX_LAYERS
constexpr uint64_t kMaxTensorBytes = uint64_t{2} << 30;

// ---- deterministic random numbers (no std distributions: those differ between libraries) ----

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return Mix64(state_);
  }

 private:
  uint64_t state_;
};

// IEEE-754 binary32 -> binary16, round to nearest even, integer arithmetic only (the result does
// not depend on F16C, FMA contraction or the compiler).
uint16_t F32ToF16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | (abs > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {  // normal half
    const uint32_t m = abs - 0x38000000u;  // rebias exponent 127 -> 15
    return static_cast<uint16_t>(sign | ((m + 0x0FFFu + ((m >> 13) & 1u)) >> 13));
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: zero
  // Subnormal half: units of 2^-24.
  const uint32_t e = abs >> 23;
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// ---- the tensor plan ----

enum class Init { kUniform, kOnes, kZeros };

struct TensorPlan {
  std::string name;
  int64_t ne0 = 1;
  int64_t ne1 = 1;  // 1 for vectors
  bool matrix = false;
  ggml_type type = GGML_TYPE_F32;
  Init init = Init::kZeros;
  float scale = 0.0f;  // uniform in [-scale, scale)
};

float FanInScale(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

TensorPlan Matrix(std::string name, int64_t ne0, int64_t ne1, ggml_type type, float scale) {
  return {std::move(name), ne0, ne1, true, type, Init::kUniform, scale};
}
TensorPlan Vector(std::string name, int64_t n, Init init, float scale = 0.0f) {
  return {std::move(name), n, 1, false, GGML_TYPE_F32, init, scale};
}
std::string Blk(int il, const std::string& what) { return absl::StrCat("blk.", il, ".", what); }

uint64_t PlanBytes(const TensorPlan& t) {
  const uint64_t elem = t.type == GGML_TYPE_F16 ? 2 : 4;
  return static_cast<uint64_t>(t.ne0) * static_cast<uint64_t>(t.ne1) * elem;
}

std::vector<TensorPlan> PlanLlama(const TestModelSpec& s, int64_t n_vocab) {
  const int64_t n_embd = s.n_embd;
  const int64_t head_dim = s.n_embd / s.n_head;
  const int64_t n_embd_kv = head_dim * s.n_head_kv;
  const float emb_scale = FanInScale(n_embd);
  std::vector<TensorPlan> p;
  p.push_back(Matrix("token_embd.weight", n_embd, n_vocab, GGML_TYPE_F16, emb_scale));
  p.push_back(Vector("output_norm.weight", n_embd, Init::kOnes));
  p.push_back(Matrix("output.weight", n_embd, n_vocab, GGML_TYPE_F16, emb_scale));
  for (int il = 0; il < s.n_layer; ++il) {
    p.push_back(Vector(Blk(il, "attn_norm.weight"), n_embd, Init::kOnes));
    p.push_back(Matrix(Blk(il, "attn_q.weight"), n_embd, n_embd, GGML_TYPE_F32, emb_scale));
    p.push_back(Matrix(Blk(il, "attn_k.weight"), n_embd, n_embd_kv, GGML_TYPE_F32, emb_scale));
    p.push_back(Matrix(Blk(il, "attn_v.weight"), n_embd, n_embd_kv, GGML_TYPE_F32, emb_scale));
    p.push_back(Matrix(Blk(il, "attn_output.weight"), n_embd, n_embd, GGML_TYPE_F32, emb_scale));
    p.push_back(Vector(Blk(il, "ffn_norm.weight"), n_embd, Init::kOnes));
    p.push_back(Matrix(Blk(il, "ffn_gate.weight"), n_embd, s.n_ff, GGML_TYPE_F32, emb_scale));
    p.push_back(Matrix(Blk(il, "ffn_up.weight"), n_embd, s.n_ff, GGML_TYPE_F32, emb_scale));
    p.push_back(Matrix(Blk(il, "ffn_down.weight"), s.n_ff, n_embd, GGML_TYPE_F32, FanInScale(s.n_ff)));
  }
  return p;
}

std::vector<TensorPlan> PlanBert(const TestModelSpec& s, int64_t n_vocab, int64_t n_token_types) {
  const int64_t n_embd = s.n_embd;
  const float emb_scale = FanInScale(n_embd);
  constexpr float kBiasScale = 0.02f;
  std::vector<TensorPlan> p;
  p.push_back(Matrix("token_embd.weight", n_embd, n_vocab, GGML_TYPE_F16, emb_scale));
  p.push_back(Matrix("token_types.weight", n_embd, n_token_types, GGML_TYPE_F32, emb_scale));
  p.push_back(Matrix("position_embd.weight", n_embd, s.n_ctx_train, GGML_TYPE_F32, emb_scale));
  p.push_back(Vector("token_embd_norm.weight", n_embd, Init::kOnes));
  p.push_back(Vector("token_embd_norm.bias", n_embd, Init::kZeros));
  for (int il = 0; il < s.n_layer; ++il) {
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      p.push_back(Matrix(Blk(il, absl::StrCat(w, ".weight")), n_embd, n_embd, GGML_TYPE_F32, emb_scale));
      p.push_back(Vector(Blk(il, absl::StrCat(w, ".bias")), n_embd, Init::kUniform, kBiasScale));
    }
    p.push_back(Vector(Blk(il, "attn_output_norm.weight"), n_embd, Init::kOnes));
    p.push_back(Vector(Blk(il, "attn_output_norm.bias"), n_embd, Init::kZeros));
    p.push_back(Matrix(Blk(il, "ffn_up.weight"), n_embd, s.n_ff, GGML_TYPE_F32, emb_scale));
    p.push_back(Vector(Blk(il, "ffn_up.bias"), s.n_ff, Init::kUniform, kBiasScale));
    p.push_back(Matrix(Blk(il, "ffn_down.weight"), s.n_ff, n_embd, GGML_TYPE_F32, FanInScale(s.n_ff)));
    p.push_back(Vector(Blk(il, "ffn_down.bias"), n_embd, Init::kUniform, kBiasScale));
    p.push_back(Vector(Blk(il, "layer_output_norm.weight"), n_embd, Init::kOnes));
    p.push_back(Vector(Blk(il, "layer_output_norm.bias"), n_embd, Init::kZeros));
  }
  return p;
}

// Fills `out` (PlanBytes(t) bytes) with the tensor's values. Stream = f(seed, tensor index).
void FillTensor(const TensorPlan& t, uint64_t seed, size_t index, std::vector<uint8_t>& out) {
  const size_t n = static_cast<size_t>(t.ne0 * t.ne1);
  out.assign(PlanBytes(t), 0);
  SplitMix64 rng(Mix64(seed ^ Mix64(0xA0761D6478BD642FULL + index)));
  // value = k * step with k a 24-bit signed integer: one IEEE multiply, no contraction possible.
  const float step = t.scale * (1.0f / 8388608.0f);
  auto value = [&]() -> float {
    switch (t.init) {
      case Init::kOnes: return 1.0f;
      case Init::kZeros: return 0.0f;
      case Init::kUniform: {
        const int32_t k = static_cast<int32_t>(rng.Next() >> 40) - (1 << 23);
        return static_cast<float>(k) * step;
      }
    }
    return 0.0f;
  };
  if (t.type == GGML_TYPE_F16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = F32ToF16Bits(value());
      out[2 * i] = static_cast<uint8_t>(h & 0xFF);  // GGUF is little-endian
      out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float v = value();
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      for (int b = 0; b < 4; ++b) out[4 * i + b] = static_cast<uint8_t>(bits >> (8 * b));
    }
  }
}

// ---- GGUF metadata ----

struct GgufDeleter {
  void operator()(gguf_context* c) const { gguf_free(c); }
};
struct GgmlDeleter {
  void operator()(ggml_context* c) const { ggml_free(c); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;
using GgmlPtr = std::unique_ptr<ggml_context, GgmlDeleter>;

absl::Status CopyKv(gguf_context* dst, const gguf_context* src, int64_t id) {
  const char* key = gguf_get_key(src, id);
  switch (gguf_get_kv_type(src, id)) {
    case GGUF_TYPE_UINT8: gguf_set_val_u8(dst, key, gguf_get_val_u8(src, id)); break;
    case GGUF_TYPE_INT8: gguf_set_val_i8(dst, key, gguf_get_val_i8(src, id)); break;
    case GGUF_TYPE_UINT16: gguf_set_val_u16(dst, key, gguf_get_val_u16(src, id)); break;
    case GGUF_TYPE_INT16: gguf_set_val_i16(dst, key, gguf_get_val_i16(src, id)); break;
    case GGUF_TYPE_UINT32: gguf_set_val_u32(dst, key, gguf_get_val_u32(src, id)); break;
    case GGUF_TYPE_INT32: gguf_set_val_i32(dst, key, gguf_get_val_i32(src, id)); break;
    case GGUF_TYPE_FLOAT32: gguf_set_val_f32(dst, key, gguf_get_val_f32(src, id)); break;
    case GGUF_TYPE_UINT64: gguf_set_val_u64(dst, key, gguf_get_val_u64(src, id)); break;
    case GGUF_TYPE_INT64: gguf_set_val_i64(dst, key, gguf_get_val_i64(src, id)); break;
    case GGUF_TYPE_FLOAT64: gguf_set_val_f64(dst, key, gguf_get_val_f64(src, id)); break;
    case GGUF_TYPE_BOOL: gguf_set_val_bool(dst, key, gguf_get_val_bool(src, id)); break;
    case GGUF_TYPE_STRING: gguf_set_val_str(dst, key, gguf_get_val_str(src, id)); break;
    case GGUF_TYPE_ARRAY: {
      const gguf_type at = gguf_get_arr_type(src, id);
      const size_t n = gguf_get_arr_n(src, id);
      if (at == GGUF_TYPE_STRING) {
        std::vector<const char*> strs(n);
        for (size_t i = 0; i < n; ++i) strs[i] = gguf_get_arr_str(src, id, i);
        gguf_set_arr_str(dst, key, strs.data(), n);
      } else if (at == GGUF_TYPE_ARRAY) {
        return absl::InvalidArgumentError(
            absl::StrCat("vocab key '", key, "' is a nested array, which is not supported"));
      } else {
        gguf_set_arr_data(dst, key, at, gguf_get_arr_data(src, id), n);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("vocab key '", key, "' has an unknown GGUF type"));
  }
  return absl::OkStatus();
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

absl::Status CheckSpec(const TestModelSpec& s) {
  auto in_range = [](const char* what, int v, int lo, int hi) -> absl::Status {
    if (v < lo || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("test model ", what, " = ", v, " is out of range [", lo, ", ", hi, "]"));
    }
    return absl::OkStatus();
  };
  if (auto st = in_range("n_embd", s.n_embd, 1, kMaxDim); !st.ok()) return st;
  if (auto st = in_range("n_layer", s.n_layer, 1, kMaxLayers); !st.ok()) return st;
  if (auto st = in_range("n_head", s.n_head, 1, s.n_embd); !st.ok()) return st;
  if (auto st = in_range("n_ff", s.n_ff, 1, kMaxDim); !st.ok()) return st;
  if (auto st = in_range("n_ctx_train", s.n_ctx_train, 1, kMaxDim); !st.ok()) return st;
  if (s.n_embd % s.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("test model n_embd (", s.n_embd,
                                                   ") must be a multiple of n_head (", s.n_head, ")"));
  }
  if (s.kind == TestModelKind::kText) {
    if (auto st = in_range("n_head_kv", s.n_head_kv, 1, s.n_head); !st.ok()) return st;
    if (s.n_head % s.n_head_kv != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test model n_head (", s.n_head, ") must be a multiple of n_head_kv (", s.n_head_kv, ")"));
    }
    if ((s.n_embd / s.n_head) % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("test model head size n_embd/n_head = ",
                                                     s.n_embd / s.n_head, " must be even (RoPE)"));
    }
  }
  return absl::OkStatus();
}

// Opens the vocab file and checks it holds a tokenizer.
absl::Status LoadVocab(const std::string& path, GgufPtr& out) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "no vocab file given: point vocab_path at one of llama.cpp's models/ggml-vocab-*.gguf");
  }
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return absl::NotFoundError(absl::StrCat(
        "vocab file '", path, "' does not exist (expected one of llama.cpp's models/ggml-vocab-*.gguf)"));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat("vocab file '", path, "' is not a regular file"));
  }
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  out.reset(gguf_init_from_file(path.c_str(), params));
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("could not read vocab file '", path, "' as GGUF (unreadable or corrupt)"));
  }
  const int64_t tokens = gguf_find_key(out.get(), "tokenizer.ggml.tokens");
  if (tokens < 0 || gguf_get_kv_type(out.get(), tokens) != GGUF_TYPE_ARRAY ||
      gguf_get_arr_type(out.get(), tokens) != GGUF_TYPE_STRING || gguf_get_arr_n(out.get(), tokens) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab file '", path, "' has no tokenizer.ggml.tokens string array; it is not a tokenizer"));
  }
  const int64_t model = gguf_find_key(out.get(), "tokenizer.ggml.model");
  if (model < 0 || gguf_get_kv_type(out.get(), model) != GGUF_TYPE_STRING) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab file '", path, "' has no tokenizer.ggml.model string"));
  }
  return absl::OkStatus();
}

// tokenizer.ggml.token_type_count as an integer, or 0 when absent.
int64_t TokenTypeCount(const gguf_context* ctx) {
  const int64_t id = gguf_find_key(ctx, "tokenizer.ggml.token_type_count");
  if (id < 0) return 0;
  switch (gguf_get_kv_type(ctx, id)) {
    case GGUF_TYPE_UINT32: return gguf_get_val_u32(ctx, id);
    case GGUF_TYPE_INT32: return gguf_get_val_i32(ctx, id);
    case GGUF_TYPE_UINT64: return static_cast<int64_t>(gguf_get_val_u64(ctx, id));
    case GGUF_TYPE_INT64: return gguf_get_val_i64(ctx, id);
    default: return -1;
  }
}

// Writes ctx to `tmp` and renames it to `out_path`.
absl::Status WriteFile(const gguf_context* ctx, const std::string& out_path) {
  const std::string tmp = out_path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create '", tmp, "' (is the output folder there and writable?)"));
  }
  bool ok = gguf_write_to_file_ptr(ctx, f, /*only_meta=*/false);
  int err = 0;
  if (std::fflush(f) != 0 || std::ferror(f)) {
    ok = false;
    err = errno;
  }
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  std::error_code ec;
  if (!ok) {
    fs::remove(tmp, ec);
    return err != 0 ? absl::ErrnoToStatus(err, absl::StrCat("writing '", tmp, "' failed (disk full?)"))
                    : absl::DataLossError(absl::StrCat("writing '", tmp, "' failed (disk full?)"));
  }
  fs::rename(tmp, out_path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::InternalError(absl::StrCat("cannot rename '", tmp, "' to '", out_path, "'"));
  }
  return absl::OkStatus();
}

absl::Status WriteTestModelImpl(const TestModelSpec& spec, const std::string& out_path) {
  if (out_path.empty()) return absl::InvalidArgumentError("no output path given for the test model");
  if (auto st = CheckSpec(spec); !st.ok()) return st;

  GgufPtr vocab;
  if (auto st = LoadVocab(spec.vocab_path, vocab); !st.ok()) return st;
  const int64_t n_vocab =
      static_cast<int64_t>(gguf_get_arr_n(vocab.get(), gguf_find_key(vocab.get(), "tokenizer.ggml.tokens")));

  const bool text = spec.kind == TestModelKind::kText;
  const char* arch = text ? "llama" : "bert";
  int64_t n_token_types = TokenTypeCount(vocab.get());
  if (n_token_types < 0 || n_token_types > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab file '", spec.vocab_path, "' has an invalid tokenizer.ggml.token_type_count"));
  }

  GgufPtr out(gguf_init_empty());
  gguf_context* g = out.get();
  auto key = [&](const char* k) { return absl::StrCat(arch, ".", k); };

  gguf_set_val_str(g, "general.architecture", arch);
  gguf_set_val_str(g, "general.name", text ? "minions-test-text" : "minions-test-embedding");
  gguf_set_val_u32(g, key("context_length").c_str(), static_cast<uint32_t>(spec.n_ctx_train));
  gguf_set_val_u32(g, key("embedding_length").c_str(), static_cast<uint32_t>(spec.n_embd));
  gguf_set_val_u32(g, key("block_count").c_str(), static_cast<uint32_t>(spec.n_layer));
  gguf_set_val_u32(g, key("feed_forward_length").c_str(), static_cast<uint32_t>(spec.n_ff));
  gguf_set_val_u32(g, key("attention.head_count").c_str(), static_cast<uint32_t>(spec.n_head));
  if (text) {
    gguf_set_val_u32(g, key("attention.head_count_kv").c_str(), static_cast<uint32_t>(spec.n_head_kv));
    gguf_set_val_f32(g, key("attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    gguf_set_val_u32(g, key("rope.dimension_count").c_str(), static_cast<uint32_t>(spec.n_embd / spec.n_head));
    gguf_set_val_f32(g, key("rope.freq_base").c_str(), 10000.0f);
    gguf_set_val_u32(g, key("vocab_size").c_str(), static_cast<uint32_t>(n_vocab));
  } else {
    gguf_set_val_f32(g, key("attention.layer_norm_epsilon").c_str(), 1e-12f);
    gguf_set_val_bool(g, key("attention.causal").c_str(), false);
    gguf_set_val_u32(g, key("pooling_type").c_str(), 1);  // LLAMA_POOLING_TYPE_MEAN
  }

  // The tokenizer, verbatim (in the vocab file's order), except its chat template.
  const int64_t n_kv = gguf_get_n_kv(vocab.get());
  for (int64_t i = 0; i < n_kv; ++i) {
    const std::string_view k = gguf_get_key(vocab.get(), i);
    if (!StartsWith(k, "tokenizer.") || k == "tokenizer.chat_template") continue;
    if (auto st = CopyKv(g, vocab.get(), i); !st.ok()) return st;
  }
  if (!text && n_token_types == 0) {
    // llama.cpp's BERT loader needs a token type count; BERT vocabularies use 2.
    n_token_types = 2;
    gguf_set_val_u32(g, "tokenizer.ggml.token_type_count", 2);
  }
  if (text && spec.with_chat_template) gguf_set_val_str(g, "tokenizer.chat_template", kTestModelChatTemplate);

  // Tensors.
  std::vector<TensorPlan> plan = text ? PlanLlama(spec, n_vocab) : PlanBert(spec, n_vocab, n_token_types);
  uint64_t total = 0;
  for (const TensorPlan& t : plan) total += PlanBytes(t);
  if (total > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "test model would hold ", total >> 20, " MiB of weights (limit ", kMaxTensorBytes >> 20,
        " MiB); use smaller n_embd/n_layer/n_ff/n_ctx_train"));
  }

  ggml_init_params gp{};
  gp.mem_size = plan.size() * ggml_tensor_overhead() + 1024;
  gp.mem_buffer = nullptr;
  gp.no_alloc = true;  // tensor data lives in `data` below
  GgmlPtr ggml(ggml_init(gp));
  std::vector<std::vector<uint8_t>> data(plan.size());
  try {
    for (size_t i = 0; i < plan.size(); ++i) {
      const TensorPlan& t = plan[i];
      ggml_tensor* tensor = t.matrix ? ggml_new_tensor_2d(ggml.get(), t.type, t.ne0, t.ne1)
                                     : ggml_new_tensor_1d(ggml.get(), t.type, t.ne0);
      ggml_set_name(tensor, t.name.c_str());
      FillTensor(t, spec.seed, i, data[i]);
      tensor->data = data[i].data();
      gguf_add_tensor(g, tensor);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory building a ", total >> 20, " MiB test model"));
  }
  return WriteFile(g, out_path);
}

}  // namespace

absl::Status WriteTestModel(const TestModelSpec& spec, const std::string& out_path) {
  try {
    return WriteTestModelImpl(spec, out_path);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("writing test model '", out_path, "': ", e.what()));
  }
}

}  // namespace minions::llama_runner
