#pragma once
/// \file
/// \brief Reader and writer for the .safetensors format (checkpoints in, quantized weights out).
///
/// Format: an 8-byte little-endian header length H, then H bytes of UTF-8 JSON, then the raw
/// tensor bytes. The JSON maps each tensor name to {"dtype", "shape", "data_offsets":
/// [begin, end]} (offsets relative to the byte after the header) and may hold
/// "__metadata__": {string: string}. The reader rejects (StatusCode::data_loss) anything
/// inconsistent: a header running past the file, malformed or duplicate JSON keys, unknown
/// dtypes, negative or non-integer shapes, a byte range that does not match shape x dtype,
/// ranges outside the data, overlapping, or leaving holes (the format requires the data
/// section to be covered exactly).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// A parsed .safetensors file held in memory. Views returned by `tensor` point into it.
class SafetensorsFile {
 public:
  struct Entry {
    std::string name;
    ElementType type = ElementType::float32;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;  ///< byte range inside the data section
  };

  /// Reads and validates a whole file (io_error when it cannot be read).
  static Result<SafetensorsFile> read(const std::string& path);
  /// Validates an in-memory image of a file.
  static Result<SafetensorsFile> parse(std::vector<std::byte> file_bytes);

  /// Tensors in data order.
  const std::vector<Entry>& entries() const noexcept { return entries_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  bool contains(std::string_view name) const;
  /// The named tensor; out_of_range when absent.
  Result<TensorView> tensor(std::string_view name) const;

 private:
  std::vector<std::byte> bytes_;
  std::size_t data_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Collects tensors (copied) and metadata, then serializes them as .safetensors. Tensors are
/// laid out in the order they were added; the header is padded with spaces to a multiple of
/// 8 bytes so the data section starts aligned.
class SafetensorsWriter {
 public:
  /// invalid_argument for an empty or duplicate name, the reserved name "__metadata__", or a
  /// byte count that does not match shape x dtype.
  Status add(std::string name, const TensorView& tensor);
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  std::vector<std::byte> serialize() const;
  Status write(const std::string& path) const;  ///< io_error on failure

 private:
  struct Pending {
    std::string name;
    ElementType type;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace int4
SLIMSERVE_NAMESPACE_END
