// A step on a stream the caller is capturing (graph_cache.hpp; docs/executor.md, "Running inside an
// engine's graph capture"). Engines such as vLLM and SGLang capture their whole forward pass on their
// own stream and replay that graph; a step() inside it records the step's work into their capture
// instead of launching a graph of ours (a graph launch cannot be captured into another graph with
// SWITCH nodes in it: conditional nodes may not sit in a child graph).
//
// What the caller's graph then holds, in stream order: the staging copies from the caller's device
// buffers into the static buffers (read at every replay, so the caller refills those buffers before
// each replay), and the work of the graph the step would have replayed: under kDevice the band-select
// node and one SWITCH node per attention call, so the band follows the lengths at each replay; under
// kHost the launches of the hint's band. Everything that would need the host to see the inputs or
// to wait is refused up front, before anything is recorded, so a refused step leaves the caller's
// capture valid.
#include <string>

#include "decodegraph/error.hpp"
#include "executor/graph_cache.hpp"
#include "executor/scoped.hpp"

namespace decodegraph::detail {

void GraphCache::check_caller_capture(const StepInputs& in) const {
  const ExecutorConfig& c = p_.cfg;
  if (in.space != MemorySpace::kDevice)
    throw_invalid("inputs.space", "kHost (the step's stream is being captured)",
                  "kDevice: under a stream capture the captured copies read your device buffers at every replay, so "
                  "fill fixed device buffers before each replay; host inputs would be read once, now");
  if (c.validation == ValidationLevel::kFull)
    throw_invalid("validation", "kFull (the step's stream is being captured)",
                  "kCheap for steps inside your capture: kFull copies the inputs to the host and waits, which a "
                  "capture cannot do (validate your inputs before each replay instead)");
  if (!band_on_device() && in.max_seq_len == 0)
    throw_invalid("inputs.max_seq_len", "0 (no hint, the step's stream is being captured)",
                  "a bound on every length of every replay: under BandSelect::kHost the launches of that "
                  "length's band are recorded into your graph; or BandSelect::kDevice, whose graph picks the "
                  "band at each replay");
  if (in.num_seqs < 1 || in.num_seqs > c.max_batch || in.max_seq_len < 0 || in.max_seq_len > c.max_seq_len ||
      p_.plans.q_index(in.q_len) < 0)
    return;  // validate() names the parameter
  const int bucket = p_.plans.bucket_of_step(in.num_seqs, in.q_len);
  if (!decided(bucket, band_on_device() ? 0 : in.max_seq_len))
    throw_invalid("policy", "kMeasured (this batch bucket is not measured yet; the step's stream is being captured)",
                  "a measured bucket: timing candidates cannot run inside a capture, so call capture_all() (or run "
                  "one step of this batch size outside the capture) before capturing");
}

StepResult GraphCache::record_into_caller(int bucket, const Lengths& lens) {
  GraphSlot target;
  StepResult r;
  describe_step(bucket, lens, target, r);
  p_.backend.begin_caller_capture();
  AbortCapture abort{&p_.backend};
  record(target);
  abort.armed = false;
  p_.backend.end_caller_capture();
  ++caller_captures_;
  r.in_caller_capture = true;
  return r;
}

}  // namespace decodegraph::detail
