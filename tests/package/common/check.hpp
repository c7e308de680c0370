// What every package consumer runs: host V1 on a small random-looking problem against the float64
// reference, and one host-backend executor step, through the public headers only. Returns the
// worst |out - ref| over both, or a negative value when something threw.
#pragma once

#include <decodegraph/decodegraph.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

inline double dg_consumer_check() {
  namespace dg = decodegraph;
  try {
    dg::AttentionSpec spec{2, 1, 64, 16, dg::DType::kFloat32, dg::KVLayout::kNHD};
    const int len = 37, blocks = 3;
    std::vector<float> q(2 * 64), out(2 * 64, NAN), k(blocks * 16 * 64), v(k.size());
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.1f * i);
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.07f * i), v[i] = std::sin(0.03f * i);
    std::vector<int> table = {2, 0, 1}, lens = {len};
    dg::DecodeArgs a;
    a.spec = spec;
    a.num_seqs = 1;
    a.max_seq_len = len;
    a.block_table_stride = blocks;
    a.num_blocks = blocks;
    a.q = q.data();
    a.out = out.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.block_tables = table.data();
    a.seq_lens = lens.data();
    dg::host::paged_attention_v1(a);
    std::vector<double> ref(out.size());
    dg::reference::paged_attention(a, ref.data());
    double worst = 0;
    for (std::size_t i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out[i] - ref[i]));

    // The same problem through a host-backend executor (one layer, no append): its output must
    // match the same reference.
    dg::ExecutorConfig cfg;
    cfg.spec = spec;
    cfg.layers = {dg::LayerBuffers{k.data(), v.data()}};
    cfg.layers[0].k_cache_bytes = k.size() * sizeof(k[0]);  // the host backend cannot ask for them
    cfg.layers[0].v_cache_bytes = v.size() * sizeof(v[0]);
    cfg.max_batch = 2;
    cfg.max_seq_len = 64;
    cfg.num_blocks = blocks;
    cfg.max_blocks_per_seq = 4;
    cfg.v2_threshold = 64;
    cfg.band_edges = {64};
    cfg.backend = dg::BackendKind::kHost;
    cfg.append_kv = false;
    cfg.log_level = "off";
    dg::Executor ex(cfg);
    std::vector<int> table4 = {2, 0, 1, 0};
    for (std::size_t i = 0; i < q.size(); ++i) static_cast<float*>(ex.query(0))[i] = q[i];
    dg::StepInputs in;
    in.num_seqs = 1;
    in.seq_lens = lens.data();
    in.block_tables = table4.data();
    in.block_table_stride = 4;
    ex.step(in);
    const float* eo = static_cast<const float*>(ex.output(0));
    for (std::size_t i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(eo[i] - ref[i]));
    return worst;
  } catch (const decodegraph::Error& e) {
    std::fprintf(stderr, "decodegraph::Error: %s\n", e.what());
    return -1;
  }
}
