// decode_loop's "model us" column (bench/decode_loop/bands.cpp): the planner's one-call predictions,
// interpolated in length and summed over layers. Unit checks on hand-computed values, then a run of
// the program whose JSON is checked against its own plans[] with an interpolation written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "decode_loop/bands.hpp"

namespace {

using dgloop::ModelPoints;

ModelPoints points(int layers, int lo_len, double lo_us, int mid_len, double mid_us, int hi_len, double hi_us) {
  ModelPoints m;
  m.layers = layers;
  m.lo = {lo_len, lo_us, 0};
  m.mid = {mid_len, mid_us, 0};
  m.hi = {hi_len, hi_us, 0};
  return m;
}

// Sums of a few doubles: well inside 1e-12 relative.
constexpr double kTol = 1e-12;

TEST(DecodeLoopModel, InterpolatesBetweenTheThreePoints) {
  const ModelPoints m = points(1, 513, 7.0, 769, 11.0, 1024, 19.5);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 513), 7.0, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 769), 11.0, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 1024), 19.5, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 641), 9.0, kTol);            // halfway lo-mid
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 769 + 51), 11.0 + 1.7, kTol);  // a fifth of mid-hi: 8.5 / 5
  // Outside [lo, hi]: the end's value (a row's mean can sit below band_lo: a band is chosen by the
  // longest sequence).
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 300.5), 7.0, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 5000), 19.5, kTol);
}

TEST(DecodeLoopModel, ASegmentOfOneLengthDoesNotDivideByZero) {
  const ModelPoints m = points(1, 2, 3.0, 2, 3.0, 3, 5.0);  // a band (1, 3]: lo = mid
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 2), 3.0, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 2.5), 4.0, kTol);
  EXPECT_TRUE(std::isfinite(dgloop::interpolate_prediction(points(1, 5, 1.0, 5, 2.0, 5, 4.0), 5)));
}

TEST(DecodeLoopModel, SumsLayersTimesEachGroupsPrediction) {
  // 3 layers of a windowed group (flat), 2 of a global one (rising): 3 x 4.0 + 2 x (10 + 6 x 0.25).
  const std::vector<ModelPoints> model = {points(3, 100, 4.0, 200, 4.0, 300, 4.0),
                                          points(2, 100, 10.0, 200, 16.0, 300, 30.0)};
  EXPECT_NEAR(dgloop::predicted_step_us(model, 125), 3 * 4.0 + 2 * 11.5, kTol);
}

TEST(DecodeLoopModel, TheBreakdownIsInterpolatedLikeTheTotal) {
  // The model's terms (loop, fixed, merge, launch) at each point add up to its us; interpolated the
  // same way, so do the row's: halfway lo-mid, loop 4 + (8 - 4) / 2 = 6, fixed 2, merge 1.5, launch 3.2.
  ModelPoints m = points(2, 513, 10.7, 769, 15.2, 1024, 19.5);
  m.lo.loop_us = 4.0, m.lo.fixed_us = 2.0, m.lo.merge_us = 1.5, m.lo.launch_us = 3.2;
  m.mid.loop_us = 8.0, m.mid.fixed_us = 2.0, m.mid.merge_us = 2.0, m.mid.launch_us = 3.2;
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 641, &decodegraph::PlanPrediction::loop_us), 6.0, kTol);
  EXPECT_NEAR(dgloop::interpolate_prediction(m, 641, &decodegraph::PlanPrediction::merge_us), 1.75, kTol);
  EXPECT_NEAR(dgloop::predicted_step_us({m}, 641, &decodegraph::PlanPrediction::launch_us), 2 * 3.2, kTol);
  EXPECT_NEAR(dgloop::predicted_step_us({m}, 641), 2 * (10.7 + 15.2) / 2, kTol);
}

TEST(DecodeLoopModel, BandRowsUseTheTimedStepsMeanLength) {
  std::vector<dgloop::StepRecord> recs(3);
  const std::vector<ModelPoints> model = {points(2, 1025, 5.0, 1537, 9.0, 2048, 13.0)};
  const double lens[3] = {1100.0, 1281.0, 1793.0};
  const double graph[3] = {500.0, 30.0, 50.0};
  for (int i = 0; i < 3; ++i) {
    recs[i].band = 2;
    recs[i].band_lo = 1024;
    recs[i].band_hi = 2048;
    recs[i].kernel = decodegraph::KernelKind::kV2;
    recs[i].partition_size = 64;
    recs[i].mean_len = lens[i];
    recs[i].graph_us = graph[i];
    recs[i].eager_us = 40;
    recs[i].model = model;
  }
  recs[0].captured = true;  // its graph time is the capture's: neither timed nor in the mean length
  const std::vector<dgloop::BandRow> rows = dgloop::band_rows(recs, 0, 0);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_NEAR(rows[0].predicted_len, (1281.0 + 1793.0) / 2, kTol);  // 1537: the mid point
  EXPECT_NEAR(rows[0].predicted_us, 2 * 9.0, kTol);
  EXPECT_NEAR(rows[0].graph_over_predicted, 40.0 / 18.0, kTol);  // graph p50 of {30, 50}
  const nlohmann::json j = dgloop::bands_json(rows);
  for (const char* key : {"predicted_us", "predicted_len", "graph_over_predicted", "graph_p50_us", "eager_p50_us",
                          "gbs", "band_lo", "band_hi", "kernel", "steps", "timed_steps"})
    EXPECT_TRUE(j[0].contains(key)) << key;
  EXPECT_NEAR(j[0]["predicted_us"].get<double>(), 18.0, kTol);
}

/// One call's prediction of a plans[] entry at `len`: straight lines through lo, mid, hi, the ends'
/// values outside (written here again, from the JSON's numbers, not the program's function).
double one_call(const nlohmann::json& p, double len) {
  const double x[3] = {p["predicted_lo"]["len"].get<double>(), p["predicted_mid"]["len"].get<double>(),
                       p["predicted_hi"]["len"].get<double>()};
  const double y[3] = {p["predicted_lo"]["us"].get<double>(), p["predicted_mid"]["us"].get<double>(),
                       p["predicted_hi"]["us"].get<double>()};
  if (len <= x[0]) return y[0];
  if (len >= x[2]) return y[2];
  const int i = len <= x[1] ? 0 : 1;
  return x[i + 1] == x[i] ? y[i + 1] : y[i] + (y[i + 1] - y[i]) * (len - x[i]) / (x[i + 1] - x[i]);
}

/// Runs decode_loop ARGS --json, returns the document.
nlohmann::json run_json(const std::string& args, const std::string& name) {
  const std::string path = std::string(DG_TEST_TMP) + "/" + name + ".json";
  const std::string cmd = std::string(DG_DECODE_LOOP) + " " + args + " --no-progress --json " + path + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

/// Every band row's predicted_us against sum over layer groups of (its layers) x one_call of the
/// group's plan for the row's band, n and the run's batch bucket.
void check_run(const nlohmann::json& doc, const std::map<int, int>& layers_of_group, int bucket) {
  ASSERT_FALSE(doc["bands"].empty());
  for (const nlohmann::json& b : doc["bands"]) {
    const double len = b["predicted_len"].get<double>();
    EXPECT_GT(len, 0);
    double want = 0;
    int groups_found = 0;
    for (const nlohmann::json& p : doc["plans"]) {
      if (p["band"] != b["band"] || p["q_len"] != b["q_len"] || p["batch"].get<int>() != bucket) continue;
      want += layers_of_group.at(p["group"].get<int>()) * one_call(p, len);
      for (const char* at : {"predicted_lo", "predicted_mid", "predicted_hi"}) {
        const nlohmann::json& x = p[at];
        EXPECT_NEAR(x["loop_us"].get<double>() + x["fixed_us"].get<double>() + x["merge_us"].get<double>() +
                        x["launch_us"].get<double>(),
                    x["us"].get<double>(), 1e-9 * x["us"].get<double>())
            << x.dump();
        EXPECT_GE(x["issue_us"].get<double>(), 0) << x.dump();
      }
      ++groups_found;
    }
    EXPECT_EQ(groups_found, static_cast<int>(layers_of_group.size())) << b.dump();
    EXPECT_NEAR(b["predicted_us"].get<double>(), want, 1e-12 * want) << b.dump();
    // Its breakdown adds up to it (each plan's terms add up to its us at every point).
    const double parts = b["predicted_loop_us"].get<double>() + b["predicted_fixed_us"].get<double>() +
                         b["predicted_merge_us"].get<double>() + b["predicted_launch_us"].get<double>();
    EXPECT_NEAR(parts, want, 1e-9 * want) << b.dump();
    const double ratio = b["graph_p50_us"].get<double>() / want;
    EXPECT_NEAR(b["graph_over_predicted"].get<double>(), ratio, 1e-12 * ratio) << b.dump();
  }
}

TEST(DecodeLoopModel, JsonPredictionIsLayersTimesTheInterpolatedPlan) {
  // 3 layers of one spec, batch 4 (bucket 4), a verify loop of n 1 and 4 across two bands.
  const nlohmann::json doc =
      run_json("--backend host --batch 4 --layers 3 --q-lens 1,4 --steps 9 --start-lens 400:500,1000:1020", "one_group");
  check_run(doc, {{0, 3}}, 4);
}

TEST(DecodeLoopModel, JsonPredictionSumsTheLayerGroups) {
  // gpt-oss-20b: a 128-token window on even layers. 3 layers: group 0 = layers 0 and 2 (windowed),
  // group 1 = layer 1; at ~500-1000 tokens the two groups' predictions differ.
  const nlohmann::json doc =
      run_json("--backend host --preset gpt-oss-20b --batch 2 --layers 3 --steps 6 --start-lens 500:510,1000:1010",
               "two_groups");
  check_run(doc, {{0, 2}, {1, 1}}, 2);
}

}  // namespace
