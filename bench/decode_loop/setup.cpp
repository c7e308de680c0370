#include "setup.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "bench_common.hpp"

namespace dgloop {

namespace {

/// The defaults of the options the command line left out, one row per backend. On the host backend
/// they keep the run within about a minute on 2 CPU cores, yet still cross four band edges including
/// the V1/V2 threshold at 8192.
struct BackendDefaults {
  const char* preset;
  int batch, layers, steps;
  const char* start_lens;
};
constexpr BackendDefaults kCudaDefaults{"llama3-8b", 8, 32, 64, "400:480,1990:2030,4040:4090,8150:8180,30000:32000"};
constexpr BackendDefaults kHostDefaults{"small", 4, 2, 48, "400:480,1990:2030,4070:4090,8170:8180"};

/// Parses a whole non-negative integer of a --start-lens entry.
int parse_length(const std::string& what, const std::string& v) { return parse_int_in(what, v, 0, 1 << 30); }

dg::BackendKind choose_backend(const std::string& option) {
  dg::BackendKind backend;
  if (option == "auto") backend = dg::cuda_device_available() ? dg::BackendKind::kCuda : dg::BackendKind::kHost;
  else backend = option == "cuda" ? dg::BackendKind::kCuda : dg::BackendKind::kHost;  // checked by CLI11
  if (backend == dg::BackendKind::kCuda && !dg::cuda_device_available())
    usage_error(dg::built_with_cuda() ? "--backend cuda: no usable CUDA device is present"
                                      : "--backend cuda: this build has no CUDA (configure with a CUDA compiler)");
  return backend;
}

/// The preset's shape with the shape options applied, validated.
dg::AttentionSpec spec_of(const Options& o) {
  const dgbench::ModelPreset* preset = dgbench::find_preset(o.preset);  // a known name: checked by CLI11
  dg::AttentionSpec spec = dgbench::spec_of(*preset);
  if (o.q_heads) spec.num_q_heads = o.q_heads;
  if (o.kv_heads) spec.num_kv_heads = o.kv_heads;
  if (o.head_size) spec.head_size = o.head_size;
  if (o.block_size) spec.block_size = o.block_size;
  if (!o.dtype.empty()) spec.dtype = dg::parse_dtype(o.dtype);
  if (!o.layout.empty()) spec.layout = dg::parse_layout(o.layout);
  if (!o.kv_dtype.empty()) spec.kv_dtype = dg::parse_kv_cache_dtype(o.kv_dtype);
  try {
    dg::validate_spec(spec);
  } catch (const dg::InvalidArgument& e) {
    usage_error(e.what());  // e.g. --dtype fp32 with --kv-dtype fp8
  }
  return spec;
}

/// Each layer's spec: `spec` with the preset's window on its local layers and its soft-cap
/// (dgbench::layer_spec_of); everything after reads layer_specs.
std::vector<dg::AttentionSpec> layer_specs_of(const Options& o, const dg::AttentionSpec& spec) {
  const dgbench::ModelPreset* preset = dgbench::find_preset(o.preset);
  std::vector<dg::AttentionSpec> specs;
  for (int l = 0; l < o.layers; ++l) specs.push_back(dgbench::layer_spec_of(*preset, spec, l));
  return specs;
}

/// The longest length the run reaches, and the blocks of the segment that needs the most.
struct Reach {
  int longest = 0;
  long long max_blocks = 0;
};

/// A step of n tokens reaches committed + n and commits at most n, so `steps` steps of at most
/// `max_q_len` reach start + steps x max_q_len at most (every draft accepted).
Reach reach_of(const std::vector<Segment>& segments, int steps, int max_q_len, int block_size) {
  Reach r;
  const int grow = steps * max_q_len;
  for (const auto& s : segments) {
    long long blocks = 0;
    for (int len : s.start) {
      r.longest = std::max(r.longest, len + grow);
      blocks += (len + grow + block_size - 1) / block_size;
    }
    r.max_blocks = std::max(r.max_blocks, blocks);
  }
  return r;
}

Geometry geometry_of(const Setup& s, long long max_blocks) {
  Geometry g;
  g.num_blocks = static_cast<int>(std::max<long long>(1, max_blocks));
  g.width = (s.opt.max_seq_len + s.spec.block_size - 1) / s.spec.block_size;
  g.esize = dg::dtype_size(s.spec.dtype);
  for (const dg::AttentionSpec& spec : s.layer_specs) {
    LayerSizes l;
    l.cache_elems = static_cast<std::size_t>(g.num_blocks) * spec.block_elems();
    l.kv_esize = spec.kv_elem_size();
    l.qo_row = static_cast<std::size_t>(spec.num_q_heads) * spec.head_size;
    l.kv_row = static_cast<std::size_t>(spec.num_kv_heads) * spec.head_size;
    const std::size_t rows = static_cast<std::size_t>(s.opt.batch) * s.opt.q_lens.back();  // ascending
    l.qo_elems = l.qo_step(rows);
    l.kv_row_elems = l.kv_step(rows);
    g.max_qo_elems = std::max(g.max_qo_elems, l.qo_elems);
    g.cache_bytes_all += l.cache_elems * l.kv_esize;
    g.layer.push_back(l);
  }
  return g;
}

/// What planning reads; the run adds its caches and layers (run_loop.cpp).
dg::ExecutorConfig planning_config(const Setup& s) {
  const Options& o = s.opt;
  dg::ExecutorConfig cfg;
  cfg.spec = s.spec;
  cfg.num_layers = o.layers;
  if (std::any_of(s.layer_specs.begin(), s.layer_specs.end(), [&](const dg::AttentionSpec& l) { return !(l == s.spec); }))
    cfg.layer_specs = s.layer_specs;
  cfg.max_batch = o.batch;
  cfg.q_lens = o.q_lens;
  cfg.max_seq_len = o.max_seq_len;
  cfg.v2_threshold = o.threshold;
  cfg.partition_size = o.partition == "auto" ? 0 : std::stoi(o.partition);  // checked by CLI11
  cfg.policy = dg::parse_kernel_policy(o.policy);
  cfg.band_select = o.band_select == "host" ? dg::BandSelect::kHost : dg::BandSelect::kDevice;
  if (!o.device_model.empty()) cfg.device_model = parse_device_model(o.device_model);
  return cfg;
}

}  // namespace

std::vector<Segment> parse_segments(const std::string& text, int batch) {
  std::vector<Segment> segs;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    Segment s;
    s.label = item;
    const auto colon = item.find(':');
    int lo, hi;
    if (colon == std::string::npos) {
      lo = hi = parse_length("--start-lens entry", item);
    } else {
      lo = parse_length("--start-lens MIN", item.substr(0, colon));
      hi = parse_length("--start-lens MAX", item.substr(colon + 1));
      if (hi < lo) usage_error(fmt::format("--start-lens entry '{}' has MAX < MIN", item));
    }
    for (int i = 0; i < batch; ++i)
      s.start.push_back(batch == 1 ? hi
                                   : lo + static_cast<int>(std::lround(static_cast<double>(hi - lo) * i /
                                                                       (batch - 1))));
    segs.push_back(std::move(s));
  }
  if (segs.empty()) usage_error("--start-lens is empty");
  return segs;
}

std::string verify_loop_line(const std::vector<int>& q_lens) {
  return fmt::format("verify loop (speculative decoding): each step every sequence brings n = {} query tokens (the "
                     "last verified one and n - 1 drafts){}; each sequence accepts a random 0..n-1 drafts, so its "
                     "length grows by 1..n; graphs per (n, batch bucket)\n",
                     fmt::join(q_lens, " or "), q_lens.size() > 1 ? ", n picked at random under --seed" : "");
}

std::string model_source(const std::string& option, bool gpu) {
  const char* backend = gpu ? "queried from the device" : "host model of an H200";
  if (option.empty()) return backend;
  const dg::DeviceModel d = parse_device_model(option);
  if (d.num_sms != 0 && d.blocks_per_sm != 0) return "--device-model";
  return std::string("--device-model; ") + (d.num_sms ? "blocks per SM " : "SMs ") +
         (gpu ? "queried from the device" : "from the host model of an H200");
}

Setup resolve(Options opt) {
  Setup s;
  s.opt = std::move(opt);
  Options& o = s.opt;
  // Backend first: the defaults depend on it.
  s.backend = choose_backend(o.backend);
  s.gpu = s.backend == dg::BackendKind::kCuda;
  const BackendDefaults& d = s.gpu ? kCudaDefaults : kHostDefaults;
  auto def = [&](const char* flag, const std::string& shown) {
    if (!o.given.count(flag)) s.defaults_used.push_back(std::string(flag) + " " + shown);
  };
  if (o.preset.empty()) o.preset = d.preset;
  def("--preset", o.preset);
  s.spec = spec_of(o);
  if (!o.batch) o.batch = d.batch;
  def("--batch", std::to_string(o.batch));
  if (!o.layers) o.layers = d.layers;
  def("--layers", std::to_string(o.layers));
  s.layer_specs = layer_specs_of(o, s.spec);
  if (!o.steps) o.steps = d.steps;
  def("--steps", std::to_string(o.steps));
  if (o.start_lens.empty()) o.start_lens = d.start_lens;
  def("--start-lens", o.start_lens);
  def("--backend", o.backend + " -> " + dg::to_string(s.backend));
  def("--partition", o.partition);
  def("--threshold", std::to_string(o.threshold));
  def("--policy", o.policy);
  def("--band-select", o.band_select);

  s.segments = parse_segments(o.start_lens, o.batch);
  const Reach reach = reach_of(s.segments, o.steps, o.q_lens.back(), s.spec.block_size);
  if (!o.max_seq_len) {
    o.max_seq_len = 1024;
    while (o.max_seq_len < reach.longest) o.max_seq_len *= 2;
  }
  def("--max-seq-len", std::to_string(o.max_seq_len));
  if (reach.longest > o.max_seq_len)
    usage_error(fmt::format("--max-seq-len = {} is below the longest length the run reaches ({})", o.max_seq_len,
                            reach.longest));
  s.cfg = planning_config(s);
  s.model_from = model_source(o.device_model, s.gpu);
  s.geo = geometry_of(s, reach.max_blocks);
  return s;
}

}  // namespace dgloop
