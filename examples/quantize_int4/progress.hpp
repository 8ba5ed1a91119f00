#pragma once
// Progress display: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "options.hpp"

namespace quantize_tool {

class Progress {
 public:
  /// Starts a reporter thread (none for ProgressStyle::none). Writes to stderr.
  Progress(ProgressStyle style, std::size_t total_units, std::uint64_t total_bytes);
  ~Progress();  ///< stops the reporter and prints the final state
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(std::uint64_t bytes, std::size_t units);

 private:
  void report(bool final);
  bool bar_ = false, enabled_ = true;
  std::size_t total_units_;
  std::uint64_t total_bytes_;
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::size_t> units_{0};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread reporter_;
};

}  // namespace quantize_tool
