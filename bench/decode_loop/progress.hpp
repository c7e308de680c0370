// The progress bar of the run loop.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace dgloop {

/// Drawn on stderr, only when it is a terminal and the run has taken more than a second.
class Progress {
 public:
  Progress(bool enabled, long total) : enabled_(enabled && isatty(2)), total_(total) {}
  void update(long done, const std::string& label) {
    if (!enabled_) return;
    const double t = seconds_since(start_);
    if (t < 1.0 || seconds_since(last_) < 0.1) return;
    last_ = Clock::now();
    const int width = 30;
    const int filled = static_cast<int>(width * done / std::max(1L, total_));
    const double eta = done > 0 ? t * static_cast<double>(total_ - done) / static_cast<double>(done) : 0;
    fmt::print(stderr, "\r[{}{}] {:3}%  step {}/{}  {}  eta {:.0f}s   ", std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(width - filled), ' '), 100 * done / std::max(1L, total_), done,
               total_, label, eta);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) fmt::print(stderr, "\r{:80}\r", "");
    drawn_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  bool enabled_;
  long total_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = Clock::now();
  bool drawn_ = false;
};

}  // namespace dgloop
