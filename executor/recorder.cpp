// Recording a graph's work, and StepContext (recorder.hpp).
#include "executor/recorder.hpp"

#include <string>
#include <utility>

#include "decodegraph/error.hpp"

namespace decodegraph {

struct StepContext::Impl {
  detail::Recorder* rec;
  const BucketPlan* plan;
  const std::vector<BucketPlan>* group_plans;  // kHost: each layer group's plan; null under kDevice
  int switch_bucket = -1;  // kDevice: attention becomes a SWITCH node over this bucket's bands
};

Stream StepContext::stream() const { return impl_->rec->backend_.capture_stream(); }
BackendKind StepContext::backend() const { return impl_->rec->backend_.kind(); }
const BucketPlan& StepContext::plan() const { return *impl_->plan; }
const int32_t* StepContext::seq_lens() const { return impl_->rec->targets_.inputs.seq_lens; }
const int32_t* StepContext::block_tables() const { return impl_->rec->targets_.inputs.block_tables; }
const int64_t* StepContext::slot_mapping() const { return impl_->rec->targets_.inputs.slot_mapping; }

void StepContext::append_kv(int layer) {
  impl_->rec->layers_.check_layer(layer);
  impl_->rec->append(*impl_->plan, layer);
}

void StepContext::attention(int layer) {
  impl_->rec->layers_.check_layer(layer);
  const LayerBuffers& lb = impl_->rec->layers_[layer];
  attention(layer, lb.q, lb.out, lb.q_stride, lb.out_stride);
}

void StepContext::attention(int layer, const void* q, void* out, int64_t q_stride, int64_t out_stride) {
  detail::Recorder& rec = *impl_->rec;
  rec.layers_.check_layer(layer);
  require(q != nullptr, "q", "null", "a query buffer [max_batch x max q_len rows, num_q_heads, head_size]");
  require(out != nullptr, "out", "null", "an output buffer [max_batch x max q_len rows, num_q_heads, head_size]");
  if (impl_->switch_bucket >= 0)
    rec.attention_switch(impl_->switch_bucket, layer, q, out, q_stride, out_stride);
  else
    rec.attention((*impl_->group_plans)[static_cast<std::size_t>(rec.plans_.groups().group_of(layer))], layer, q,
                  out, q_stride, out_stride);
}

void StepContext::enqueue_host(std::function<void()> fn) {
  detail::Backend& b = impl_->rec->backend_;
  if (b.kind() != BackendKind::kHost)
    throw_invalid("StepContext::enqueue_host backend", to_string(b.kind()), "host (on cuda, launch your work on stream())");
  b.host_work(std::move(fn));
}

namespace detail {

Recorder::Recorder(const ExecutorConfig& config, Backend& backend, const LayerSet& layers, const PlanBook& plans,
                   const GraphTargets& targets, StepBody body)
    : cfg_(config), backend_(backend), layers_(layers), plans_(plans), targets_(targets), body_(std::move(body)) {}

void Recorder::record(const std::vector<BucketPlan>& group_plans) {
  record_body(group_plans.front(), &group_plans, -1);
}

void Recorder::record_switch(int bucket, const BucketPlan& graph_plan, const kernels::BandSelectParams& select) {
  backend_.band_select(select);
  switch_nodes_ = 0;
  record_body(graph_plan, nullptr, bucket);
}

// NOTE(graph): the flag copy comes last, in stream order after every launch that may set the flag.
void Recorder::record_body(const BucketPlan& plan, const std::vector<BucketPlan>* group_plans, int switch_bucket) {
  StepContext::Impl ctx_impl{this, &plan, group_plans, switch_bucket};
  StepContext ctx(&ctx_impl);
  if (body_) {
    body_(ctx);
  } else {
    for (int l = 0; l < cfg_.num_layers; ++l) {
      if (cfg_.append_kv) ctx.append_kv(l);
      ctx.attention(l);
    }
  }
  backend_.copy_to_host(targets_.bad_block_h, targets_.bad_block, sizeof(int));
}

void Recorder::append(const BucketPlan& plan, int layer) {
  const LayerBuffers& lb = layers_[layer];
  AppendArgs a;
  a.spec = plans_.groups().spec_of(layer);
  a.num_tokens = plan.batch * plan.q_len;  // [batch, q_len] tokens; padded ones carry slot -1 and are skipped
  a.num_blocks = cfg_.num_blocks;
  a.key = lb.new_key;
  a.value = lb.new_value;
  a.key_stride = lb.new_key_stride;
  a.value_stride = lb.new_value_stride;
  a.k_cache = lb.k_cache;
  a.v_cache = lb.v_cache;
  a.slot_mapping = targets_.inputs.slot_mapping;
  a.k_scale = lb.k_scale;  // NOTE(graph): fp8 scales are read when the append runs
  a.v_scale = lb.v_scale;
  // NOTE(graph): the staged lengths and tables: each slot is checked against its position (one
  // compare per token; token j of sequence i at seq_lens[i] - q_len + j under row i) and a wrong one
  // skipped and reported through the bad-block flag. Padded sequences' rows (length 0, a stale
  // table row) are never read: their tokens, and skipped ones, carry slot -1.
  a.seq_lens = targets_.inputs.seq_lens;
  a.block_tables = targets_.inputs.block_tables;
  a.block_table_stride = cfg_.max_blocks_per_seq;
  a.tokens_per_seq = plan.q_len;
  a.bad_slot = targets_.bad_block;
  a.programmatic_launch = targets_.programmatic;  // the backend keeps it after kernel nodes only
  backend_.append(a);
}

// kDevice: one SWITCH node whose branch `band` holds that band's launch of the layer's group, exactly
// as kHost's graph of (bucket, band) would; bands with the same launch for that group share one
// recording.
void Recorder::attention_switch(int bucket, int layer, const void* q, void* out, int64_t q_stride,
                                int64_t out_stride) {
  if (switch_nodes_ + 1 > kernels::kMaxSwitchHandles)
    throw_invalid("attention calls in one graph under BandSelect::kDevice", switch_nodes_ + 1,
                  "at most " + std::to_string(kernels::kMaxSwitchHandles) + " (one SWITCH node each)");
  ++switch_nodes_;
  backend_.begin_switch(plans_.num_bands());
  const int group = plans_.groups().group_of(layer);
  for (int band = 0; band < plans_.num_bands(); ++band) {
    const BucketPlan& p = plans_.group_plan(group, plans_.index(bucket, band));
    if (backend_.begin_branch(band, plans_.branch_key(group, bucket, band))) attention(p, layer, q, out, q_stride, out_stride);
    backend_.end_branch();
  }
  backend_.end_switch();
}

void Recorder::attention(const BucketPlan& p, int layer, const void* q, void* out, int64_t q_stride,
                         int64_t out_stride) {
  if (p.group != plans_.groups().group_of(layer))
    throw Error("Recorder::attention: layer " + std::to_string(layer) + " is in layer group " +
                std::to_string(plans_.groups().group_of(layer)) + ", not the plan's " + std::to_string(p.group));
  const LayerBuffers& lb = layers_[layer];
  DecodeArgs a;
  a.spec = plans_.groups().spec_of(layer);
  a.num_seqs = p.batch;          // NOTE(graph): the bucket's padded batch, padded rows have length 0
  a.q_len = p.q_len;             // q/out rows [batch, q_len]
  a.max_seq_len = p.launch_len;  // NOTE(graph): sizes the grid; >= band_hi of every bucket replaying it
  a.block_table_stride = cfg_.max_blocks_per_seq;
  a.num_blocks = cfg_.num_blocks;
  a.q_stride = q_stride;
  a.out_stride = out_stride;
  a.q = q;
  a.out = out;
  a.k_cache = lb.k_cache;
  a.v_cache = lb.v_cache;
  a.block_tables = targets_.inputs.block_tables;
  a.seq_lens = targets_.inputs.seq_lens;
  a.alibi_slopes = targets_.alibi;
  a.k_scale = lb.k_scale;  // NOTE(graph): fp8 scales are read when the kernel runs, not baked
  a.v_scale = lb.v_scale;
  a.sinks = lb.sinks;  // NOTE(graph): read when the kernel runs, not baked
  a.bad_block = targets_.bad_block;  // NOTE(graph): fixed address; ids are clamped, the first bad one reported
  // NOTE(graph): PDL; pass 1 and the merge wait before any global access (docs/design.md).
  a.programmatic_launch = targets_.programmatic;
  if (p.kernel == KernelKind::kV1)
    backend_.attention_v1(a);
  else
    backend_.attention_v2(a, p.partition_size, targets_.workspace, targets_.workspace_bytes);
}

}  // namespace detail
}  // namespace decodegraph
