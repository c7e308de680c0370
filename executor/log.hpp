// The executor's logger (internal): one spdlog logger named "decodegraph" on stderr, shared by every
// executor in the process, and the level each Executor sets on it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace decodegraph::detail {

/// The shared logger with its level set: `config_level` (ExecutorConfig::log_level) when non-empty,
/// else DECODEGRAPH_LOG_LEVEL (an unknown value warns once per value and keeps warn), else warn.
/// Throws InvalidArgument for an unknown `config_level`: that one is the caller's own argument.
std::shared_ptr<spdlog::logger> executor_logger(const std::string& config_level);

/// "12.34 MiB", for log lines.
std::string mib(std::size_t bytes);
/// A pointer as printf's %p writes it, for error messages.
std::string ptr_text(const void* p);

}  // namespace decodegraph::detail
