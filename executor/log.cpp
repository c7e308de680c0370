// The executor's logger and its level (log.hpp).
#include "executor/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "decodegraph/error.hpp"

namespace decodegraph::detail {
namespace {

std::shared_ptr<spdlog::logger> shared_logger() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("decodegraph")) return existing;
    try {
      return spdlog::stderr_color_mt("decodegraph");
    } catch (const spdlog::spdlog_ex&) {  // registered concurrently by someone else
      return spdlog::get("decodegraph");
    }
  }();
  return logger;
}

constexpr const char* kLevelNames = "trace, debug, info, warn, err, critical, off (any case)";

/// A log level name in any case ("warning" and "error" too); nullopt for anything else.
std::optional<spdlog::level::level_enum> parse_level(std::string name) {
  using spdlog::level::level_enum;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::pair<const char*, level_enum> kNames[] = {
      {"trace", level_enum::trace}, {"debug", level_enum::debug},       {"info", level_enum::info},
      {"warn", level_enum::warn},   {"warning", level_enum::warn},      {"err", level_enum::err},
      {"error", level_enum::err},   {"critical", level_enum::critical}, {"off", level_enum::off}};
  for (const auto& [n, lvl] : kNames)
    if (name == n) return lvl;
  return std::nullopt;
}

/// A bad DECODEGRAPH_LOG_LEVEL is the environment's mistake, not the caller's: warn once per
/// distinct value (not once per Executor) and keep the default.
void warn_bad_env_level(spdlog::logger& log, const std::string& value) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(value).second) return;
  }
  log.warn("DECODEGRAPH_LOG_LEVEL = \"{}\" is not a log level (allowed: {}); using the default, warn",
           value, kLevelNames);
}

}  // namespace

std::shared_ptr<spdlog::logger> executor_logger(const std::string& config_level) {
  std::shared_ptr<spdlog::logger> log = shared_logger();
  if (!config_level.empty()) {
    const auto level = parse_level(config_level);
    if (!level) throw_invalid("log_level", config_level, kLevelNames);
    log->set_level(*level);
  } else if (const char* env = std::getenv("DECODEGRAPH_LOG_LEVEL"); env && *env) {
    const auto level = parse_level(env);
    log->set_level(level.value_or(spdlog::level::warn));
    if (!level) warn_bad_env_level(*log, env);
  } else {
    log->set_level(spdlog::level::warn);
  }
  return log;
}

std::string mib(std::size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::string ptr_text(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace decodegraph::detail
