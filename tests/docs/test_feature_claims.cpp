// The docs' feature claims cannot drift from the code (issue 39). docs/features.md holds the one
// table of what is supported: its axes (dtypes, KV cache dtypes, head sizes, block sizes, layouts,
// the q_len range) and which AttentionSpec fields may differ per layer. This test checks that table
// against the code (the constants, and what validate_spec / validate_layer_specs accept), and the
// prose against the table, with a few narrow rules rather than whole sentences:
//  - values: a comma-separated list of >= 3 head sizes, >= 2 block sizes or >= 3 dtypes right
//    after such an axis name ("head_size: 64, 80, ...", "block_size 8, 16, 32"), or after its
//    "allowed: " in a message, must be the table's list; a q_len bound ("q_len 1..N", "kMaxQLen =
//    N") must be kMaxQLen;
//  - per-layer fields: an enumeration after "differ in" / "differ (" of spec field names (or their
//    prose names) must name every per-layer field and no shared one;
//  - negatives: no sentence or table cell of README.md / docs/*.md that says "not implemented",
//    "not supported", "unsupported" or "not there yet", and no cell of a "not supported" column,
//    may name a supported feature, once the table's unsupported phrases are taken out.
// README.md, docs/*.md and the comments of include/decodegraph/*.hpp are read (fenced code blocks
// skipped; headers for the first two rules only). TheCheckersCatchStaleClaims feeds the checkers the
// stale sentences this test was written for, so that it is seen to fail on them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "decodegraph/attention.hpp"
#include "decodegraph/error.hpp"
#include "decodegraph/executor.hpp"
#include "decodegraph/types.hpp"

namespace {

namespace dg = decodegraph;

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t`*");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t`*");
  return s.substr(b, e - b + 1);
}
std::vector<std::string> split(const std::string& s, const std::regex& sep) {
  std::vector<std::string> out;
  for (std::sregex_token_iterator it(s.begin(), s.end(), sep, -1), end; it != end; ++it) out.push_back(*it);
  return out;
}
std::vector<std::string> list_items(const std::string& s) {
  static const std::regex sep(R"(\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+)");
  std::vector<std::string> out;
  for (const std::string& i : split(s, sep))
    if (!trim(i).empty()) out.push_back(trim(i));
  return out;
}

// ---------------------------------------------------------------- the table (docs/features.md)

struct Table {
  std::map<std::string, std::vector<std::string>> axes;  // axis -> values
  std::vector<std::string> per_layer, shared;             // AttentionSpec fields
  std::vector<std::string> names;                         // supported features' names, lower case
  std::vector<std::string> unsupported;                   // phrases, lower case
};

// Rows "| a | b | ..." of the first table after the heading `heading`.
std::vector<std::vector<std::string>> rows_after(const std::string& doc, const std::string& heading, int skip_tables = 0) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream is(doc);
  bool in_section = false, in_table = false;
  int tables = 0;
  for (std::string l; std::getline(is, l);) {
    if (l.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = l == heading;
      continue;
    }
    if (!in_section) continue;
    if (l.rfind("|", 0) != 0) {
      if (in_table && ++tables > skip_tables) break;
      in_table = false;
      continue;
    }
    in_table = true;
    if (tables < skip_tables) continue;
    std::vector<std::string> cells;
    for (const std::string& c : split(l.substr(1), std::regex(R"(\|)"))) cells.push_back(trim(c));
    if (!cells.empty() && cells.back().empty()) cells.pop_back();
    rows.push_back(cells);
  }
  if (rows.size() >= 2) rows.erase(rows.begin(), rows.begin() + 2);  // header and --- row
  return rows;
}

Table parse_table(const std::string& doc) {
  Table t;
  for (const auto& r : rows_after(doc, "## Axes"))
    if (r.size() >= 2) t.axes[r[0]] = list_items(r[1]);
  for (const auto& r : rows_after(doc, "## Per layer")) {
    if (r.size() < 2) continue;
    if (r[0] == "per layer") t.per_layer = list_items(r[1]);
    if (r[0] == "shared") t.shared = list_items(r[1]);
  }
  for (const auto& r : rows_after(doc, "## Features"))
    if (r.size() >= 2)
      for (const std::string& n : list_items(r[1])) t.names.push_back(lower(n));
  for (const auto& r : rows_after(doc, "## Features", 1))
    if (!r.empty()) t.unsupported.push_back(lower(r[0]));
  return t;
}

const Table& table() {
  static const Table t = parse_table(read(std::string(DG_SOURCE_DIR) + "/docs/features.md"));
  return t;
}

// ---------------------------------------------------------------- the code's side

// Every AttentionSpec field by name, with a valid change of it (from the default spec) for the
// per-layer check. The structured binding does not compile when a field is added or removed:
// then sort the new field into docs/features.md's "Per layer" table and give it a change here.
std::map<std::string, std::function<void(dg::AttentionSpec&)>> spec_fields() {
  dg::AttentionSpec probe;
  auto& [num_q_heads, num_kv_heads, head_size, block_size, dtype, layout, scale, kv_dtype, kv_scale_per_head,
         sliding_window, logit_softcap] = probe;
  (void)num_q_heads, (void)num_kv_heads, (void)head_size, (void)block_size, (void)dtype, (void)layout, (void)scale,
      (void)kv_dtype, (void)kv_scale_per_head, (void)sliding_window, (void)logit_softcap;
  using S = dg::AttentionSpec;
  return {
      {"num_q_heads", [](S& s) { s.num_q_heads = 16; }},
      {"num_kv_heads", [](S& s) { s.num_kv_heads = 4; }},
      {"head_size", [](S& s) { s.head_size = 64; }},
      {"block_size", [](S& s) { s.block_size = 32; }},
      {"dtype", [](S& s) { s.dtype = dg::DType::kFloat16; }},
      {"layout", [](S& s) { s.layout = dg::KVLayout::kNHD; }},
      {"scale", [](S& s) { s.scale = 0.1f; }},
      {"kv_dtype", [](S& s) { s.kv_dtype = dg::KVCacheDType::kFp8E4M3; }},
      {"kv_scale_per_head", [](S& s) { s.kv_scale_per_head = true; }},
      {"sliding_window", [](S& s) { s.sliding_window = 128; }},
      {"logit_softcap", [](S& s) { s.logit_softcap = 30.0f; }},
  };
}

bool spec_ok(const dg::AttentionSpec& s) {
  try {
    dg::validate_spec(s);
    return true;
  } catch (const dg::InvalidArgument&) {
    return false;
  }
}

template <class E>
std::vector<std::string> accepted_names(std::function<void(dg::AttentionSpec&, E)> set) {
  std::vector<std::string> out;
  for (int v = 0; v < 16; ++v) {
    dg::AttentionSpec s;
    s.dtype = dg::DType::kFloat16;  // pairs with every kv_dtype
    set(s, static_cast<E>(v));
    if (spec_ok(s)) out.push_back(dg::to_string(static_cast<E>(v)));
  }
  return out;
}

std::vector<std::string> accepted_sizes(std::function<void(dg::AttentionSpec&, int)> set) {
  std::vector<std::string> out;
  for (int v = 1; v <= 1024; ++v) {
    dg::AttentionSpec s;
    set(s, v);
    if (spec_ok(s)) out.push_back(std::to_string(v));
  }
  return out;
}

template <std::size_t N>
std::vector<std::string> names_of(const std::array<int, N>& a) {
  std::vector<std::string> out;
  for (int v : a) out.push_back(std::to_string(v));
  return out;
}

// ---------------------------------------------------------------- the docs' side

struct Finding {
  std::string where, what;
};
struct Text {
  std::string file;
  bool prose = true;  // README / docs: every rule; headers: values and per-layer fields only
  // Paragraphs (lines joined by spaces), table rows kept apart, fenced code skipped; each with the
  // line it starts on. An empty paragraph marks a blank line (the end of a table).
  std::vector<std::pair<int, std::string>> paras;
};

Text markdown(const std::string& file, const std::string& doc) {
  Text t{file, true, {}};
  std::istringstream is(doc);
  bool fence = false;
  std::string para;
  int start = 0, n = 0;
  auto flush = [&] {
    if (!para.empty()) t.paras.emplace_back(start, para);
    para.clear();
  };
  for (std::string l; std::getline(is, l);) {
    ++n;
    if (l.rfind("```", 0) == 0) {
      flush();
      fence = !fence;
      continue;
    }
    if (fence) continue;
    if (trim(l).empty() || l.rfind("|", 0) == 0 || l.rfind("#", 0) == 0) {
      flush();
      t.paras.emplace_back(n, trim(l).empty() ? std::string() : l);
      continue;
    }
    if (para.empty()) start = n;
    para += (para.empty() ? "" : " ") + trim(l);
  }
  flush();
  return t;
}

Text header_comments(const std::string& file, const std::string& src) {
  Text t{file, false, {}};
  std::istringstream is(src);
  std::string para;
  int start = 0, n = 0;
  for (std::string l; std::getline(is, l);) {
    ++n;
    const auto c = l.find("//");
    if (c == std::string::npos) {
      if (!para.empty()) t.paras.emplace_back(start, para);
      para.clear();
      continue;
    }
    std::string body = l.substr(c + 2);
    while (!body.empty() && body[0] == '/') body.erase(0, 1);
    if (para.empty()) start = n;
    para += " " + trim(body);
  }
  if (!para.empty()) t.paras.emplace_back(start, para);
  return t;
}

std::string excerpt(const std::string& s, std::size_t at) {
  const std::size_t b = at > 60 ? at - 60 : 0;
  return "\"..." + s.substr(b, 160) + "...\"";
}

// Rule 1: value lists after an axis name.
void check_values(const Text& t, std::vector<Finding>& out) {
  struct Axis {
    std::regex name;
    std::string axis;
    std::regex item;
    std::size_t min;
  };
  static const std::vector<Axis> axes = {
      {std::regex(R"(head[_ ]sizes?\b)", std::regex::icase), "head_size", std::regex(R"(\d+)"), 3},
      {std::regex(R"(block[_ ]sizes?\b)", std::regex::icase), "block_size", std::regex(R"(\d+)"), 2},
      {std::regex(R"(\b(?:model )?dtypes?\b)", std::regex::icase), "dtype", std::regex(R"(fp16|bf16|fp32)"), 3},
  };
  for (const auto& [line, p] : t.paras)
    for (const Axis& ax : axes) {
      const std::vector<std::string>& want = table().axes.at(ax.axis);
      for (std::sregex_iterator it(p.begin(), p.end(), ax.name), end; it != end; ++it) {
        // The list: a run of comma-separated items right after the name ("head_size: 64, 80, ...",
        // "head sizes 64, 80, ...") or after "allowed: " (a message). A list further on is about
        // something else ("head sizes that are not powers of two (80, 96, 112, 192)").
        const std::size_t from = it->position() + it->length();
        const std::string after = p.substr(from, 120);
        static const std::regex run(R"(^(?:[:=]?\s*|[^;|]*?allowed:\s*)(`?[A-Za-z0-9]+`?(?:\s*,\s*(?:and\s+|or\s+)?`?[A-Za-z0-9]+`?|\s+(?:and|or)\s+`?[A-Za-z0-9]+`?)+))");
        std::smatch m;
        if (!std::regex_search(after, m, run)) continue;
        std::vector<std::string> items;
        for (const std::string& i : list_items(m[1].str()))
          if (std::regex_match(i, ax.item)) items.push_back(i);
          else break;
        if (items.size() < ax.min || m[1].str().find(',') == std::string::npos) continue;
        if (items != want) {
          std::string got;
          for (const std::string& i : items) got += (got.empty() ? "" : ", ") + i;
          out.push_back({t.file + ":" + std::to_string(line),
                         ax.axis + " listed as " + got + ", not docs/features.md's: " + excerpt(p, from)});
        }
      }
    }
  // q_len bounds.
  static const std::regex bound(R"((?:kMaxQLen`?\s*=\s*(?:1\s*\.\.\s*)?|\bq_lens?`?(?: = |\s+)1\.\.)(\d+))");
  const std::string want = table().axes.at("q_len").back();  // "1..16"
  for (const auto& [line, p] : t.paras)
    for (std::sregex_iterator it(p.begin(), p.end(), bound), end; it != end; ++it)
      if ("1.." + (*it)[1].str() != want)
        out.push_back({t.file + ":" + std::to_string(line),
                       "a q_len bound of " + (*it)[1].str() + ", not " + want + ": " + excerpt(p, it->position())});
}

// Rule 2: "differ in" enumerations of spec fields.
std::string field_of(std::string item) {
  item = lower(trim(item));
  for (const char* tail : {" per layer", " per-layer", " per layer group"})
    if (item.size() > std::strlen(tail) && item.compare(item.size() - std::strlen(tail), std::string::npos, tail) == 0)
      item = trim(item.substr(0, item.size() - std::strlen(tail)));
  static const std::map<std::string, std::string> alias = {
      {"heads", "heads"}, {"head counts", "heads"}, {"num_q_heads", "num_q_heads"}, {"query heads", "num_q_heads"},
      {"num_kv_heads", "num_kv_heads"}, {"kv heads", "num_kv_heads"}, {"head_size", "head_size"},
      {"head size", "head_size"}, {"head sizes", "head_size"}, {"scale", "scale"}, {"softmax scale", "scale"},
      {"kv_dtype", "kv_dtype"}, {"kv dtype", "kv_dtype"}, {"kv cache dtype", "kv_dtype"}, {"cache dtype", "kv_dtype"},
      {"kv_scale_per_head", "kv_scale_per_head"}, {"per-head scales", "kv_scale_per_head"},
      {"per-kv-head scales", "kv_scale_per_head"}, {"sliding_window", "sliding_window"}, {"window", "sliding_window"},
      {"sliding window", "sliding_window"}, {"logit_softcap", "logit_softcap"}, {"soft-cap", "logit_softcap"},
      {"softcap", "logit_softcap"}, {"logit soft-cap", "logit_softcap"}, {"block_size", "block_size"},
      {"block size", "block_size"}, {"dtype", "dtype"}, {"layout", "layout"}};
  const auto it = alias.find(item);
  return it == alias.end() ? "" : it->second;
}

void check_per_layer(const Text& t, std::vector<Finding>& out) {
  static const std::regex differ(R"(\bdiffers?(?: from `?spec`?)?(?: only)?(?: in|:| \()\s*(?:`?[A-Za-z_:]+`?:\s*)?)");
  std::set<std::string> per(table().per_layer.begin(), table().per_layer.end());
  for (const auto& [line, p] : t.paras)
    for (std::sregex_iterator it(p.begin(), p.end(), differ), end; it != end; ++it) {
      const std::size_t from = it->position() + it->length();
      const std::size_t stop = std::min(p.find_first_of("();.:", from), p.size());  // the enumeration's clause
      const std::string clause = p.substr(from, stop - from);
      std::set<std::string> fields;
      int n = 0;
      for (const std::string& i : list_items(clause)) {
        const std::string f = field_of(i);
        if (f.empty()) break;
        ++n;
        if (f == "heads") fields.insert({"num_q_heads", "num_kv_heads"});
        else fields.insert(f);
      }
      if (n < 2) continue;
      std::string missing, shared;
      for (const std::string& f : per)
        if (!fields.count(f)) missing += (missing.empty() ? "" : ", ") + f;
      for (const std::string& f : fields)
        if (!per.count(f)) shared += (shared.empty() ? "" : ", ") + f;
      if (!missing.empty() || !shared.empty())
        out.push_back({t.file + ":" + std::to_string(line),
                       "what layers may differ in, listed without " + (missing.empty() ? "-" : missing) +
                           (shared.empty() ? "" : " and with the shared " + shared) + ": " + excerpt(p, from)});
    }
}

// Rule 3: negatives near supported features' names.
std::string named_feature(std::string s) {
  s = lower(s);
  for (const std::string& u : table().unsupported)
    for (std::size_t at; (at = s.find(u)) != std::string::npos;) s.erase(at, u.size());
  for (const std::string& n : table().names)
    if (s.find(n) != std::string::npos) return n;
  return "";
}

void check_negatives(const Text& t, std::vector<Finding>& out) {
  if (!t.prose) return;
  static const std::vector<std::string> negatives = {"not implemented", "not supported", "unsupported", "not there yet"};
  std::vector<std::size_t> not_supported_columns;  // of the current table
  bool in_table = false;
  for (const auto& [line, p] : t.paras) {
    std::vector<std::string> pieces;
    if (p.rfind("|", 0) == 0) {
      const std::vector<std::string> cells = split(p.substr(1), std::regex(R"(\|)"));
      const bool header = !in_table;
      in_table = true;
      if (header) not_supported_columns.clear();
      if (p.find("---") != std::string::npos) continue;
      for (std::size_t c = 0; c < cells.size(); ++c) {
        if (header && lower(cells[c]).find("not supported") != std::string::npos) not_supported_columns.push_back(c);
        else if (std::find(not_supported_columns.begin(), not_supported_columns.end(), c) != not_supported_columns.end()) {
          if (const std::string n = named_feature(cells[c]); !n.empty())
            out.push_back({t.file + ":" + std::to_string(line),
                           "\"" + n + "\" (supported) in a \"not supported\" column: " + excerpt(cells[c], 0)});
        }
        pieces.push_back(cells[c]);
      }
    } else {
      in_table = false;
      pieces = split(p, std::regex(R"([.;!?](?:\s|$))"));
    }
    for (const std::string& s : pieces) {
      const std::string ls = lower(s);
      for (const std::string& neg : negatives)
        if (ls.find(neg) != std::string::npos)
          if (const std::string n = named_feature(s); !n.empty()) {
            out.push_back({t.file + ":" + std::to_string(line),
                           "\"" + n + "\" (supported) next to \"" + neg + "\": " + excerpt(s, 0)});
            break;
          }
    }
  }
}

std::vector<Finding> check(const Text& t) {
  std::vector<Finding> out;
  check_values(t, out);
  check_per_layer(t, out);
  check_negatives(t, out);
  return out;
}

std::string report(const std::vector<Finding>& f) {
  std::string s;
  for (const Finding& x : f) s += "  " + x.where + ": " + x.what + "\n";
  return s;
}

// ---------------------------------------------------------------- tests

TEST(FeatureClaims, TableMatchesTheCode) {
  const Table& t = table();
  ASSERT_EQ(t.axes.size(), 6u) << "docs/features.md's Axes table";
  using dg::AttentionSpec;
  EXPECT_EQ(t.axes.at("dtype"), accepted_names<dg::DType>([](AttentionSpec& s, dg::DType v) {
              s.dtype = v;
            }));
  EXPECT_EQ(t.axes.at("kv_dtype"), accepted_names<dg::KVCacheDType>([](AttentionSpec& s, dg::KVCacheDType v) {
              s.kv_dtype = v;
            }));
  EXPECT_EQ(t.axes.at("layout"), accepted_names<dg::KVLayout>([](AttentionSpec& s, dg::KVLayout v) { s.layout = v; }));
  EXPECT_EQ(t.axes.at("head_size"), names_of(dg::kSupportedHeadSizes));
  EXPECT_EQ(t.axes.at("head_size"), accepted_sizes([](AttentionSpec& s, int v) { s.head_size = v; }));
  EXPECT_EQ(t.axes.at("block_size"), names_of(dg::kSupportedBlockSizes));
  EXPECT_EQ(t.axes.at("block_size"), accepted_sizes([](AttentionSpec& s, int v) { s.block_size = v; }));
  ASSERT_EQ(t.axes.at("q_len").size(), 1u);
  EXPECT_EQ(t.axes.at("q_len")[0], "1.." + std::to_string(dg::kMaxQLen));
  const AttentionSpec spec;
  EXPECT_NO_THROW(dg::v2_workspace_size(spec, 1, 64, 64, dg::kMaxQLen));
  EXPECT_THROW(dg::v2_workspace_size(spec, 1, 64, 64, dg::kMaxQLen + 1), dg::InvalidArgument);

  // Per layer: every field sorted once, and validate_layer_specs agreeing with the sort.
  const auto fields = spec_fields();
  std::set<std::string> sorted;
  for (const std::string& f : t.per_layer) EXPECT_TRUE(sorted.insert(f).second) << f << " listed twice";
  for (const std::string& f : t.shared) EXPECT_TRUE(sorted.insert(f).second) << f << " listed twice";
  std::set<std::string> all;
  for (const auto& [f, change] : fields) all.insert(f);
  EXPECT_EQ(sorted, all) << "docs/features.md's Per layer table must sort every AttentionSpec field";
  for (const std::string& f : t.per_layer) {
    if (!fields.count(f)) continue;
    dg::ExecutorConfig c;
    c.num_layers = 2;
    AttentionSpec other = c.spec;
    fields.at(f)(other);
    ASSERT_NE(other, c.spec) << f;
    c.layer_specs = {c.spec, other};
    try {
      dg::validate_layer_specs(c);
      EXPECT_EQ(dg::layer_groups_of(c), (std::vector<int>{0, 1})) << f;  // two groups
    } catch (const dg::InvalidArgument& e) {
      ADD_FAILURE() << "layer_specs[1] differing in " << f << " (per layer in docs/features.md) was rejected: " << e.what();
    }
  }
  for (const std::string& f : t.shared) {
    if (!fields.count(f)) continue;
    dg::ExecutorConfig c;
    c.num_layers = 2;
    AttentionSpec other = c.spec;
    fields.at(f)(other);
    c.layer_specs = {c.spec, other};
    try {
      dg::validate_layer_specs(c);
      ADD_FAILURE() << "layer_specs[1] differing in " << f << " was accepted";
    } catch (const dg::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("layer_specs[1]." + f), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(t.names.empty());
  EXPECT_FALSE(t.unsupported.empty());
}

TEST(FeatureClaims, DocsAgreeWithTheTable) {
  const std::string root = DG_SOURCE_DIR;
  std::vector<Text> texts = {markdown("README.md", read(root + "/README.md"))};
  std::vector<std::string> docs, headers;
  for (const auto& e : std::filesystem::directory_iterator(root + "/docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path().filename().string());
  for (const auto& e : std::filesystem::directory_iterator(root + "/include/decodegraph"))
    if (e.path().extension() == ".hpp") headers.push_back(e.path().filename().string());
  std::sort(docs.begin(), docs.end());
  std::sort(headers.begin(), headers.end());
  ASSERT_GE(docs.size(), 10u);
  ASSERT_GE(headers.size(), 5u);
  for (const std::string& d : docs) texts.push_back(markdown("docs/" + d, read(root + "/docs/" + d)));
  for (const std::string& h : headers)
    texts.push_back(header_comments("include/decodegraph/" + h, read(root + "/include/decodegraph/" + h)));
  std::vector<Finding> all;
  for (const Text& t : texts)
    for (const Finding& f : check(t)) all.push_back(f);
  EXPECT_TRUE(all.empty()) << all.size() << " claim(s) disagree with docs/features.md (fix the text, or the table and "
                           << "the code together):\n" << report(all);
}

// The checkers fail on the stale claims they were written for (README, executor.md, planning.md,
// integration.md before issue 39) and on a wrong list, and pass their corrections.
TEST(FeatureClaims, TheCheckersCatchStaleClaims) {
  auto findings = [](const std::string& text) { return check(markdown("t.md", text)).size(); };
  EXPECT_EQ(findings("and one graph still holds every layer. Sliding windows, sinks and soft-capping are not "
                     "implemented yet."), 1u);
  EXPECT_EQ(findings("Two call sites (today the layers can differ in `num_q_heads`, `num_kv_heads`, `head_size` "
                     "and `scale`):"), 1u);
  EXPECT_EQ(findings("Today a layer may differ in `num_q_heads`, `num_kv_heads`,\n`head_size` and `scale` (the "
                     "window, soft-cap and KV dtype of the later attention features join\nthem);"), 1u);
  EXPECT_EQ(findings("Layers may differ (`ExecutorConfig::layer_specs`: heads, head size, scale per layer, as Gemma "
                     "4's global and local layers do)"), 1u);
  EXPECT_EQ(findings("| supported | not supported (yet) |\n| --- | --- |\n| one spec for every layer (heads, head "
                     "size, dtype) | per-layer specs |"), 1u);
  EXPECT_EQ(findings("- head_size: 64, 80, 96, 128, 192, 256;"), 1u) << "112 missing";
  EXPECT_EQ(findings("- block_size: 8, 16, 32, 64;"), 1u);
  EXPECT_EQ(findings("`DecodeArgs::q_len` = n, 1 <= n <= `kMaxQLen` = 8"), 1u);
  EXPECT_EQ(findings("the layers may differ in `head_size` and `block_size`."), 1u) << "a shared field";
  // Their corrections, and what may be said.
  EXPECT_EQ(findings("Sliding windows, sinks and soft-capping are implemented per layer."), 0u);
  EXPECT_EQ(findings("A layer may differ in `num_q_heads`, `num_kv_heads`, `head_size`, `scale`, `kv_dtype`, "
                     "`kv_scale_per_head`, `sliding_window` and `logit_softcap`."), 0u);
  EXPECT_EQ(findings("| supported | not supported (yet) |\n| --- | --- |\n| a spec per layer | a block size, dtype or "
                     "layout per layer; fp8 with an fp32 model; tree masks, a different q_len per sequence |"), 0u);
  EXPECT_EQ(findings("- head_size: 64, 80, 96, 112, 128, 192, 256; block_size 8, 16, 32; fp16, bf16 or fp32"), 0u);
  EXPECT_EQ(findings("fuzzed over head sizes 64/80/128; fp8 with an fp32 model is not supported"), 0u);
  EXPECT_EQ(findings("Models whose layers differ (Gemma 4's global layers have fewer, wider KV heads)"), 0u);
  EXPECT_EQ(findings("```\nsinks are not implemented\n```"), 0u) << "code blocks are not prose";
}

}  // namespace
