#include "bench_common.hpp"

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
  return s;
}

double kv_bytes(const AttentionSpec& spec, long long len) {
  return 2.0 * static_cast<double>(len) * spec.num_kv_heads * spec.head_size * static_cast<double>(spec.kv_elem_size());
}

double attention_bytes(const AttentionSpec& spec, const int32_t* seq_lens, int num_seqs,
                       KernelKind kernel, int partition_size) {
  const double esize = static_cast<double>(decodegraph::dtype_size(spec.dtype));
  const double qo_row = static_cast<double>(spec.num_q_heads) * spec.head_size * esize;
  // One partition's fp32 partials per q head: max logit, exp sum, head_size outputs.
  const double partial = static_cast<double>(spec.num_q_heads) * (2.0 + spec.head_size) * 4.0;
  double total = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int len = seq_lens[i];
    if (len <= 0) continue;
    total += kv_bytes(spec, len) + 2.0 * qo_row;
    if (kernel == KernelKind::kV2 && partition_size > 0)
      total += 2.0 * partial * decodegraph::num_partitions(len, partition_size);  // written + read
  }
  return total;
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
