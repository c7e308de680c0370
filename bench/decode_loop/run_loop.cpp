#include "run_loop.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "progress.hpp"

namespace dgloop {

Caches::Caches(const Setup& s) {
  const Geometry& g = s.geo;
  for (int l = 0; l < s.opt.layers; ++l) {
    k.emplace_back(s.gpu, g.layer[l].cache_elems * g.layer[l].kv_esize);
    v.emplace_back(s.gpu, g.layer[l].cache_elems * g.layer[l].kv_esize);
    eager_out.emplace_back(s.gpu, g.layer[l].qo_elems * g.esize);
  }
  const BackendOps ops{s.gpu, nullptr};
  for (int l = 0; l < s.opt.layers; ++l) {
    const dg::AttentionSpec& spec = s.layer_specs[static_cast<std::size_t>(l)];
    ops.fill_kv(spec, k[l].get(), g.layer[l].cache_elems, s.opt.seed * 1000 + 2 * l);
    ops.fill_kv(spec, v[l].get(), g.layer[l].cache_elems, s.opt.seed * 1000 + 2 * l + 1);
  }
  if (s.spec.fp8_kv()) {  // --kv-dtype: every layer's cache
    for (int l = 0; l < s.opt.layers; ++l) {
      const std::vector<float> scales(
          static_cast<std::size_t>(s.layer_specs[static_cast<std::size_t>(l)].kv_scale_count()), dgbench::kFillKvScale);
      for (std::vector<Buffer>* b : {&k_scale, &v_scale}) {
        b->emplace_back(s.gpu, scales.size() * sizeof(float));
        ops.to_device_async(b->back().get(), scales.data(), scales.size() * sizeof(float));
      }
    }
  }
  std::vector<std::vector<float>> sink_values(static_cast<std::size_t>(s.opt.layers));  // alive until the sync
  if (dgbench::find_preset(s.opt.preset)->sinks) {  // values like trained sinks: a few units, per head
    for (int l = 0; l < s.opt.layers; ++l) {
      std::vector<float>& sk = sink_values[static_cast<std::size_t>(l)];
      sk.resize(static_cast<std::size_t>(s.layer_specs[static_cast<std::size_t>(l)].num_q_heads));
      std::mt19937 rng(static_cast<unsigned>(s.opt.seed * 1000 + l));
      std::uniform_real_distribution<float> u(-1.0f, 4.0f);
      for (float& x : sk) x = u(rng);
      sinks.emplace_back(s.gpu, sk.size() * sizeof(float));
      ops.to_device_async(sinks.back().get(), sk.data(), sk.size() * sizeof(float));
    }
  }
  ops.sync_device();
}

dg::ExecutorConfig run_config(const Setup& s, const Caches& caches) {
  dg::ExecutorConfig cfg = s.cfg;
  cfg.num_layers = s.opt.layers;
  for (int l = 0; l < s.opt.layers; ++l) {
    dg::LayerBuffers lb;
    lb.k_cache = caches.k[l].get();
    lb.v_cache = caches.v[l].get();
    lb.k_scale = caches.k_scale_of(l);
    lb.v_scale = caches.v_scale_of(l);
    lb.sinks = caches.sinks_of(l);
    lb.k_cache_bytes = lb.v_cache_bytes = s.geo.layer[l].cache_elems * s.geo.layer[l].kv_esize;  // the host backend cannot ask
    cfg.layers.push_back(lb);
  }
  cfg.num_blocks = s.geo.num_blocks;
  cfg.max_blocks_per_seq = s.geo.width;
  cfg.capture = s.opt.capture == "up-front" ? dg::CapturePolicy::kUpFront : dg::CapturePolicy::kLazy;
  cfg.backend = s.backend;
  cfg.append_kv = true;
  return cfg;
}

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

/// One run of the loop: the step's inputs (host copies for the executor, device copies for eager),
/// the segment's block allocation, and what the steps recorded.
class DecodeLoop {
 public:
  DecodeLoop(const Setup& s, dg::Executor& ex, Caches& caches)
      : s_(s), g_(s.geo), ex_(ex), caches_(caches), ops_{s.gpu, ex.stream()},
        d_lens_(s.gpu, sizeof(int32_t) * s.opt.batch),
        d_tables_(s.gpu, sizeof(int32_t) * s.opt.batch * s.geo.width),
        d_slots_(s.gpu, sizeof(int64_t) * s.opt.batch * s.opt.q_lens.back()),
        // The executor's workspace covers every plan of the run's batch bucket, and every kMeasured candidate.
        workspace_(s.gpu, ex.memory().workspace),
        lens_(s.gpu, s.opt.batch),
        tables_(s.gpu, static_cast<std::size_t>(s.opt.batch) * s.geo.width),
        slots_(s.gpu, static_cast<std::size_t>(s.opt.batch) * s.opt.q_lens.back()),
        host_graph_out_(s.geo.max_qo_elems * s.geo.esize),
        host_eager_out_(s.geo.max_qo_elems * s.geo.esize),
        tol_(tolerance_for(s.spec.dtype)),
        rng_(s.opt.seed),
        // Its own generator, so that a plain loop (n = 1 only: no draws) shuffles its blocks as before.
        verify_rng_(s.opt.seed * 0x9E3779B97F4A7C15ull + 18),
        progress_(s.opt.progress, static_cast<long>(s.segments.size()) * s.opt.steps) {}

  LoopResults run() {
    const auto run_start = Clock::now();
    for (std::size_t si = 0; si < s_.segments.size(); ++si) {
      start_segment(s_.segments[si]);
      std::set<std::pair<int, int>> checked;  // (band, n) checked against the reference in this segment
      for (int st = 0; st < s_.opt.steps; ++st) step(si, st, checked);
    }
    progress_.finish();
    res_.run_s = std::chrono::duration<double>(Clock::now() - run_start).count();
    return std::move(res_);
  }

 private:
  int batch() const { return s_.opt.batch; }
  int32_t& table(int seq, int col) { return tables_[static_cast<std::size_t>(seq) * g_.width + col]; }

  /// A fresh shuffled free list per segment: block tables are scattered, as in a real cache.
  void start_segment(const Segment& seg) {
    free_blocks_.resize(static_cast<std::size_t>(g_.num_blocks));
    std::iota(free_blocks_.begin(), free_blocks_.end(), 0);
    std::shuffle(free_blocks_.begin(), free_blocks_.end(), rng_);
    next_free_ = 0;
    allocated_.assign(static_cast<std::size_t>(batch()), 0);
    committed_.assign(static_cast<std::size_t>(batch()), 0);
    std::fill(tables_.data(), tables_.data() + tables_.size(), 0);
    const int bs = s_.spec.block_size;
    for (int i = 0; i < batch(); ++i) {
      committed_[i] = seg.start[i];
      const int need = (seg.start[i] + bs - 1) / bs;
      for (int b = 0; b < need; ++b) table(i, b) = free_blocks_[next_free_++];
      allocated_[i] = need;
    }
  }

  /// The step's n: the only q_len, or one of the list at random (a verify loop drafts n - 1 tokens).
  int pick_q_len() {
    const std::vector<int>& q = s_.opt.q_lens;
    return q.size() == 1 ? q.front() : q[verify_rng_() % q.size()];
  }

  /// Appends n tokens to every sequence, at positions committed .. committed + n - 1 (the last
  /// verified token and n - 1 drafts), allocating a block where a token starts one; row i's n slots
  /// go into slot_mapping [batch, n]. Returns the longest length.
  int grow(int n) {
    const int bs = s_.spec.block_size;
    int max_len = 0;
    for (int i = 0; i < batch(); ++i) {
      for (int j = 0; j < n; ++j) {
        const int pos = committed_[i] + j;
        const int blk = pos / bs;
        if (blk >= allocated_[i]) {
          table(i, blk) = free_blocks_[next_free_++];
          allocated_[i] = blk + 1;
        }
        slots_[static_cast<std::size_t>(i) * n + j] = static_cast<int64_t>(table(i, blk)) * bs + pos % bs;
      }
      lens_[i] = committed_[i] + n;
      max_len = std::max(max_len, lens_[i]);
    }
    return max_len;
  }

  /// Verification: each sequence accepts a random 0..n-1 of its drafts and commits them and the token
  /// after them (n = 1: that one token). The rejected drafts' slots are written again next step, as an
  /// engine does. Returns the tokens generated.
  long long accept(int n) {
    long long tokens = 0;
    for (int i = 0; i < batch(); ++i) {
      const int accepted = n == 1 ? 0 : static_cast<int>(verify_rng_() % static_cast<unsigned>(n));
      committed_[i] += accepted + 1;
      tokens += accepted + 1;
    }
    return tokens;
  }

  /// One step.
  void step(std::size_t si, int st, std::set<std::pair<int, int>>& checked) {
    const int n = pick_q_len();
    const int max_len = grow(n);
    const std::size_t rows = static_cast<std::size_t>(batch()) * n;
    // This step's q and new K/V (what the model's projections would produce), random per step.
    const std::uint64_t step_seed = s_.opt.seed * 7919 + si * 100003 + static_cast<std::uint64_t>(st) * 31;
    for (int l = 0; l < s_.opt.layers; ++l) {
      const LayerSizes& z = g_.layer[l];
      ops_.fill(s_.spec.dtype, ex_.query(l), z.qo_step(rows), step_seed + 3 * l);
      ops_.fill(s_.spec.dtype, ex_.new_key(l), z.kv_step(rows), step_seed + 3 * l + 1);
      ops_.fill(s_.spec.dtype, ex_.new_value(l), z.kv_step(rows), step_seed + 3 * l + 2);
    }
    ops_.sync();

    double graph_us = 0;
    const dg::StepResult r = graph_step(n, graph_us);
    if (r.captured || r.measured) res_.capture_wall_ms += graph_us / 1000.0;
    // Host backend: the graph's appends, before eager appends the same again.
    if (s_.opt.check && !s_.gpu)
      for (int l = 0; l < s_.opt.layers; ++l)
        check_appended(s_.layer_specs[l], caches_.k[l].get(), caches_.v[l].get(), caches_.k_scale_of(l),
                       caches_.v_scale_of(l), ex_.new_key(l), ex_.new_value(l), lens_.data(), tables_.data(), g_.width,
                       batch(), n, fmt::format("segment {} step {} layer {}", si, st, l), res_.check);
    const double eager_us = eager_step(r, max_len);

    StepRecord rec = record(si, st, r, max_len);
    rec.eager_us = eager_us;
    rec.graph_us = graph_us;
    if (s_.opt.check) {
      check_outputs(rec, r, si, st);
      // Host backend: also against the float64 reference, every row of every sequence, at the first
      // step of each (band, n) of a segment (cheap enough there; on GPU the test suites do this).
      if (!s_.gpu && checked.insert({r.band, n}).second)
        check_reference(reference_args(max_len, n), ex_.output(0), g_.layer[0].qo_step(rows), tol_, res_.check);
    }
    rec.tokens = accept(n);
    res_.recs.push_back(rec);
    progress_.update(static_cast<long>(res_.recs.size()),
                     fmt::format("len {} {}", max_len, dg::to_string(r.kernel)));
  }

  /// Graph: validate, bucket, stage, replay (capture first when the bucket is new).
  dg::StepResult graph_step(int n, double& us) {
    dg::StepInputs in;
    in.num_seqs = batch();
    in.q_len = n;
    in.seq_lens = lens_.data();
    in.block_tables = tables_.data();
    in.block_table_stride = g_.width;
    in.slot_mapping = slots_.data();
    in.space = dg::MemorySpace::kHost;
    const auto t0 = Clock::now();
    const dg::StepResult r = ex_.step(in);
    ops_.sync();
    us = us_since(t0);
    return r;
  }

  /// Layer l's plan in the step: its layer group's (the band is known on the host: host inputs).
  const dg::BucketPlan& layer_plan(int l, const dg::StepResult& r) const {
    return ex_.plan_for(ex_.layer_group(l), r.bucket, r.band, r.q_len);
  }

  /// Eager: the same work launched call by call, with each layer's plan's kernel and partition
  /// size. It appends the same K/V into the same slots (idempotent), so both see identical caches.
  double eager_step(const dg::StepResult& r, int max_len) {
    const auto t0 = Clock::now();
    ops_.to_device_async(d_lens_.get(), lens_.data(), sizeof(int32_t) * batch());
    ops_.to_device_async(d_tables_.get(), tables_.data(), sizeof(int32_t) * batch() * g_.width);
    ops_.to_device_async(d_slots_.get(), slots_.data(), sizeof(int64_t) * batch() * r.q_len);
    for (int l = 0; l < s_.opt.layers; ++l) eager_layer(l, r, max_len);
    ops_.sync();
    return us_since(t0);
  }

  void eager_layer(int l, const dg::StepResult& r, int max_len) {
    const dg::BucketPlan& plan = layer_plan(l, r);
    dg::AppendArgs ap;
    ap.spec = s_.layer_specs[l];
    ap.num_tokens = batch() * r.q_len;  // [batch, n] tokens, row s * n + j
    ap.num_blocks = g_.num_blocks;
    ap.key = ex_.new_key(l);
    ap.value = ex_.new_value(l);
    ap.k_cache = caches_.k[l].get();
    ap.v_cache = caches_.v[l].get();
    ap.slot_mapping = static_cast<const int64_t*>(d_slots_.get());
    ap.k_scale = caches_.k_scale_of(l);
    ap.v_scale = caches_.v_scale_of(l);
    // max_len: what an eager caller knows; the graph uses its band's upper edge.
    dg::DecodeArgs a = decode_args(l, max_len, r.q_len, caches_.eager_out[l].get(),
                                   static_cast<const int32_t*>(d_tables_.get()),
                                   static_cast<const int32_t*>(d_lens_.get()));
    a.host_seq_lens = lens_.data();
    const dg::Stream stream = ops_.stream;
    if (s_.gpu) {
      dg::append_kv(ap, stream);
      if (plan.kernel == dg::KernelKind::kV1) dg::paged_attention_v1(a, stream);
      else dg::paged_attention_v2(a, plan.partition_size, workspace_.get(), workspace_.bytes(), stream);
    } else {
      dg::host::append_kv(ap);
      if (plan.kernel == dg::KernelKind::kV1) dg::host::paged_attention_v1(a);
      else dg::host::paged_attention_v2(a, plan.partition_size, workspace_.get(), workspace_.bytes());
    }
  }

  /// Layer `l`'s attention over the step's lengths and block tables (in the memory space given).
  dg::DecodeArgs decode_args(int l, int max_len, int n, void* out, const int32_t* tables, const int32_t* lens) {
    dg::DecodeArgs a;
    a.spec = s_.layer_specs[l];
    a.num_seqs = batch();
    a.q_len = n;
    a.max_seq_len = max_len;
    a.block_table_stride = g_.width;
    a.num_blocks = g_.num_blocks;
    a.q = ex_.query(l);
    a.out = out;
    a.k_cache = caches_.k[l].get();
    a.v_cache = caches_.v[l].get();
    a.block_tables = tables;
    a.seq_lens = lens;
    a.k_scale = caches_.k_scale_of(l);  // host memory on the host backend (the reference reads them)
    a.v_scale = caches_.v_scale_of(l);
    a.sinks = caches_.sinks_of(l);
    return a;
  }

  /// Layer 0 on the host inputs, for the float64 reference (out: validated as an argument; the
  /// reference writes only its own result).
  dg::DecodeArgs reference_args(int max_len, int n) {
    return decode_args(0, max_len, n, ex_.output(0), tables_.data(), lens_.data());
  }

  StepRecord record(std::size_t si, int st, const dg::StepResult& r, int max_len) {
    StepRecord rec;
    rec.segment = static_cast<int>(si);
    rec.step = st;
    rec.band = r.band;
    rec.band_hi = r.band_hi;
    rec.kernel = r.kernel;
    rec.partition_size = r.partition_size;
    rec.captured = r.captured;
    rec.measured = r.measured;
    rec.graph_id = r.graph_id;
    rec.q_len = r.q_len;
    rec.max_len = max_len;
    rec.bytes = 0;  // the bytes model, summed over layers: each its own spec and plan
    for (int l = 0; l < s_.opt.layers; ++l) {
      const dg::BucketPlan& p = layer_plan(l, r);
      rec.bytes += dgbench::attention_bytes(s_.layer_specs[l], lens_.data(), batch(), p.kernel, p.partition_size,
                                            r.q_len);
      rec.kv_bytes += dgbench::attention_kv_bytes(s_.layer_specs[l], lens_.data(), batch(), r.q_len);
      rec.kv_bytes_n1 += dgbench::attention_kv_bytes(s_.layer_specs[l], lens_.data(), batch(), 1);
    }
    for (const auto& p : ex_.plans())
      if (p.band == r.band) rec.band_lo = p.band_lo;
    double len_sum = 0;
    for (int i = 0; i < batch(); ++i) len_sum += lens_[i];
    rec.mean_len = len_sum / batch();
    // The cost model's points of each layer group's plan, counted once per layer of the group.
    std::vector<int> layers_of(static_cast<std::size_t>(ex_.num_layer_groups()), 0);
    for (int l = 0; l < s_.opt.layers; ++l) ++layers_of[static_cast<std::size_t>(ex_.layer_group(l))];
    for (int grp = 0; grp < ex_.num_layer_groups(); ++grp) {
      if (layers_of[static_cast<std::size_t>(grp)] == 0) continue;
      const dg::BucketPlan& p = ex_.plan_for(grp, r.bucket, r.band, r.q_len);
      rec.model.push_back({layers_of[static_cast<std::size_t>(grp)], p.predicted_lo, p.predicted_mid, p.predicted_hi});
    }
    return rec;
  }

  /// Every layer's graph output against its eager output: bitwise on a GPU, within tolerance on the
  /// host backend.
  void check_outputs(StepRecord& rec, const dg::StepResult& r, std::size_t si, int st) {
    for (int l = 0; l < s_.opt.layers; ++l) {
      // Every row of the step: [batch, n].
      const std::size_t elems = g_.layer[l].qo_step(static_cast<std::size_t>(batch()) * r.q_len);
      const std::size_t bytes = elems * g_.esize;
      ops_.to_host(host_graph_out_.data(), ex_.output(l), bytes);
      ops_.to_host(host_eager_out_.data(), caches_.eager_out[l].get(), bytes);
      const OutputDiff d =
          compare_outputs(s_.spec.dtype, host_graph_out_.data(), host_eager_out_.data(), elems, tol_);
      rec.bitwise_equal = rec.bitwise_equal && d.same;
      rec.max_abs_diff = std::max(rec.max_abs_diff, d.worst);
      if (s_.gpu ? !d.same : d.out_of_tol)
        res_.check.add_mismatch(fmt::format("segment {} step {} layer {} ({}, band {}): graph and eager differ; "
                                            "max |diff| {:.3g} at element {}{}",
                                            si, st, l, dg::to_string(r.kernel), band_label(rec.band_lo, r.band_hi),
                                            d.worst, d.worst_i, s_.gpu ? " (bitwise equality required on GPU)" : ""));
    }
  }

  const Setup& s_;
  const Geometry& g_;
  dg::Executor& ex_;
  Caches& caches_;
  const BackendOps ops_;
  Buffer d_lens_, d_tables_, d_slots_, workspace_;  // eager's staged inputs and V2 workspace
  HostArray<int32_t> lens_, tables_;
  HostArray<int64_t> slots_;
  std::vector<unsigned char> host_graph_out_, host_eager_out_;
  const Tolerance tol_;
  std::mt19937_64 rng_;
  std::mt19937_64 verify_rng_;  // each step's n and each sequence's accepted drafts
  Progress progress_;
  // The segment's block allocation.
  std::vector<int32_t> free_blocks_;
  std::size_t next_free_ = 0;
  std::vector<int> allocated_;
  std::vector<int> committed_;  // tokens verified so far, per sequence: the next step's first position
  LoopResults res_;
};

}  // namespace

LoopResults run_loop(const Setup& s, dg::Executor& ex, Caches& caches) { return DecodeLoop(s, ex, caches).run(); }

}  // namespace dgloop
