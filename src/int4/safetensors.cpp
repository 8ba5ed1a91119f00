// .safetensors reader/writer. The header is parsed with nlohmann::json without exceptions
// (allow_exceptions = false); a parser callback catches duplicate top-level keys, which
// nlohmann would otherwise resolve silently (last one wins).

#include "slimserve/int4/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit (100 MB)

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<std::uint64_t>(p[i]);
  return value;
}

/// A JSON value that must be a non-negative integer.
bool as_unsigned(const nlohmann::json& value, std::uint64_t& out) {
  if (!value.is_number_unsigned()) return false;
  out = value.get<std::uint64_t>();
  return true;
}

Status parse_entry(const std::string& name, const nlohmann::json& info, std::uint64_t data_bytes,
                   SafetensorsFile::Entry& entry) {
  if (!info.is_object()) return make_status(StatusCode::data_loss, "safetensors entry '", name, "' is not an object");
  const auto dtype = info.find("dtype");
  const auto shape = info.find("shape");
  const auto offsets = info.find("data_offsets");
  if (dtype == info.end() || shape == info.end() || offsets == info.end() || info.size() != 3) {
    return make_status(StatusCode::data_loss, "safetensors entry '", name,
                       "' must hold exactly dtype, shape and data_offsets");
  }
  if (!dtype->is_string()) return make_status(StatusCode::data_loss, "safetensors entry '", name, "': dtype is not a string");
  const auto type = element_type_from_safetensors_name(dtype->get<std::string>());
  if (!type) {
    return make_status(StatusCode::data_loss, "safetensors entry '", name, "': unknown dtype '",
                       dtype->get<std::string>(), "'");
  }
  entry.name = name;
  entry.type = *type;
  if (!shape->is_array()) return make_status(StatusCode::data_loss, "safetensors entry '", name, "': shape is not an array");
  std::uint64_t bytes = element_size(*type);
  for (const auto& extent : *shape) {
    std::uint64_t value = 0;
    if (!as_unsigned(extent, value) || value > static_cast<std::uint64_t>(INT64_MAX)) {
      return make_status(StatusCode::data_loss, "safetensors entry '", name, "': shape ", shape->dump(),
                         " has an entry that is not a non-negative integer");
    }
    if (__builtin_mul_overflow(bytes, value, &bytes)) {
      return make_status(StatusCode::data_loss, "safetensors entry '", name, "': shape ", shape->dump(), " overflows");
    }
    entry.shape.push_back(static_cast<std::int64_t>(value));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !as_unsigned((*offsets)[0], entry.begin) ||
      !as_unsigned((*offsets)[1], entry.end)) {
    return make_status(StatusCode::data_loss, "safetensors entry '", name, "': data_offsets ", offsets->dump(),
                       " is not [begin, end]");
  }
  if (entry.begin > entry.end || entry.end > data_bytes) {
    return make_status(StatusCode::data_loss, "safetensors entry '", name, "': data_offsets [", entry.begin, ", ",
                       entry.end, "] outside the ", data_bytes, "-byte data section");
  }
  if (entry.end - entry.begin != bytes) {
    return make_status(StatusCode::data_loss, "safetensors entry '", name, "': ", entry.end - entry.begin,
                       " bytes for ", safetensors_name(*type), " shape ", shape->dump(), " (needs ", bytes, ")");
  }
  return Status::success();
}


/// Parses and checks a header: entries sorted by offset, covering the data section exactly.
Status parse_header(std::string_view header, std::uint64_t data_bytes, std::vector<SafetensorsFile::Entry>& entries,
                    std::map<std::string, std::string>& metadata) {
  if (header.empty() || header.front() != '{') {
    return make_status(StatusCode::data_loss, "safetensors header does not start with '{'");
  }
  // Duplicate top-level keys: nlohmann keeps the last silently, so watch the key events.
  std::set<std::string> seen;
  std::string duplicate;
  const nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                         nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty()) duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const nlohmann::json json = nlohmann::json::parse(header.begin(), header.end(), on_event, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return make_status(StatusCode::data_loss, "safetensors header is not a JSON object");
  }
  if (!duplicate.empty()) return make_status(StatusCode::data_loss, "safetensors header repeats the key '", duplicate, "'");

  for (const auto& [name, info] : json.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) return make_status(StatusCode::data_loss, "safetensors __metadata__ is not an object");
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          return make_status(StatusCode::data_loss, "safetensors __metadata__ value for '", key, "' is not a string");
        }
        metadata[key] = value.get<std::string>();
      }
      continue;
    }
    SafetensorsFile::Entry entry;
    SLIMSERVE_RETURN_IF_ERROR(parse_entry(name, info, data_bytes, entry));
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const SafetensorsFile::Entry& a, const SafetensorsFile::Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (const auto& entry : entries) {
    if (entry.begin != covered) {
      return make_status(StatusCode::data_loss, "safetensors tensor '", entry.name, "' starts at byte ", entry.begin,
                         entry.begin < covered ? " inside the previous tensor" : " leaving a hole", " (expected ",
                         covered, ")");
    }
    covered = entry.end;
  }
  if (covered != data_bytes) {
    return make_status(StatusCode::data_loss, "safetensors data section has ", data_bytes, " bytes, tensors cover ",
                       covered);
  }
  return Status::success();
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return make_status(StatusCode::io_error, "cannot open '", path, "'");
  const std::streamoff size = in.tellg();
  if (size < 0) return make_status(StatusCode::io_error, "cannot size '", path, "'");
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    return make_status(StatusCode::io_error, "cannot read ", size, " bytes from '", path, "'");
  }
  auto parsed = parse(std::move(bytes));
  if (!parsed.ok()) return Status(parsed.status().code(), "'" + path + "': " + std::string(parsed.status().message()));
  return parsed;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::vector<std::byte> file_bytes) {
  if (file_bytes.size() < 8) {
    return make_status(StatusCode::data_loss, "safetensors file has ", file_bytes.size(),
                       " bytes, fewer than its 8-byte header length");
  }
  const std::uint64_t header_bytes = read_le64(file_bytes.data());
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes.size() - 8) {
    return make_status(StatusCode::data_loss, "safetensors header length ", header_bytes, " exceeds the file (",
                       file_bytes.size() - 8, " bytes after the length)");
  }
  const auto* header_begin = reinterpret_cast<const char*>(file_bytes.data() + 8);
  SafetensorsFile file;
  file.data_start_ = static_cast<std::size_t>(8 + header_bytes);
  SLIMSERVE_RETURN_IF_ERROR(parse_header(std::string_view(header_begin, static_cast<std::size_t>(header_bytes)),
                                         file_bytes.size() - file.data_start_, file.entries_, file.metadata_));
  file.bytes_ = std::move(file_bytes);
  return file;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

Result<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) {
      const std::byte* data = bytes_.data() + data_start_ + entry.begin;
      return TensorView{entry.type, entry.shape,
                        std::span<const std::byte>(data, static_cast<std::size_t>(entry.end - entry.begin))};
    }
  }
  return make_status(StatusCode::out_of_range, "no tensor named '", name, "'");
}

Status SafetensorsWriter::add(std::string name, const TensorView& tensor) {
  if (name.empty() || name == "__metadata__") {
    return make_status(StatusCode::invalid_argument, "tensor name '", name, "' is reserved or empty");
  }
  for (const Pending& pending : tensors_) {
    if (pending.name == name) return make_status(StatusCode::invalid_argument, "tensor '", name, "' added twice");
  }
  for (auto extent : tensor.shape) {
    if (extent < 0) return make_status(StatusCode::invalid_argument, "tensor '", name, "' has a negative extent");
  }
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * element_size(tensor.type);
  if (tensor.bytes.size() != bytes) {
    return make_status(StatusCode::invalid_argument, "tensor '", name, "' holds ", tensor.bytes.size(),
                       " bytes, its shape needs ", bytes);
  }
  tensors_.push_back({std::move(name), tensor.type, tensor.shape, {tensor.bytes.begin(), tensor.bytes.end()}});
  return Status::success();
}

std::vector<std::byte> SafetensorsWriter::serialize() const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::uint64_t offset = 0;
  for (const Pending& t : tensors_) {
    header[t.name] = {{"dtype", std::string(safetensors_name(t.type))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size() + offset);
  std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((length >> (8 * i)) & 0xFFu);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t cursor = 8 + text.size();
  for (const Pending& t : tensors_) {
    if (!t.bytes.empty()) std::memcpy(out.data() + cursor, t.bytes.data(), t.bytes.size());
    cursor += t.bytes.size();
  }
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const {
  const std::vector<std::byte> bytes = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_status(StatusCode::io_error, "cannot create '", path, "'");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return make_status(StatusCode::io_error, "cannot write ", bytes.size(), " bytes to '", path, "'");
  return Status::success();
}


// --- streaming reader / writer --------------------------------------------------------------

/// An open file descriptor, closed when the last reader or writer sharing it goes away.
struct SafetensorsReader::Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};
struct SafetensorsStreamWriter::Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

/// pread until `out` is full (short reads are legal); false on error or end of file.
bool read_fully(int fd, std::uint64_t offset, std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<std::size_t>(got);
  }
  return true;
}

bool write_fully(int fd, std::uint64_t offset, std::span<const std::byte> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t put = ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    done += static_cast<std::size_t>(put);
  }
  return true;
}

}  // namespace

Result<SafetensorsReader> SafetensorsReader::open(const std::string& path) {
  SafetensorsReader reader;
  reader.path_ = path;
  reader.file_ = std::make_shared<Descriptor>();
  reader.file_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (reader.file_->fd < 0) return make_status(StatusCode::io_error, "cannot open '", path, "'");
  const off_t size = ::lseek(reader.file_->fd, 0, SEEK_END);
  if (size < 0) return make_status(StatusCode::io_error, "cannot size '", path, "'");
  const auto file_bytes = static_cast<std::uint64_t>(size);
  std::byte length[8];
  if (file_bytes < 8 || !read_fully(reader.file_->fd, 0, length)) {
    return make_status(StatusCode::data_loss, "'", path, "': safetensors file has ", file_bytes,
                       " bytes, fewer than its 8-byte header length");
  }
  const std::uint64_t header_bytes = read_le64(length);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return make_status(StatusCode::data_loss, "'", path, "': safetensors header length ", header_bytes,
                       " exceeds the file (", file_bytes - 8, " bytes after the length)");
  }
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  if (!read_fully(reader.file_->fd, 8, std::as_writable_bytes(std::span<char>(header)))) {
    return make_status(StatusCode::io_error, "cannot read the header of '", path, "'");
  }
  reader.data_start_ = 8 + header_bytes;
  if (Status status = parse_header(header, file_bytes - reader.data_start_, reader.entries_, reader.metadata_);
      !status.ok()) {
    return Status(status.code(), "'" + path + "': " + std::string(status.message()));
  }
  return reader;
}

const SafetensorsReader::Entry* SafetensorsReader::find(std::string_view name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

Status SafetensorsReader::read_bytes(const Entry& entry, std::uint64_t offset, std::span<std::byte> out) const {
  const std::uint64_t size = entry.end - entry.begin;
  if (offset > size || out.size() > size - offset) {
    return make_status(StatusCode::out_of_range, "'", path_, "': bytes [", offset, ", ", offset + out.size(),
                       ") outside tensor '", entry.name, "' (", size, " bytes)");
  }
  if (!read_fully(file_->fd, data_start_ + entry.begin + offset, out)) {
    return make_status(StatusCode::io_error, "'", path_, "': cannot read tensor '", entry.name, "'");
  }
  return Status::success();
}

Result<Tensor> SafetensorsReader::read(const Entry& entry) const {
  Tensor tensor(entry.type, entry.shape);
  SLIMSERVE_RETURN_IF_ERROR(read_bytes(entry, 0, tensor.bytes));
  return tensor;
}

Result<SafetensorsStreamWriter> SafetensorsStreamWriter::create(const std::string& path, std::vector<Planned> tensors,
                                                                const std::map<std::string, std::string>& metadata) {
  SafetensorsStreamWriter writer;
  writer.path_ = path;
  writer.mutex_ = std::make_shared<std::mutex>();
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (Planned& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__" || writer.index_.contains(tensor.name)) {
      return make_status(StatusCode::invalid_argument, "tensor name '", tensor.name, "' is empty, reserved or repeated");
    }
    for (auto extent : tensor.shape) {
      if (extent < 0) return make_status(StatusCode::invalid_argument, "tensor '", tensor.name, "' has a negative extent");
    }
    const std::uint64_t bytes = tensor.bytes();
    header[tensor.name] = {{"dtype", std::string(safetensors_name(tensor.type))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    writer.index_.emplace(tensor.name, writer.slots_.size());
    writer.slots_.push_back({std::move(tensor), offset, 0});
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  writer.data_start_ = 8 + text.size();
  writer.data_bytes_ = offset;

  writer.file_ = std::make_shared<Descriptor>();
  writer.file_->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (writer.file_->fd < 0) return make_status(StatusCode::io_error, "cannot create '", path, "'");
  std::vector<std::byte> head(writer.data_start_);
  const std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<std::byte>((length >> (8 * i)) & 0xFFu);
  std::memcpy(head.data() + 8, text.data(), text.size());
  // Size the file now: tensors may then be written in any order.
  if (!write_fully(writer.file_->fd, 0, head) ||
      ::ftruncate(writer.file_->fd, static_cast<off_t>(writer.file_bytes())) != 0) {
    return make_status(StatusCode::io_error, "cannot write the header of '", path, "'");
  }
  return writer;
}

Status SafetensorsStreamWriter::write(std::string_view name, std::span<const std::byte> bytes, std::uint64_t offset) {
  const auto found = index_.find(name);
  if (found == index_.end()) return make_status(StatusCode::invalid_argument, "'", path_, "' has no tensor '", name, "'");
  Slot& slot = slots_[found->second];
  const std::uint64_t size = slot.tensor.bytes();
  if (offset > size || bytes.size() > size - offset) {
    return make_status(StatusCode::invalid_argument, "bytes [", offset, ", ", offset + bytes.size(),
                       ") outside tensor '", name, "' (", size, " bytes)");
  }
  if (!write_fully(file_->fd, data_start_ + slot.begin + offset, bytes)) {
    return make_status(StatusCode::io_error, "cannot write tensor '", name, "' to '", path_, "'");
  }
  std::lock_guard lock(*mutex_);
  slot.written += bytes.size();
  return Status::success();
}

Status SafetensorsStreamWriter::finish() {
  for (const Slot& slot : slots_) {
    if (slot.written != slot.tensor.bytes()) {
      return make_status(StatusCode::failed_precondition, "tensor '", slot.tensor.name, "' of '", path_, "' got ",
                         slot.written, " of its ", slot.tensor.bytes(), " bytes");
    }
  }
  if (file_ && file_->fd >= 0) {
    const int fd = file_->fd;
    file_->fd = -1;
    if (::close(fd) != 0) return make_status(StatusCode::io_error, "cannot close '", path_, "'");
  }
  return Status::success();
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
