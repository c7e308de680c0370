// decode_loop's command line: the options as given, their parsing (CLI11), and the error a bad one
// raises. What the options mean once the backend is known (defaults, the preset) is setup.hpp's.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "decodegraph/decodegraph.hpp"

namespace dgloop {

namespace dg = decodegraph;

/// The command line. 0 or empty: not given; setup.cpp fills in the backend's defaults.
struct Options {
  std::string preset;
  int q_heads = 0, kv_heads = 0, head_size = 0, block_size = 0;
  std::string dtype, layout;
  std::string kv_dtype;  // vLLM's kv_cache_dtype: auto, fp8, fp8_e4m3, fp8_e5m2
  int batch = 0;
  std::string start_lens;
  int steps = 0;
  int layers = 0;
  /// --q-len N or --q-lens A,B,...: the query tokens per sequence of the steps (speculative decoding's
  /// verify loop); ascending, distinct, each 1..dg::kMaxQLen. {1}: plain decoding (neither given).
  std::vector<int> q_lens = {1};
  std::string backend = "auto";
  std::string partition = "auto";
  int threshold = 8192;
  std::string policy = "auto";
  std::string band_select = "device";
  bool capture_compare = false;
  std::string device_model;  // "sms=N,blocks_per_sm=M"; empty: the backend's (host: an H200 model)
  bool plan_only = false;
  std::string capture = "lazy";  // lazy: a bucket's graph at its first step; up-front: every graph at construction
  int max_seq_len = 0;
  std::string json_path;
  bool csv = false;
  std::uint64_t seed = 1;
  bool check = true;
  bool progress = true;
  /// Options the command line set (long names with dashes); the others are reported as defaults.
  std::set<std::string> given;
};

/// A bad command line: main prints the message and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void usage_error(const std::string& msg);

/// Parses a whole integer of an option's value (no sign, no trailing text) within [lo, hi].
int parse_int_in(const std::string& what, const std::string& v, int lo, int hi);

/// --q-len (`list` false: one value) or --q-lens (a comma-separated list of distinct values), each
/// 1..dg::kMaxQLen; returned ascending.
std::vector<int> parse_q_lens(const std::string& option, const std::string& text, bool list);

/// --device-model "sms=N,blocks_per_sm=M": fields left out stay 0 (the backend's value).
dg::DeviceModel parse_device_model(const std::string& text);

/// Parses the command line into `o`. Returns the exit status when the program should stop here
/// (--help: 0, a parse error: 2, its message printed).
std::optional<int> parse_options(int argc, char** argv, Options& o);

}  // namespace dgloop
