#pragma once
// One unit of work: read one tensor (or one expert of a stacked tensor), turn it into the
// output format, write it to its place in the output shards.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model_folder.hpp"
#include "options.hpp"
#include "plan.hpp"

namespace quantize_tool {

/// The output shards, each opened with its final header; any thread writes any tensor.
class OutputShards {
 public:
  /// Splits `outputs` into shards of at most `max_bytes` (a larger tensor gets its own) and
  /// creates them in `folder`: model.safetensors, or model-0000i-of-0000n.safetensors.
  static slimserve::Result<std::unique_ptr<OutputShards>> create(
      const std::string& folder, const std::vector<slimserve::int4::SafetensorsStreamWriter::Planned>& outputs,
      std::uint64_t max_bytes);
  slimserve::Status write(const std::string& name, std::span<const std::byte> bytes, std::uint64_t offset = 0);
  slimserve::Status finish();
  /// tensor -> shard file, for model.safetensors.index.json (empty for a single shard).
  std::map<std::string, std::string> weight_map() const;
  std::uint64_t total_tensor_bytes() const { return total_bytes_; }

 private:
  std::vector<std::unique_ptr<slimserve::int4::SafetensorsStreamWriter>> shards_;
  std::vector<std::string> files_;
  std::map<std::string, std::size_t> shard_of_;
  std::uint64_t total_bytes_ = 0;
};

struct ErrorStats {
  std::mutex mutex;
  double sum_relative = 0.0, max_relative = 0.0;
  std::size_t count = 0;
};

/// Runs `unit` (for a stacked unit, only expert `expert`); `threads` is the quantizer's
/// thread count for this piece of work.
slimserve::Status run_unit(const ModelFolder& model, const Options& options, const Unit& unit, std::int64_t expert,
                           int threads, OutputShards& out, ErrorStats* errors);

}  // namespace quantize_tool
