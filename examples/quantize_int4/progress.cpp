#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace quantize_tool {

Progress::Progress(ProgressStyle style, std::size_t total_units, std::uint64_t total_bytes)
    : total_units_(total_units), total_bytes_(total_bytes) {
  bar_ = style == ProgressStyle::bar || (style == ProgressStyle::automatic && ::isatty(STDERR_FILENO) == 1);
  enabled_ = style != ProgressStyle::none;
  if (!enabled_) return;
  reporter_ = std::thread([this] {
    // A bar is redrawn twice a second; plain lines are spaced out so logs stay short.
    const auto period = bar_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(5000);
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stop_; })) report(false);
  });
}

Progress::~Progress() {
  if (!enabled_) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  reporter_.join();
  report(true);
}

void Progress::add(std::uint64_t bytes, std::size_t units) {
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  units_.fetch_add(units, std::memory_order_relaxed);
}

void Progress::report(bool final) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const auto bytes = bytes_.load(std::memory_order_relaxed);
  const auto units = units_.load(std::memory_order_relaxed);
  const double rate = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
  const double fraction = total_bytes_ ? static_cast<double>(bytes) / static_cast<double>(total_bytes_) : 1.0;
  const double eta = rate > 0 ? static_cast<double>(total_bytes_ - bytes) / rate : 0.0;
  char text[160];
  std::snprintf(text, sizeof text, "%zu/%zu tensors  %.2f/%.2f GB  %.2f GB/s  %s %.0f s", units, total_units_,
                static_cast<double>(bytes) / 1e9, static_cast<double>(total_bytes_) / 1e9, rate / 1e9,
                final ? "took" : "ETA", final ? seconds : eta);
  if (bar_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r[%s] %3.0f%%  %s\033[K%s", bar.c_str(), fraction * 100.0, text, final ? "\n" : "");
  } else {
    std::fprintf(stderr, "progress: %3.0f%%  %s\n", fraction * 100.0, text);
  }
  std::fflush(stderr);
}

}  // namespace quantize_tool
