// The docs' decode_loop samples cannot drift from the program: every fenced block of README.md and
// docs/benchmarks.md whose first line is "$ build/bench/decode_loop ARGS" is compared with what
// decode_loop ARGS prints now (stdout; the run is deterministic on the host backend, so the samples
// say --backend host). Timing fields are masked on both sides (every decimal number in the per-band
// rows, the capture lines and tables, and the wall time) and runs of spaces compared as one. In a
// sample, a line "..." stands for any number of lines, and a line ending in "..." for any line that
// starts with what precedes it. On a mismatch the test prints the program's whole output, to paste.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Sample {
  std::string args;                // after "$ build/bench/decode_loop"
  std::vector<std::string> lines;  // the block's lines after the command
  int line_no = 0;                 // of the command in the doc
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

std::vector<Sample> samples_in(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<std::string> doc = split_lines(ss.str());
  const std::string cmd = "$ build/bench/decode_loop";
  std::vector<Sample> out;
  for (std::size_t i = 0; i + 1 < doc.size(); ++i) {
    if (doc[i].rfind("```", 0) != 0 || doc[i + 1].rfind(cmd, 0) != 0) continue;
    Sample s;
    s.args = doc[i + 1].substr(cmd.size());
    s.line_no = static_cast<int>(i) + 2;
    std::size_t j = i + 2;
    for (; j < doc.size() && doc[j].rfind("```", 0) != 0; ++j) s.lines.push_back(doc[j]);
    out.push_back(s);
    i = j;
  }
  return out;
}

/// Timing fields -> "#", then runs of spaces -> one, trailing spaces dropped.
std::string masked(const std::string& line) {
  // The per-band and captured-graph tables have an n column in a verify loop (--q-len, --q-lens).
  static const std::regex band_row(R"(^\(\d+, \d+\]\s+(\d+\s+)?v[12]\s)");       // per-band table
  static const std::regex graph_row(R"(^\d+\s+\d+\s+(\d+\s+)?\(\d+, \d+\]\s)");  // captured graphs
  static const std::regex cost_row(R"(^(host|device)\s+\d+\s+\d+\s+\d+\s)");  // capture cost, both modes
  static const std::regex number(R"(\d+\.\d+)");
  static const std::regex spaces(" +");
  std::string l = line;
  const bool timing = std::regex_search(l, band_row) || std::regex_search(l, graph_row) ||
                      std::regex_search(l, cost_row) || l.rfind("captures:", 0) == 0 ||
                      l.rfind("wall time of the loop:", 0) == 0;
  if (timing) l = std::regex_replace(l, number, "#");
  l = std::regex_replace(l, spaces, " ");
  while (!l.empty() && l.back() == ' ') l.pop_back();
  return l;
}

std::string run_decode_loop(const std::string& args, int& status) {
  const std::string cmd = std::string(DG_DECODE_LOOP) + args + " --no-progress 2>/dev/null";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    status = -1;
    return out;
  }
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  status = pclose(p);
  return out;
}

/// Whether `got` (the program's lines, masked) holds the sample's lines in order, "..." lines
/// skipping any number; returns the first sample line that could not be matched, or -1.
int first_unmatched(const std::vector<std::string>& want, const std::vector<std::string>& got) {
  std::size_t g = 0;
  bool skipping = false;
  for (std::size_t w = 0; w < want.size(); ++w) {
    const std::string m = masked(want[w]);
    if (m == "...") {
      skipping = true;
      continue;
    }
    const bool prefix = m.size() > 3 && m.compare(m.size() - 3, 3, "...") == 0;
    const std::string stem = prefix ? masked(m.substr(0, m.size() - 3)) : m;
    auto matches = [&](const std::string& line) { return prefix ? line.rfind(stem, 0) == 0 : line == stem; };
    if (skipping) {
      while (g < got.size() && !matches(got[g])) ++g;
      skipping = false;
    }
    if (g >= got.size() || !matches(got[g])) return static_cast<int>(w);
    ++g;
  }
  return -1;
}

void check_doc(const std::string& rel) {
  const std::vector<Sample> samples = samples_in(std::string(DG_SOURCE_DIR) + "/" + rel);
  ASSERT_FALSE(samples.empty()) << rel << " has no \"$ build/bench/decode_loop\" sample";
  std::map<std::string, std::vector<std::string>> runs;  // one run per distinct command
  for (const Sample& s : samples) {
    SCOPED_TRACE(rel + ":" + std::to_string(s.line_no) + ": decode_loop" + s.args);
    auto it = runs.find(s.args);
    if (it == runs.end()) {
      int status = 0;
      const std::string out = run_decode_loop(s.args, status);
      ASSERT_EQ(status, 0) << "decode_loop" << s.args << " failed:\n" << out;
      std::vector<std::string> got;
      for (const std::string& l : split_lines(out)) got.push_back(masked(l));
      it = runs.emplace(s.args, got).first;
      it->second.push_back(out);  // last element: the raw output, for the failure message
    }
    std::vector<std::string> got = it->second;
    const std::string raw = got.back();
    got.pop_back();
    const int bad = first_unmatched(s.lines, got);
    EXPECT_EQ(bad, -1) << "sample line " << (bad < 0 ? 0 : s.line_no + bad) << " of " << rel
                       << " does not match the program's output:\n  " << (bad < 0 ? "" : s.lines[bad])
                       << "\nThe program now prints (paste the parts the sample shows):\n" << raw;
  }
}

TEST(DocSamples, ReadmeMatchesDecodeLoop) { check_doc("README.md"); }
TEST(DocSamples, BenchmarksMdMatchesDecodeLoop) { check_doc("docs/benchmarks.md"); }

// The matcher itself: masking, "..." lines and prefixes, and that a changed field is caught.
TEST(DocSamples, TheMatcherCatchesADifference) {
  const std::vector<std::string> out = {"a", "(0, 512]   v2  256  32 (31)   1034.5   7920.8  0.96x  1.8  n/a", "b",
                                        "c 17 slots; more", "wall time of the loop: 7.5 s"};
  std::vector<std::string> got;
  for (const std::string& l : out) got.push_back(masked(l));
  EXPECT_EQ(first_unmatched({"a", "(0, 512] v2 256 32 (31) 1.0 2.0 1.00x 9.9 n/a", "...", "c 17 slots; ...",
                             "wall time of the loop: 1.0 s"},
                            got),
            -1);
  EXPECT_EQ(first_unmatched({"a", "(0, 512] v2 128 32 (31) 1.0 2.0 1.00x 9.9 n/a"}, got), 1) << "P differs";
  EXPECT_EQ(first_unmatched({"a", "...", "c 18 slots; ..."}, got), 2) << "a count differs";
  EXPECT_EQ(first_unmatched({"b"}, got), 0) << "lines must be in order, no skipping without ...";
  // A verify loop's rows (an n column) are masked too, and their other fields still compared.
  const std::vector<std::string> n_rows = {masked("(512, 1024]  4  v2   64  12  2418.4  4825.7  2432.7  4777.8  0.99x  1.4  n/a  n/a"),
                                           masked("5  4  4  (0, 2048]  3  switch, 3 branches  1  14  18  0.01  0.00  0.00")};
  EXPECT_EQ(first_unmatched({"(512, 1024] 4 v2 64 12 1.0 2.0 3.0 4.0 1.00x 9.9 n/a n/a",
                             "5 4 4 (0, 2048] 3 switch, 3 branches 1 14 18 9.99 9.99 9.99"},
                            n_rows),
            -1);
  EXPECT_EQ(first_unmatched({"(512, 1024] 1 v2 64 12 1.0 2.0 3.0 4.0 1.00x 9.9 n/a n/a"}, n_rows), 0) << "n differs";
}

}  // namespace
