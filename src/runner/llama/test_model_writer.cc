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
#include "common/c_ptr.h"
#include "ggml.h"
#include "gguf.h"

namespace minions::llama_runner {

const char kTestModelChatTemplate[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char kLlama3ChatTemplate[] =
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

absl::StatusOr<std::string> TestModelChatTemplate(std::string_view name) {
  if (name == "chatml") return std::string(kTestModelChatTemplate);
  if (name == "llama3") return std::string(kLlama3ChatTemplate);
  if (name == "qwen2.5-tools") return std::string(kQwen25ToolChatTemplate);
  if (name == "none") return std::string();
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template '", std::string(name), "' (chatml, llama3, qwen2.5-tools, none)"));
}

// Qwen 2.5 Instruct's template as the model ships it (llama.cpp's models/templates copy): tools in
// the system message, calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>.
const char kQwen25ToolChatTemplate[] = R"TMPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TMPL";

namespace {

namespace fs = std::filesystem;

// Bounds that keep every size computation far from overflow and the files test-sized.
constexpr int kMaxDim = 1 << 20;
constexpr int kMaxLayers = 512;  // LLAMA_MAX_LAYERS
constexpr uint64_t kMaxTensorBytes = uint64_t{64} << 30;  // an 8B model in F16 is 15 GiB

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

// What a matrix is for: the rules that pick its type depend on it.
enum class Role { kNorm, kTokenEmbd, kOutput, kAttnV, kFfnDown, kOther };

struct TensorPlan {
  std::string name;
  int64_t ne0 = 1;
  int64_t ne1 = 1;  // 1 for vectors
  bool matrix = false;
  ggml_type type = GGML_TYPE_F32;
  Init init = Init::kZeros;
  float scale = 0.0f;  // values in [-scale, scale)
};

float FanInScale(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

bool UseMoreBits(int il, int n_layer) {  // llama-quantize's rule for Q4_K_M's attn_v and ffn_down
  return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

// The type llama-quantize would give a matrix of this role in a file of these weights.
ggml_type MatrixType(TestModelWeights weights, Role role, bool tied, int il, int n_layer, int64_t ne0) {
  const bool output = role == Role::kOutput || (tied && role == Role::kTokenEmbd);
  ggml_type type = GGML_TYPE_F32;
  switch (weights) {
    case TestModelWeights::kSmall:
      type = (role == Role::kTokenEmbd || role == Role::kOutput) ? GGML_TYPE_F16 : GGML_TYPE_F32;
      break;
    case TestModelWeights::kF16: type = GGML_TYPE_F16; break;
    case TestModelWeights::kQ8_0: type = GGML_TYPE_Q8_0; break;
    case TestModelWeights::kQ4_0: type = output ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_0; break;
    case TestModelWeights::kQ4_K_M:
      type = output || ((role == Role::kAttnV || role == Role::kFfnDown) && UseMoreBits(il, n_layer))
                 ? GGML_TYPE_Q6_K
                 : GGML_TYPE_Q4_K;
      break;
  }
  // Rows that do not split into whole blocks: llama-quantize's fallbacks.
  if (ne0 % ggml_blck_size(type) != 0) {
    type = type == GGML_TYPE_Q4_K ? GGML_TYPE_Q5_0 : type == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_0 : type;
    if (ne0 % ggml_blck_size(type) != 0) type = GGML_TYPE_F16;
  }
  return type;
}

struct Planner {
  const TestModelSpec& spec;
  std::vector<TensorPlan> tensors;

  void Matrix(std::string name, int64_t ne0, int64_t ne1, Role role, float scale, int il = 0) {
    ggml_type type = MatrixType(spec.weights, role, spec.tied_embeddings, il, spec.n_layer, ne0);
    tensors.push_back({std::move(name), ne0, ne1, true, type, Init::kUniform, scale});
  }
  // BERT's small learned tables stay F32 in every file type.
  void Table(std::string name, int64_t ne0, int64_t ne1, float scale) {
    tensors.push_back({std::move(name), ne0, ne1, true, GGML_TYPE_F32, Init::kUniform, scale});
  }
  void Vector(std::string name, int64_t n, Init init, float scale = 0.0f) {
    tensors.push_back({std::move(name), n, 1, false, GGML_TYPE_F32, init, scale});
  }
};

std::string Blk(int il, const std::string& what) { return absl::StrCat("blk.", il, ".", what); }

uint64_t PlanBytes(const TensorPlan& t) {
  return static_cast<uint64_t>(ggml_row_size(t.type, t.ne0)) * static_cast<uint64_t>(t.ne1);
}

std::vector<TensorPlan> PlanLlama(const TestModelSpec& s, int64_t n_vocab) {
  const int64_t n_embd = s.n_embd;
  const int64_t head_dim = s.n_embd / s.n_head;
  const int64_t n_embd_kv = head_dim * s.n_head_kv;
  const float emb_scale = FanInScale(n_embd);
  Planner p{s, {}};
  p.Matrix("token_embd.weight", n_embd, n_vocab, Role::kTokenEmbd, emb_scale);
  p.Vector("output_norm.weight", n_embd, Init::kOnes);
  if (!s.tied_embeddings) p.Matrix("output.weight", n_embd, n_vocab, Role::kOutput, emb_scale);
  for (int il = 0; il < s.n_layer; ++il) {
    p.Vector(Blk(il, "attn_norm.weight"), n_embd, Init::kOnes);
    p.Matrix(Blk(il, "attn_q.weight"), n_embd, n_embd, Role::kOther, emb_scale, il);
    p.Matrix(Blk(il, "attn_k.weight"), n_embd, n_embd_kv, Role::kOther, emb_scale, il);
    p.Matrix(Blk(il, "attn_v.weight"), n_embd, n_embd_kv, Role::kAttnV, emb_scale, il);
    p.Matrix(Blk(il, "attn_output.weight"), n_embd, n_embd, Role::kOther, emb_scale, il);
    p.Vector(Blk(il, "ffn_norm.weight"), n_embd, Init::kOnes);
    p.Matrix(Blk(il, "ffn_gate.weight"), n_embd, s.n_ff, Role::kOther, emb_scale, il);
    p.Matrix(Blk(il, "ffn_up.weight"), n_embd, s.n_ff, Role::kOther, emb_scale, il);
    p.Matrix(Blk(il, "ffn_down.weight"), s.n_ff, n_embd, Role::kFfnDown, FanInScale(s.n_ff), il);
  }
  return std::move(p.tensors);
}

std::vector<TensorPlan> PlanBert(const TestModelSpec& s, int64_t n_vocab, int64_t n_token_types) {
  const int64_t n_embd = s.n_embd;
  const float emb_scale = FanInScale(n_embd);
  constexpr float kBiasScale = 0.02f;
  Planner p{s, {}};
  p.Matrix("token_embd.weight", n_embd, n_vocab, Role::kTokenEmbd, emb_scale);
  p.Table("token_types.weight", n_embd, n_token_types, emb_scale);
  p.Table("position_embd.weight", n_embd, s.n_ctx_train, emb_scale);
  p.Vector("token_embd_norm.weight", n_embd, Init::kOnes);
  p.Vector("token_embd_norm.bias", n_embd, Init::kZeros);
  for (int il = 0; il < s.n_layer; ++il) {
    for (const char* w : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      p.Matrix(Blk(il, absl::StrCat(w, ".weight")), n_embd, n_embd, Role::kOther, emb_scale, il);
      p.Vector(Blk(il, absl::StrCat(w, ".bias")), n_embd, Init::kUniform, kBiasScale);
    }
    p.Vector(Blk(il, "attn_output_norm.weight"), n_embd, Init::kOnes);
    p.Vector(Blk(il, "attn_output_norm.bias"), n_embd, Init::kZeros);
    p.Matrix(Blk(il, "ffn_up.weight"), n_embd, s.n_ff, Role::kOther, emb_scale, il);
    p.Vector(Blk(il, "ffn_up.bias"), s.n_ff, Init::kUniform, kBiasScale);
    p.Matrix(Blk(il, "ffn_down.weight"), s.n_ff, n_embd, Role::kOther, FanInScale(s.n_ff), il);
    p.Vector(Blk(il, "ffn_down.bias"), n_embd, Init::kUniform, kBiasScale);
    p.Vector(Blk(il, "layer_output_norm.weight"), n_embd, Init::kOnes);
    p.Vector(Blk(il, "layer_output_norm.bias"), n_embd, Init::kZeros);
  }
  return std::move(p.tensors);
}

// ---- tensor data ----

void PutF16(uint8_t* out, float value) {
  const uint16_t h = F32ToF16Bits(value);
  out[0] = static_cast<uint8_t>(h & 0xFF);  // GGUF is little-endian
  out[1] = static_cast<uint8_t>(h >> 8);
}

// Generates one tensor's bytes in order, a run of rows at a time (the stream does not depend on
// how the rows are cut into runs). Stream = f(seed, tensor index).
class TensorFiller {
 public:
  TensorFiller(const TensorPlan& t, uint64_t seed, size_t index)
      : t_(t), rng_(Mix64(seed ^ Mix64(0xA0761D6478BD642FULL + index))),
        // value = k * step with k a 24-bit signed integer: one IEEE multiply, no contraction possible.
        step_(t.scale * (1.0f / 8388608.0f)) {}

  // Appends `rows` rows to `out`.
  void Rows(int64_t rows, std::vector<uint8_t>& out) {
    const size_t row_bytes = ggml_row_size(t_.type, t_.ne0);
    const size_t start = out.size();
    out.resize(start + row_bytes * static_cast<size_t>(rows));
    uint8_t* p = out.data() + start;
    const int64_t n = t_.ne0 * rows;
    switch (t_.type) {
      case GGML_TYPE_F32:
        for (int64_t i = 0; i < n; ++i, p += 4) {
          const float v = Value();
          uint32_t bits;
          std::memcpy(&bits, &v, sizeof(bits));
          for (int b = 0; b < 4; ++b) p[b] = static_cast<uint8_t>(bits >> (8 * b));
        }
        break;
      case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; ++i, p += 2) PutF16(p, Value());
        break;
      default:
        // Quantised: random quants under fixed scales chosen so that the values spread over
        // about [-scale, scale], like the float types'.
        for (int64_t b = 0; b < n / ggml_blck_size(t_.type); ++b) p = Block(p);
        break;
    }
  }

 private:
  float Value() {
    switch (t_.init) {
      case Init::kOnes: return 1.0f;
      case Init::kZeros: return 0.0f;
      case Init::kUniform: {
        const int32_t k = static_cast<int32_t>(rng_.Next() >> 40) - (1 << 23);
        return static_cast<float>(k) * step_;
      }
    }
    return 0.0f;
  }
  void RandomBytes(uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      uint64_t v = rng_.Next();
      for (size_t b = 0; b < 8 && i + b < n; ++b, v >>= 8) p[i + b] = static_cast<uint8_t>(v);
    }
  }
  // Writes one block of t_.type at p; returns the end of it. Layouts: ggml-common.h.
  uint8_t* Block(uint8_t* p) {
    const float s = t_.scale;
    switch (t_.type) {
      case GGML_TYPE_Q4_0:  // d; 32 nibbles q: (q - 8) * d
        PutF16(p, s / 8);
        RandomBytes(p + 2, 16);
        return p + 18;
      case GGML_TYPE_Q5_0:  // d; high bits qh[4]; nibbles qs[16]: (q - 16) * d
        PutF16(p, s / 16);
        RandomBytes(p + 2, 20);
        return p + 22;
      case GGML_TYPE_Q8_0:  // d; 32 int8 q: q * d (-128 never comes out of a quantiser)
        PutF16(p, s / 127);
        RandomBytes(p + 2, 32);
        for (int i = 2; i < 34; ++i) {
          if (p[i] == 0x80) p[i] = 0x81;
        }
        return p + 34;
      case GGML_TYPE_Q4_K: {  // d, dmin; 8 x (6-bit scale 32, 6-bit min 60); 256 nibbles
        // value = d * 32 * q - dmin * 60 with dmin = 4d: [-240d, 240d].
        static constexpr uint8_t kScales[12] = {160, 160, 160, 160, 252, 252, 252, 252, 192, 192, 192, 192};
        const float d = s / 240;
        PutF16(p, d);
        PutF16(p + 2, 4 * d);
        std::memcpy(p + 4, kScales, sizeof(kScales));
        RandomBytes(p + 16, 128);
        return p + 144;
      }
      case GGML_TYPE_Q6_K:  // ql[128], qh[64]: 6-bit q; 16 int8 scales 16; d: d * 16 * (q - 32)
        RandomBytes(p, 192);
        std::memset(p + 192, 16, 16);
        PutF16(p + 208, s / 512);
        return p + 210;
      default:
        return p + ggml_type_size(t_.type);  // not planned
    }
  }

  const TensorPlan& t_;
  SplitMix64 rng_;
  const float step_;
};

// ---- GGUF metadata ----

using GgufPtr = CPtr<gguf_context, gguf_free>;
using GgmlPtr = CPtr<ggml_context, ggml_free>;

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

// A model ready to be written: its metadata (with the tensor infos) and its tensor plan.
struct ModelPlan {
  GgufPtr gguf;
  GgmlPtr ggml;  // holds the ggml_tensor headers the tensor infos were made from
  std::vector<TensorPlan> tensors;
  uint64_t tensor_bytes = 0;
  int64_t n_params = 0;
};

// llama_ftype values for general.file_type (llama.h).
uint32_t FileType(TestModelWeights weights) {
  switch (weights) {
    case TestModelWeights::kSmall: return 0;  // not written
    case TestModelWeights::kF16: return 1;    // LLAMA_FTYPE_MOSTLY_F16
    case TestModelWeights::kQ8_0: return 7;   // LLAMA_FTYPE_MOSTLY_Q8_0
    case TestModelWeights::kQ4_0: return 2;   // LLAMA_FTYPE_MOSTLY_Q4_0
    case TestModelWeights::kQ4_K_M: return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  }
  return 0;
}

absl::StatusOr<ModelPlan> PlanModel(const TestModelSpec& spec) {
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

  ModelPlan plan;
  plan.gguf.reset(gguf_init_empty());
  gguf_context* g = plan.gguf.get();
  auto key = [&](const char* k) { return absl::StrCat(arch, ".", k); };

  gguf_set_val_str(g, "general.architecture", arch);
  const std::string name = !spec.name.empty() ? spec.name : text ? "minions-test-text" : "minions-test-embedding";
  gguf_set_val_str(g, "general.name", name.c_str());
  if (spec.weights != TestModelWeights::kSmall) gguf_set_val_u32(g, "general.file_type", FileType(spec.weights));
  gguf_set_val_u32(g, key("context_length").c_str(), static_cast<uint32_t>(spec.n_ctx_train));
  gguf_set_val_u32(g, key("embedding_length").c_str(), static_cast<uint32_t>(spec.n_embd));
  gguf_set_val_u32(g, key("block_count").c_str(), static_cast<uint32_t>(spec.n_layer));
  gguf_set_val_u32(g, key("feed_forward_length").c_str(), static_cast<uint32_t>(spec.n_ff));
  gguf_set_val_u32(g, key("attention.head_count").c_str(), static_cast<uint32_t>(spec.n_head));
  if (text) {
    gguf_set_val_u32(g, key("attention.head_count_kv").c_str(), static_cast<uint32_t>(spec.n_head_kv));
    gguf_set_val_f32(g, key("attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    gguf_set_val_u32(g, key("rope.dimension_count").c_str(), static_cast<uint32_t>(spec.n_embd / spec.n_head));
    gguf_set_val_f32(g, key("rope.freq_base").c_str(), spec.rope_freq_base);
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
  if (text && !spec.chat_template.empty()) {
    gguf_set_val_str(g, "tokenizer.chat_template", spec.chat_template.c_str());
  }

  // Tensors.
  plan.tensors = text ? PlanLlama(spec, n_vocab) : PlanBert(spec, n_vocab, n_token_types);
  for (const TensorPlan& t : plan.tensors) {
    plan.tensor_bytes += PlanBytes(t);
    plan.n_params += t.ne0 * t.ne1;
  }
  if (plan.tensor_bytes > kMaxTensorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "test model would hold ", plan.tensor_bytes >> 20, " MiB of weights (limit ",
        kMaxTensorBytes >> 20, " MiB); use smaller n_embd/n_layer/n_ff/n_ctx_train"));
  }
  ggml_init_params gp{};
  gp.mem_size = plan.tensors.size() * ggml_tensor_overhead() + 1024;
  gp.mem_buffer = nullptr;
  gp.no_alloc = true;  // headers only: the data is generated while the file is written
  plan.ggml.reset(ggml_init(gp));
  for (const TensorPlan& t : plan.tensors) {
    ggml_tensor* tensor = t.matrix ? ggml_new_tensor_2d(plan.ggml.get(), t.type, t.ne0, t.ne1)
                                   : ggml_new_tensor_1d(plan.ggml.get(), t.type, t.ne0);
    ggml_set_name(tensor, t.name.c_str());
    gguf_add_tensor(g, tensor);
  }
  return plan;
}

// Writes the metadata, then each tensor's data a run of rows at a time (at most ~64 MiB in
// memory), to `out_path`.tmp, and renames it to `out_path`.
absl::Status WriteFile(const ModelPlan& plan, uint64_t seed, const std::string& out_path) {
  const std::string tmp = out_path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create '", tmp, "' (is the output folder there and writable?)"));
  }
  // The metadata ends padded to the alignment, where the first tensor's data starts.
  bool ok = gguf_write_to_file_ptr(plan.gguf.get(), f, /*only_meta=*/true);
  const size_t alignment = gguf_get_alignment(plan.gguf.get());
  std::vector<uint8_t> buffer;
  const std::vector<uint8_t> zeros(alignment, 0);
  constexpr size_t kRunBytes = size_t{64} << 20;
  for (size_t i = 0; ok && i < plan.tensors.size(); ++i) {
    const TensorPlan& t = plan.tensors[i];
    TensorFiller filler(t, seed, i);
    const size_t row_bytes = ggml_row_size(t.type, t.ne0);
    const int64_t run = std::max<int64_t>(1, static_cast<int64_t>(kRunBytes / row_bytes));
    for (int64_t row = 0; ok && row < t.ne1; row += run) {
      buffer.clear();
      filler.Rows(std::min(run, t.ne1 - row), buffer);
      ok = std::fwrite(buffer.data(), 1, buffer.size(), f) == buffer.size();
    }
    const size_t pad = (alignment - PlanBytes(t) % alignment) % alignment;
    if (ok && pad > 0) ok = std::fwrite(zeros.data(), 1, pad, f) == pad;
  }
  int err = ok ? 0 : errno;
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
  auto plan = PlanModel(spec);
  if (!plan.ok()) return plan.status();
  try {
    return WriteFile(*plan, spec.seed, out_path);
  } catch (const std::bad_alloc&) {
    std::error_code ec;
    fs::remove(out_path + ".tmp", ec);
    return absl::ResourceExhaustedError(absl::StrCat("out of memory writing test model '", out_path, "'"));
  }
}

// The parameter counts are the published ones (the llama-bpe and qwen2 vocab files hold 128,256
// and 151,936 tokens, as the real models' embeddings do), except 0.5b: Qwen2.5 0.5B's 494,032,768
// less its 27,648 q/k/v biases, which the llama architecture does not have.
const std::vector<ModelShape>* MakeShapes() {
  return new std::vector<ModelShape>{
      {"0.5b", "Qwen2.5 0.5B (in the llama architecture: no q/k/v biases)", "ggml-vocab-qwen2.gguf",
       896, 24, 14, 2, 4864, 32768, 1000000.0f, true, false, 494005120},
      {"1b", "Llama 3.2 1B", "ggml-vocab-llama-bpe.gguf", 2048, 16, 32, 8, 8192, 131072, 500000.0f, true, true,
       1235814400},
      {"3b", "Llama 3.2 3B", "ggml-vocab-llama-bpe.gguf", 3072, 28, 24, 8, 8192, 131072, 500000.0f, true, true,
       3212749824},
      {"8b", "Llama 3.1 8B", "ggml-vocab-llama-bpe.gguf", 4096, 32, 32, 8, 14336, 131072, 500000.0f, false, true,
       8030261248},
  };
}

}  // namespace

const std::vector<ModelShape>& ModelShapes() {
  static const std::vector<ModelShape>* shapes = MakeShapes();
  return *shapes;
}

absl::StatusOr<TestModelSpec> ShapedModelSpec(std::string_view shape, TestModelWeights weights,
                                              const std::string& vocab_dir) {
  std::string known;
  for (const ModelShape& s : ModelShapes()) {
    if (s.name == shape) {
      TestModelSpec spec;
      spec.kind = TestModelKind::kText;
      spec.vocab_path = (fs::path(vocab_dir) / s.vocab_file).string();
      spec.name = absl::StrCat("minions-shape-", s.name, "-", TestModelWeightsName(weights));
      spec.n_embd = s.n_embd;
      spec.n_layer = s.n_layer;
      spec.n_head = s.n_head;
      spec.n_head_kv = s.n_head_kv;
      spec.n_ff = s.n_ff;
      spec.n_ctx_train = s.n_ctx_train;
      spec.rope_freq_base = s.rope_freq_base;
      spec.tied_embeddings = s.tied_embeddings;
      spec.weights = weights;
      spec.chat_template = s.llama3_template ? kLlama3ChatTemplate : kTestModelChatTemplate;
      return spec;
    }
    absl::StrAppend(&known, known.empty() ? "" : ", ", s.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model shape '", std::string(shape), "' (known: ", known, ")"));
}

absl::StatusOr<TestModelWeights> ParseTestModelWeights(std::string_view name) {
  for (TestModelWeights w : {TestModelWeights::kSmall, TestModelWeights::kF16, TestModelWeights::kQ8_0,
                             TestModelWeights::kQ4_0, TestModelWeights::kQ4_K_M}) {
    if (TestModelWeightsName(w) == name) return w;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown weight type '", std::string(name),
                                                 "' (known: small, f16, q8_0, q4_0, q4_k_m)"));
}

std::string TestModelWeightsName(TestModelWeights weights) {
  switch (weights) {
    case TestModelWeights::kSmall: return "small";
    case TestModelWeights::kF16: return "f16";
    case TestModelWeights::kQ8_0: return "q8_0";
    case TestModelWeights::kQ4_0: return "q4_0";
    case TestModelWeights::kQ4_K_M: return "q4_k_m";
  }
  return "?";
}

absl::StatusOr<TestModelSize> PlanTestModel(const TestModelSpec& spec) {
  auto plan = PlanModel(spec);
  if (!plan.ok()) return plan.status();
  return TestModelSize{plan->n_params, plan->tensor_bytes};
}

absl::Status WriteTestModel(const TestModelSpec& spec, const std::string& out_path) {
  try {
    return WriteTestModelImpl(spec, out_path);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("writing test model '", out_path, "': ", e.what()));
  }
}

}  // namespace minions::llama_runner
