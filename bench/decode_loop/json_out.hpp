// The JSON pieces both modes write (nlohmann::ordered_json: keys stay in the order written), and the
// writing of the file. The documents themselves are assembled by plan_only.cpp and report.cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decodegraph/decodegraph.hpp"

namespace dgloop {

namespace dg = decodegraph;
using json = nlohmann::ordered_json;

/// A number, or null where there is none (non-finite, or not measured).
json num_or_null(double v, bool present = true);

/// One bucket's plan as structured data (docs/planning.md lists the fields).
json plan_json(const dg::BucketPlan& p);
json plans_json(const std::vector<dg::BucketPlan>& plans);

/// The preset and the shape it resolved to: the first keys of both modes' "config".
json shape_json(const std::string& preset, const dg::AttentionSpec& spec);

json device_model_json(const dg::DeviceModel& d, const std::string& source);

/// Writes `j` to --json's path; a file that cannot be written is a usage error.
void write_json(const std::string& path, const json& j);

}  // namespace dgloop
