#pragma once
// Command line of slimserve_quantize_int4.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slimserve/int4/quantize.hpp"

namespace quantize_tool {

enum class OutputFormat { compressed_tensors, gptq_v1, gptq_v2 };
enum class ProgressStyle { automatic, bar, lines, none };

struct Options {
  std::string input, output;  ///< model folders
  OutputFormat format = OutputFormat::compressed_tensors;
  slimserve::int4::QuantizeOptions quantize;
  bool scale_type_given = false;
  /// Layout of 2-D and stacked weights; unset = decided from config.json (see docs/int4.md).
  std::optional<slimserve::int4::WeightLayout> layout;
  std::vector<std::string> targets;  ///< module names or "re:PATTERN"; empty = structure decides
  std::vector<std::string> ignore;   ///< module names or "re:PATTERN" never quantized
  bool quantize_lm_head = false;
  int jobs = 0;  ///< tensors quantized at once; 0 = one per core
  std::uint64_t max_shard_bytes = 5'000'000'000;
  ProgressStyle progress = ProgressStyle::automatic;
  bool measure_error = false;
  bool overwrite = false;
};

/// The --help text.
const char* help_text();

/// Parses argv; returns an error message, or empty on success. `wants_help` is set for
/// -h/--help (then nothing else is checked).
std::string parse_options(int argc, char** argv, Options& options, bool& wants_help);

}  // namespace quantize_tool
