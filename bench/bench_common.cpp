#include "bench_common.hpp"

#include "kernels/decode_math.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace dgbench {

using decodegraph::AttentionSpec;
using decodegraph::DType;
using decodegraph::KernelKind;

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"llama3-8b", "Llama-3-8B: 32 q heads, 8 kv heads", 32, 8, 128, 16, DType::kBFloat16},
      {"llama3-70b-tp8", "Llama-3-70B on 8 GPUs: 8 q heads, 1 kv head", 8, 1, 128, 16, DType::kBFloat16},
      {"mha", "multi-head attention: 32 q heads, 32 kv heads", 32, 32, 128, 16, DType::kBFloat16},
      {"small", "CPU-sized GQA: 8 q heads, 2 kv heads, head 64", 8, 2, 64, 16, DType::kBFloat16},
      // huggingface.co/openai/gpt-oss-20b config.json: num_attention_heads 64, num_key_value_heads 8,
      // head_dim 64, sliding_window 128, layer_types alternating sliding / full from layer 0,
      // learned sinks in every layer, scale 1/sqrt(64).
      {"gpt-oss-20b", "gpt-oss-20b (openai/gpt-oss-20b config.json): 64 q / 8 kv heads, head 64, W=128 on even layers, sinks",
       64, 8, 64, 16, DType::kBFloat16, 0.0f, 128, 2, 0.0f, true},
      // huggingface.co/google/gemma-2-9b config.json: num_attention_heads 16, num_key_value_heads 8,
      // head_dim 256, sliding_window 4096 on even layers, attn_logit_softcapping 50.0,
      // query_pre_attn_scalar 256 (scale 256^-1/2).
      {"gemma-2-9b", "Gemma-2-9B (google/gemma-2-9b config.json): 16 q / 8 kv heads, head 256, W=4096 on even layers, soft-cap 50",
       16, 8, 256, 16, DType::kBFloat16, 0.0625f, 4096, 2, 50.0f, false},
      // huggingface.co/google/gemma-3-27b-it config.json (text_config): num_attention_heads 32,
      // num_key_value_heads 16, head_dim 128, sliding_window 1024, sliding_window_pattern 6 (five
      // local layers, then one global), query_pre_attn_scalar 168 (scale 168^-1/2), no soft-cap.
      {"gemma-3-27b", "Gemma-3-27B (google/gemma-3-27b-it config.json): 32 q / 16 kv heads, head 128, W=1024 on 5 of 6 layers",
       32, 16, 128, 16, DType::kBFloat16, 0.0771517f, 1024, 6, 0.0f, false},
  };
  return presets;
}

const ModelPreset* find_preset(std::string_view name) {
  for (const auto& p : model_presets())
    if (name == p.name) return &p;
  return nullptr;
}

AttentionSpec spec_of(const ModelPreset& preset) {
  AttentionSpec s;
  s.num_q_heads = preset.q_heads;
  s.num_kv_heads = preset.kv_heads;
  s.head_size = preset.head_size;
  s.block_size = preset.block_size;
  s.dtype = preset.dtype;
  s.layout = decodegraph::KVLayout::kVLLM;
  s.scale = preset.scale;
  return s;
}

AttentionSpec layer_spec_of(const ModelPreset& preset, const AttentionSpec& base, int layer) {
  AttentionSpec s = base;
  s.logit_softcap = preset.softcap;
  const bool global = preset.global_every > 0 && (layer + 1) % preset.global_every == 0;
  s.sliding_window = global ? 0 : preset.window;
  return s;
}

double kv_bytes(const AttentionSpec& spec, long long len) {
  return 2.0 * static_cast<double>(len) * spec.num_kv_heads * spec.head_size * static_cast<double>(spec.kv_elem_size());
}

namespace {
/// Tokens sequence of `len` reads: from the first block of row 0's window on (docs/design.md).
int tokens_read(const AttentionSpec& spec, int len, int q_len) {
  return len - decodegraph::math::window_origin(len, decodegraph::math::read_window(spec.sliding_window, q_len),
                                                spec.block_size);
}
}  // namespace

double attention_bytes(const AttentionSpec& spec, const int32_t* seq_lens, int num_seqs,
                       KernelKind kernel, int partition_size, int q_len) {
  const double esize = static_cast<double>(decodegraph::dtype_size(spec.dtype));
  const double qo_rows = static_cast<double>(q_len) * spec.num_q_heads * spec.head_size * esize;
  // One partition's fp32 partials per q head and row: max logit, exp sum, head_size outputs.
  const double partial = static_cast<double>(q_len) * spec.num_q_heads * (2.0 + spec.head_size) * 4.0;
  double total = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int len = seq_lens[i];
    if (len <= 0) continue;
    const int read = tokens_read(spec, len, q_len);
    total += kv_bytes(spec, read) + 2.0 * qo_rows;
    if (kernel == KernelKind::kV2 && partition_size > 0)
      total += 2.0 * partial * decodegraph::num_partitions(read, partition_size);  // written + read
  }
  return total;
}

double attention_kv_bytes(const AttentionSpec& spec, const int32_t* seq_lens, int num_seqs, int q_len) {
  double total = 0;
  for (int i = 0; i < num_seqs; ++i)
    if (seq_lens[i] > 0) total += kv_bytes(spec, tokens_read(spec, seq_lens[i], q_len));
  return total;
}

std::string appended_kv_mismatch(const AttentionSpec& spec, const void* k_cache, const void* v_cache,
                                 const float* k_scale, const float* v_scale, const void* key, const void* value,
                                 const int32_t* seq_lens, const int32_t* block_tables, int block_table_stride,
                                 int num_seqs, int q_len) {
  namespace m = decodegraph::math;
  const int x = m::vllm_x(static_cast<int>(spec.kv_elem_size()));
  for (int i = 0; i < num_seqs; ++i) {
    if (seq_lens[i] <= 0) continue;
    for (int j = 0; j < q_len; ++j) {
      const int pos = seq_lens[i] - q_len + j;
      const int64_t block = block_tables[static_cast<std::size_t>(i) * block_table_stride + pos / spec.block_size];
      const int tok = pos % spec.block_size;
      const std::size_t row = static_cast<std::size_t>(i) * q_len + j;
      for (int h = 0; h < spec.num_kv_heads; ++h)
        for (int d = 0; d < spec.head_size; ++d) {
          const std::size_t src = (row * spec.num_kv_heads + h) * spec.head_size + d;
          float ek = decodegraph::load_as_float(spec.dtype, key, src);
          float ev = decodegraph::load_as_float(spec.dtype, value, src);
          if (spec.fp8_kv()) {  // what the append stores: the code of x / scale
            const int si = spec.kv_scale_per_head ? h : 0;
            ek = decodegraph::fp8_bits_to_float(spec.kv_dtype, decodegraph::float_to_fp8_bits(spec.kv_dtype, ek / k_scale[si]));
            ev = decodegraph::fp8_bits_to_float(spec.kv_dtype, decodegraph::float_to_fp8_bits(spec.kv_dtype, ev / v_scale[si]));
          }
          const float gk = decodegraph::load_kv_as_float(
              spec, k_cache, m::k_offset(spec.layout, block, h, tok, d, spec.num_kv_heads, spec.head_size, spec.block_size, x));
          const float gv = decodegraph::load_kv_as_float(
              spec, v_cache, m::v_offset(spec.layout, block, h, tok, d, spec.num_kv_heads, spec.head_size, spec.block_size));
          // Compared as values: the fills never write NaN, and -0 / +0 are one value of the cache.
          if (gk != ek || gv != ev)
            return fmt::format("sequence {} token {} of {} (position {}, block {}) kv head {} element {}: cache K {} V {}, "
                               "appended K {} V {}",
                               i, j, q_len, pos, block, h, d, gk, gv, ek, ev);
        }
    }
  }
  return {};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

namespace {
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

void fill_random_host(DType dtype, void* buf, std::size_t n, std::uint64_t seed) {
  std::uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    // 24 random bits -> [-1, 1); two values per 64-bit draw would correlate neighbours, so one each.
    const float v = static_cast<float>(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    decodegraph::store_from_float(dtype, buf, i, v);
  }
  // A draw of exactly 0 everywhere is impossible in practice; make it impossible in fact.
  if (n > 0) decodegraph::store_from_float(dtype, buf, 0, 0.5f);
}

void fill_random_kv_host(const AttentionSpec& spec, void* buf, std::size_t n, std::uint64_t seed) {
  if (!spec.fp8_kv()) return fill_random_host(spec.dtype, buf, n, seed);
  std::uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  auto* codes = static_cast<std::uint8_t*>(buf);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    codes[i] = decodegraph::float_to_fp8_bits(spec.kv_dtype, v / kFillKvScale);
  }
  if (n > 0) codes[0] = decodegraph::float_to_fp8_bits(spec.kv_dtype, 0.5f / kFillKvScale);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      if (c) line += "  ";
      // First column left-aligned (labels), numbers right-aligned.
      const std::string pad(width[c] - rows[i][c].size(), ' ');
      line += c == 0 ? rows[i][c] + pad : pad + rows[i][c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t c = 0; c < width.size(); ++c) total += width[c] + (c ? 2 : 0);
      out += std::string(total, '-') + "\n";
    }
  }
  return out;
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

}  // namespace dgbench
