// The command line, declared group by group in the order --help lists it.
#include "options.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "bench_common.hpp"

namespace dgloop {

void usage_error(const std::string& msg) { throw UsageError(msg); }

int parse_int_in(const std::string& what, const std::string& v, int lo, int hi) {
  int x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi)
    usage_error(fmt::format("{} = '{}' is invalid; allowed: an integer in {}..{}", what, v, lo, hi));
  return x;
}

std::vector<int> parse_q_lens(const std::string& option, const std::string& text, bool list) {
  const std::string allowed =
      list ? fmt::format("distinct integers in 1..{}, comma-separated (e.g. 1,4)", dg::kMaxQLen)
           : fmt::format("an integer in 1..{}", dg::kMaxQLen);
  auto bad = [&](const std::string& why) {
    usage_error(fmt::format("{} = '{}' is invalid{}; allowed: {}", option, text, why, allowed));
  };
  std::vector<std::string> items;  // --q-len: the whole value, so "4,5" is one bad value
  if (!list) items.push_back(text);
  std::stringstream ss(text);
  for (std::string item; list && std::getline(ss, item, ',');) items.push_back(item);
  if (text.empty() || (list && text.back() == ',')) bad(" (an empty entry)");  // getline drops a trailing one
  std::vector<int> out;
  for (const std::string& item : items) {
    int x = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), x);
    if (item.empty()) bad(" (an empty entry)");
    if (ec != std::errc() || end != item.data() + item.size() || x < 1 || x > dg::kMaxQLen)
      bad(list ? fmt::format(" (entry '{}')", item) : "");
    if (std::find(out.begin(), out.end(), x) != out.end()) bad(fmt::format(" ({} appears more than once)", x));
    out.push_back(x);
  }
  std::sort(out.begin(), out.end());
  return out;
}

dg::DeviceModel parse_device_model(const std::string& text) {
  dg::DeviceModel d;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "sms") d.num_sms = parse_int_in("--device-model sms", value, 1, 65536);
    else if (key == "blocks_per_sm") d.blocks_per_sm = parse_int_in("--device-model blocks_per_sm", value, 1, 64);
    else usage_error(fmt::format("--device-model entry '{}' is invalid; allowed: sms=N, blocks_per_sm=M", item));
  }
  if (d.num_sms == 0 && d.blocks_per_sm == 0) usage_error("--device-model is empty; allowed: sms=N,blocks_per_sm=M");
  return d;
}

namespace {

/// "a string that `parse` accepts": a CLI11 check from a parser that throws Failure on a bad value.
template <typename Failure, typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& what) {
  return CLI::Validator(
      [parse](std::string& v) -> std::string {
        try {
          parse(v);
          return {};
        } catch (const Failure& e) {
          return e.what();
        }
      },
      what);
}

CLI::Validator positive() { return CLI::Range(1, 1 << 30).description(">= 1"); }

void add_shape_options(CLI::App& app, Options& o) {
  std::vector<std::string> preset_names;
  for (const auto& p : dgbench::model_presets()) preset_names.push_back(p.name);
  app.add_option("--preset", o.preset,
                 "llama3-8b (32q/8kv), llama3-70b-tp8 (8q/1kv), mha (32q/32kv) [head 128, block 16, bf16]; "
                 "small (8q/2kv, head 64, block 16, bf16); gpt-oss-20b (openai/gpt-oss-20b config.json: 64q/8kv, "
                 "head 64, window 128 on even layers, sinks), gemma-2-9b (google/gemma-2-9b config.json: 16q/8kv, "
                 "head 256, window 4096 on even layers, soft-cap 50, scale 1/16), gemma-3-27b "
                 "(google/gemma-3-27b-it config.json: 32q/16kv, head 128, window 1024 on 5 of 6 layers, scale "
                 "168^-1/2)")
      ->check(CLI::IsMember(preset_names))
      ->group("shape");
  app.add_option("--q-heads", o.q_heads, "override the preset's query heads")->check(positive())->group("shape");
  app.add_option("--kv-heads", o.kv_heads, "override the preset's KV heads")->check(positive())->group("shape");
  app.add_option("--head-size", o.head_size, "override the preset's head size")->check(positive())->group("shape");
  app.add_option("--block-size", o.block_size, "override the preset's block size")->check(positive())->group("shape");
  app.add_option("--dtype", o.dtype, "override the preset's dtype")
      ->check(parsed_by<dg::Error>([](const std::string& s) { dg::parse_dtype(s); }, "fp16|bf16|fp32"))
      ->group("shape");
  app.add_option("--layout", o.layout, "override the preset's KV layout")
      ->check(parsed_by<dg::Error>([](const std::string& s) { dg::parse_layout(s); }, "vllm|nhd"))
      ->group("shape");
  app.add_option("--kv-dtype", o.kv_dtype,
                 "KV cache dtype, as vLLM's kv_cache_dtype: auto (the dtype), fp8 / fp8_e4m3, fp8_e5m2 (scales "
                 "1/256 in device memory; GB/s counts the fp8 bytes)")
      ->check(parsed_by<dg::Error>([](const std::string& s) { dg::parse_kv_cache_dtype(s); },
                                   "auto|fp8|fp8_e4m3|fp8_e5m2"))
      ->group("shape");
}

/// --q-len and --q-lens land in `q_len` and `q_lens` as given: parse_options checks them, so that a
/// bad value's message names the option, the value and what is allowed.
void add_loop_options(CLI::App& app, Options& o, std::string& q_len, std::string& q_lens) {
  app.add_option("--batch", o.batch, "sequences per step")->check(positive())->group("loop");
  app.add_option("--start-lens", o.start_lens,
                 "comma-separated segments; each \"N\" (every sequence starts at N tokens) or \"MIN:MAX\" "
                 "(start lengths spread over the batch). Each segment runs --steps steps.")
      ->group("loop");
  app.add_option("--steps", o.steps, "steps per segment")->check(positive())->group("loop");
  app.add_option("--layers", o.layers, "layers (each with its own KV cache)")->check(positive())->group("loop");
  app.add_option("--q-len", q_len,
                 fmt::format("speculative decoding: every step verifies N query tokens per sequence (1 + N-1 "
                             "drafts; 1..{}), of which a random 0..N-1 drafts are accepted: lengths grow by 1..N",
                             dg::kMaxQLen))
      ->type_name("N")
      ->group("loop");
  app.add_option("--q-lens", q_lens,
                 "a mixed verify loop: each step picks its n from this list (e.g. 1,4: EAGLE with 3 drafts, "
                 "steps without drafts n = 1) at random under --seed; the executor captures graphs for each. Not "
                 "with --q-len")
      ->type_name("A,B,...")
      ->group("loop");
  app.add_option("--max-seq-len", o.max_seq_len,
                 "executor max_seq_len (default: next power of two >= the longest length)")
      ->check(positive())
      ->group("loop");
}

void add_executor_options(CLI::App& app, Options& o) {
  app.add_option("--backend", o.backend, "auto: cuda when a device is present")
      ->check(CLI::IsMember({"auto", "cuda", "host"}))
      ->group("executor");
  app.add_option("--partition", o.partition, "V2 partition size: auto, or N (a multiple of the block size)")
      ->check((CLI::IsMember({"auto"}) | positive()).description("auto|N"))
      ->group("executor");
  app.add_option("--threshold", o.threshold, "V1/V2 threshold")->capture_default_str()->check(positive())->group("executor");
  app.add_option("--policy", o.policy,
                 "how buckets pick V1/V2 and P: auto (fill the GPU's resident slots), threshold (V1 up to "
                 "the threshold), measured (time candidates at capture); see docs/planning.md")
      ->check(CLI::IsMember({"auto", "threshold", "measured"}))
      ->capture_default_str()
      ->group("executor");
  app.add_option("--band-select", o.band_select,
                 "where each step's band is chosen: device (one graph per batch bucket, a SWITCH node picks "
                 "the band in the graph; falls back to host without CUDA 12.8) or host; see docs/executor.md")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str()
      ->group("executor");
  app.add_flag("--capture-compare", o.capture_compare,
               "with --plan-only: capture every bucket up front under --band-select host and device (host "
               "backend) and print graphs, nodes and capture time side by side")
      ->group("executor");
  app.add_option("--device-model", o.device_model,
                 "plan for this GPU: sms=N,blocks_per_sm=M (either may be left out); default: the device's "
                 "(host backend: an H200, 132 SMs, and the pass-1 kernel's occupancy)")
      ->check(parsed_by<UsageError>([](const std::string& s) { parse_device_model(s); }, "sms=N,blocks_per_sm=M"))
      ->group("executor");
  app.add_option("--capture", o.capture,
                 "lazy: each bucket's graph is captured at its first step; up-front: every bucket's graph at "
                 "construction (the capture statistics then cover all buckets)")
      ->capture_default_str()
      ->check(CLI::IsMember({"lazy", "up-front"}))
      ->group("executor");
  app.add_flag("--plan-only", o.plan_only,
               "print (and with --json write) every bucket's plan for the host model or --device-model, "
               "then exit without allocating caches or running a step")
      ->group("executor");
}

/// The output group; the two negated flags land in `no_progress` and `no_check`.
void add_output_options(CLI::App& app, Options& o, bool& no_progress, bool& no_check) {
  app.add_option("--json", o.json_path, "write everything as JSON (plot it with bench/plot_decode_loop.py)")
      ->group("output");
  app.add_flag("--csv", o.csv, "print the per-band table as CSV on stdout; everything else goes to stderr")
      ->group("output");
  app.add_flag("--no-progress", no_progress, "no progress bar (it is drawn only when stderr is a terminal)")
      ->group("output");
  app.add_option("--seed", o.seed, "random data seed")->capture_default_str()->group("output");
  app.add_flag("--no-check", no_check, "skip the eager-vs-graph output comparison (eager is still timed)")
      ->group("output");
}

}  // namespace

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app(
      "Simulates a decode loop over a paged KV cache and replays each step through the decodegraph\n"
      "Executor, checking it against eager launches and timing both per length band.",
      "decode_loop");
  app.get_formatter()->column_width(34);
  bool no_progress = false, no_check = false;
  std::string q_len, q_lens;
  add_shape_options(app, o);
  add_loop_options(app, o, q_len, q_lens);
  add_executor_options(app, o);
  add_output_options(app, o, no_progress, no_check);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "decode_loop: {}\n(run decode_loop --help for the options)\n", e.what());
    return 2;
  }
  o.progress = !no_progress;
  o.check = !no_check;
  for (const CLI::Option* opt : app.get_options())
    if (opt->count() > 0) o.given.insert(opt->get_name());
  const bool one = o.given.count("--q-len") > 0, list = o.given.count("--q-lens") > 0;
  if (one && list)
    usage_error(fmt::format("--q-len = '{}' and --q-lens = '{}' are both given; allowed: one of them (--q-len N: "
                            "every step N tokens; --q-lens A,B,...: each step one of the list)",
                            q_len, q_lens));
  if (one) o.q_lens = parse_q_lens("--q-len", q_len, /*list=*/false);
  if (list) o.q_lens = parse_q_lens("--q-lens", q_lens, /*list=*/true);
  return std::nullopt;
}

}  // namespace dgloop
