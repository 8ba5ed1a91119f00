#pragma once
// What every translation unit of the C ABI shares: the thread's last message, the guard that
// turns a Status (or an exception) into a code, the conversions of the plain structs that more
// than one group of entry points takes (page tables, block tables, the K/V cache view, enums),
// and the ABI-2 struct_size convention. Internal: the
// library is linked with hidden visibility, so nothing here is exported.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <exception>
#include <limits>
#include <new>
#include <type_traits>

#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/activation_dtype.hpp"
#include "slimserve/c/slimserve.h"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

// Handles more than one translation unit reads.
struct slimserve_device_tags {
  slimserve::kv::DeviceTagArray tags;
};

namespace slimserve_capi {

namespace ss = slimserve;
namespace kv = slimserve::kv;
namespace attention = slimserve::attention;
using ss::make_status;
using ss::Status;
using ss::StatusCode;

/// Stores the message of a failed status for slimserve_last_error (clears it on success).
slimserve_status record(const Status& status);
/// This thread's last message.
const char* last_error_message();

/// Runs `body` (returning Status); exceptions become codes, never unwind into C.
template <class Body>
slimserve_status guarded(Body&& body) noexcept {
  try {
    return record(body());
  } catch (const std::bad_alloc&) {
    return record(Status(StatusCode::resource_exhausted, "host memory allocation failed"));
  } catch (const std::exception& error) {
    return record(make_status(StatusCode::internal, "unexpected exception: ", error.what()));
  } catch (...) {
    return record(Status(StatusCode::internal, "unexpected exception"));
  }
}

inline Status null_argument(const char* name) {
  return make_status(StatusCode::invalid_argument, name, " is null");
}

/// An enumeration that arrives as int32: outside the underlying type's range it is refused
/// here; inside, the façade's is_valid check refuses values it does not name.
template <class Enum>
Status to_enum(std::int32_t value, const char* name, Enum& out) {
  using Underlying = std::underlying_type_t<Enum>;
  if (value < 0 || value > static_cast<std::int32_t>(std::numeric_limits<Underlying>::max())) {
    return make_status(StatusCode::invalid_argument, "unknown ", name, " ", value);
  }
  out = static_cast<Enum>(value);
  return {};
}

inline kv::PageTableView to_view(const slimserve_page_table_view& t) {
  return {t.indptr, t.indices, t.last_page_len, t.expected_tags, t.batch_size, t.page_size};
}
inline const kv::RequestStatus* to_statuses(const slimserve_request_status* statuses) {
  return reinterpret_cast<const kv::RequestStatus*>(statuses);
}

/// The C cache struct as the C++ view (page_stride: elements between pages, 0 = packed),
/// validated.
Status to_cache(const slimserve_kv_cache* c, attention::PagedKVCacheView& out,
                std::int64_t page_stride = 0);

// ---- shared by the attention and MLA entry points (ABI 2) ----------------------------------

inline kv::BlockTableView to_block_view(const slimserve_block_table_view& t) {
  return {t.block_table, t.expected_tags, t.seq_lens, t.batch_size, t.max_pages_per_request, t.page_size};
}

inline Status to_activation(std::int32_t value, const char* name, ss::ActivationDtype& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_enum(value, name, out));
  if (!attention::is_valid(out)) return make_status(StatusCode::invalid_argument, "unknown ", name, " ", value);
  return {};
}
inline Status to_kv_dtype(std::int32_t value, attention::KvDtype& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_enum(value, "KV dtype", out));
  if (!attention::is_valid(out)) {
    return make_status(StatusCode::invalid_argument, "unknown KV dtype ", value, " (one of ",
                       attention::kv_format_names(), ")");
  }
  return {};
}

/// An MLA scale mode that arrives as int32, refused unless the library names it.
Status to_mla_scale_mode(std::int32_t value, attention::MlaScaleMode& out);
/// The C MLA cache struct as the C++ view, validated (the MLA entry points and the cache
/// layout description take the same conversion).
Status to_mla_cache(const slimserve_mla_cache& c, attention::MlaCacheView& out);

/// A host array of `count` entries, or none when the pointer is null.
inline std::span<const std::int32_t> host_span(const std::int32_t* data, std::size_t count) {
  return data == nullptr ? std::span<const std::int32_t>() : std::span<const std::int32_t>(data, count);
}

/// Exactly one form of host lengths: CSR (kv_indptr + last_page_len) or block table (seq_lens).
inline Status check_length_form(const std::int32_t* kv_indptr, const std::int32_t* last_page_len,
                         const std::int32_t* seq_lens, std::int32_t batch) {
  const bool csr = kv_indptr != nullptr || last_page_len != nullptr;
  if (csr == (seq_lens != nullptr)) {
    return make_status(StatusCode::invalid_argument, "give the host lengths in one form: kv_indptr_host + ",
                       "last_page_len_host (CSR) or seq_lens_host (block table), exactly one");
  }
  if (csr && (kv_indptr == nullptr || (batch > 0 && last_page_len == nullptr))) {
    return make_status(StatusCode::invalid_argument, "the CSR form needs both kv_indptr_host and last_page_len_host");
  }
  return {};
}

/// Rows of `rows` x `heads` vectors of `inner` elements at (row * row_stride + head *
/// head_stride) must not overlap: o is written by many CTAs at once. Sorted by stride, each
/// dimension's stride must clear everything inside it.
inline Status check_disjoint_rows(const char* name, std::int64_t rows, std::int64_t row_stride, std::int64_t heads,
                           std::int64_t head_stride, std::int64_t inner) {
  std::array<std::pair<std::int64_t, std::int64_t>, 2> dims{{{row_stride, rows}, {head_stride, heads}}};
  std::sort(dims.begin(), dims.end());
  std::int64_t span = inner;
  for (const auto& [stride, extent] : dims) {
    if (extent <= 1) continue;
    if (stride < span) {
      return make_status(StatusCode::invalid_argument, name, " strides (token ", row_stride, ", head ", head_stride,
                         ") make rows of ", inner, " elements overlap for ", rows, " tokens x ", heads,
                         " heads: outputs would be written twice");
    }
    span = stride * (extent - 1) + span;
  }
  return {};
}


/// The plan handles keep the host-side size the run's output check needs.
template <class Handle, class Made>
Status hand_out(Made made, std::int64_t rows, Handle** out) {
  *out = new Handle{std::move(made), rows};
  return {};
}

/// Reads a caller's struct that begins with `size_t struct_size` (ABI 2 convention): at least
/// the `minimum` bytes this library's first version of the struct had; bytes past what this
/// library knows must be zero (a newer header's fields left at their defaults), otherwise the
/// caller asks for something this library cannot do.
template <class CStruct>
Status read_versioned(const CStruct* in, const char* name, CStruct& out,
                      std::size_t minimum = sizeof(CStruct)) {
  static_assert(std::is_trivially_copyable_v<CStruct>);
  if (in == nullptr) return null_argument(name);
  std::size_t size = 0;
  std::memcpy(&size, in, sizeof size);
  if (size < minimum) {
    return make_status(StatusCode::invalid_argument, name, "->struct_size is ", size,
                       "; this struct has at least ", minimum,
                       " bytes (set struct_size = sizeof the struct, after zeroing it)");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (std::size_t i = sizeof(CStruct); i < size; ++i) {
    if (bytes[i] != 0) {
      return make_status(StatusCode::unsupported, name, " (", size, " bytes, from a newer header) sets byte ",
                         i, ", past the ", sizeof(CStruct), " bytes this library (C ABI ",
                         SLIMSERVE_C_ABI_VERSION, ") knows: a field it cannot honour");
    }
  }
  out = CStruct{};
  std::memcpy(&out, in, std::min(size, sizeof(CStruct)));
  return {};
}

/// Writes a versioned output struct: the caller's struct_size stays, bytes this library does
/// not know are zeroed.
template <class CStruct>
Status write_versioned(const CStruct& value, const char* name, CStruct* out) {
  if (out == nullptr) return null_argument(name);
  std::size_t size = 0;
  std::memcpy(&size, out, sizeof size);
  if (size < sizeof(CStruct)) {
    return make_status(StatusCode::invalid_argument, name, "->struct_size is ", size, "; it needs ",
                       sizeof(CStruct), " bytes (set struct_size = sizeof the struct)");
  }
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  std::memcpy(bytes, &value, sizeof(CStruct));
  std::memcpy(bytes, &size, sizeof size);
  std::memset(bytes + sizeof(CStruct), 0, size - sizeof(CStruct));
  return {};
}

}  // namespace slimserve_capi
