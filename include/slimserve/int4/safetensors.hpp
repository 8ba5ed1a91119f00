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
#include <memory>
#include <mutex>
#include <span>
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


/// Reads only the header of a .safetensors file and the tensors asked for, with positioned
/// reads (pread), so a checkpoint of any size streams through memory one tensor (or one part
/// of a tensor, such as one expert of a stacked MoE weight) at a time. The header is checked
/// exactly as `SafetensorsFile::parse` checks it. Safe to read from several threads at once.
class SafetensorsReader {
 public:
  using Entry = SafetensorsFile::Entry;

  /// io_error when the file cannot be opened; data_loss for anything the format forbids.
  static Result<SafetensorsReader> open(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  const std::vector<Entry>& entries() const noexcept { return entries_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// The entry with this name, or nullptr.
  const Entry* find(std::string_view name) const;

  /// The whole tensor, copied into memory.
  Result<Tensor> read(const Entry& entry) const;
  /// Bytes [offset, offset + out.size()) of the tensor into `out` (out_of_range past its end).
  Status read_bytes(const Entry& entry, std::uint64_t offset, std::span<std::byte> out) const;

 private:
  struct Descriptor;
  std::shared_ptr<Descriptor> file_;
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Writes a .safetensors file whose tensors (names, dtypes, shapes) are known before any data:
/// the header is written first, then each tensor's bytes go straight to their place in the
/// file (pwrite), from any thread and in any order, so nothing is buffered beyond what the
/// caller holds. `finish` checks that every byte was written exactly once and closes the file.
class SafetensorsStreamWriter {
 public:
  struct Planned {
    std::string name;
    ElementType type = ElementType::float32;
    std::vector<std::int64_t> shape;
    std::uint64_t bytes() const { return static_cast<std::uint64_t>(element_count(shape)) * element_size(type); }
  };

  /// Creates (truncates) `path` and writes the header. invalid_argument for an empty,
  /// reserved or repeated name or a negative extent; io_error when the file cannot be written.
  static Result<SafetensorsStreamWriter> create(const std::string& path, std::vector<Planned> tensors,
                                                const std::map<std::string, std::string>& metadata);

  /// Writes `bytes` at `offset` inside the named tensor. invalid_argument for an unknown name
  /// or a range past the tensor's end; io_error when the write fails.
  Status write(std::string_view name, std::span<const std::byte> bytes, std::uint64_t offset = 0);
  /// failed_precondition when some tensor is not completely written; io_error on close.
  Status finish();

  /// Total size of the file (header included).
  std::uint64_t file_bytes() const noexcept { return data_start_ + data_bytes_; }

 private:
  struct Descriptor;
  struct Slot {
    Planned tensor;
    std::uint64_t begin = 0;
    std::uint64_t written = 0;
  };
  std::shared_ptr<Descriptor> file_;
  std::string path_;
  std::uint64_t data_start_ = 0, data_bytes_ = 0;
  std::vector<Slot> slots_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::shared_ptr<std::mutex> mutex_;  ///< guards `written`
};

}  // namespace int4
SLIMSERVE_NAMESPACE_END
