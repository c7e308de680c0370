// A user of the installed package: runs host V1 on a tiny problem and checks it against the
// float64 reference through the public headers only.
#include <decodegraph/decodegraph.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  namespace dg = decodegraph;
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
  std::printf("decodegraph %s cuda=%d %s (max |err| %.2e)\n", dg::version(), dg::built_with_cuda() ? 1 : 0,
              worst < 1e-5 ? "ok" : "MISMATCH", worst);
  return worst < 1e-5 ? 0 : 1;
}
