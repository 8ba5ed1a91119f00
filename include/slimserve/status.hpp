#pragma once
/// \file
/// \brief Status and Result: how every slimserve call reports failure.
///
/// No magic integers: a Status carries a category (StatusCode, for programs) and a message
/// that names the offending value (for people). Host preflight code builds the message;
/// kernels never do. A Status is cheap when ok (no allocation).

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#if defined(__cpp_exceptions)
#include <stdexcept>
#endif

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN

enum class StatusCode : int {
  ok = 0,
  invalid_argument,     ///< a value is outside what the call accepts (bad scale, bad shape)
  out_of_range,         ///< an index (page id, token slot) outside its container
  unsupported,          ///< a valid request this build does not implement (head_dim 96, sm_80 wgmma)
  resource_exhausted,   ///< not enough free pages / workspace too small; nothing was taken
  stale_handle,         ///< a (page, tag) handle whose tag no longer matches the page
  failed_precondition,  ///< the object is in the wrong state (double free, refcount underflow)
  data_loss,            ///< an input file or checkpoint contradicts itself
  io_error,             ///< reading or writing a file failed
  device_error,         ///< the CUDA runtime (or the emulator) reported an error
  internal,             ///< a bug in slimserve
};

constexpr std::string_view to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid argument";
    case StatusCode::out_of_range: return "out of range";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::resource_exhausted: return "resource exhausted";
    case StatusCode::stale_handle: return "stale handle";
    case StatusCode::failed_precondition: return "failed precondition";
    case StatusCode::data_loss: return "data loss";
    case StatusCode::io_error: return "i/o error";
    case StatusCode::device_error: return "device error";
    case StatusCode::internal: return "internal error";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  ///< ok
  Status(StatusCode code, std::string message)
      : code_(code),
        message_(code == StatusCode::ok ? nullptr
                                        : std::make_shared<const std::string>(std::move(message))) {}

  static Status success() noexcept { return {}; }

  bool ok() const noexcept { return code_ == StatusCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  StatusCode code() const noexcept { return code_; }
  std::string_view message() const noexcept {
    return message_ ? std::string_view(*message_) : std::string_view();
  }
  /// "invalid argument: k_scale must be finite and > 0, got -1"
  std::string to_string() const {
    std::string text(slimserve::to_string(code_));
    if (message_) (text += ": ") += *message_;
    return text;
  }

 private:
  StatusCode code_ = StatusCode::ok;
  std::shared_ptr<const std::string> message_;  // shared: copying a Status never allocates
};

/// Builds a message from any streamable pieces: make_status(code, "page ", id, " is free").
template <class... Parts>
Status make_status(StatusCode code, const Parts&... parts) {
  std::ostringstream text;
  (text << ... << parts);
  return Status(code, text.str());
}

#if defined(__cpp_exceptions)
/// Thrown by Result::value() when the Result holds an error (compare std::bad_optional_access).
class BadResultAccess : public std::logic_error {
 public:
  explicit BadResultAccess(Status status)
      : std::logic_error("Result::value() on an error: " + status.to_string()),
        status_(std::move(status)) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};
#endif

namespace detail {
/// value() on an error: throws BadResultAccess, or (built without exceptions) prints the
/// status and aborts. Never undefined behaviour.
[[noreturn]] inline void bad_result_access(const Status& status) {
#if defined(__cpp_exceptions)
  throw BadResultAccess(status);
#else
  std::fprintf(stderr, "slimserve: Result::value() on an error: %s\n", status.to_string().c_str());
  std::abort();
#endif
}
}  // namespace detail

/// A value or the Status that explains why there is none (std::expected is C++23).
///   value()      checked: on an error it throws BadResultAccess (aborts without exceptions);
///   operator*/-> unchecked, as std::optional's: the caller has tested ok().
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status)  // NOLINT: implicit on purpose
      : status_(status.ok() ? Status(StatusCode::internal, "Result built from an ok Status")
                            : std::move(status)) {}

  bool ok() const noexcept { return status_.ok(); }
  explicit operator bool() const noexcept { return ok(); }
  const Status& status() const noexcept { return status_; }

  T& value() & {
    check();
    return *value_;
  }
  const T& value() const& {
    check();
    return *value_;
  }
  T&& value() && {
    check();
    return std::move(*value_);
  }
  /// The value, or `fallback` when this holds an error.
  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? *value_ : static_cast<T>(std::forward<U>(fallback));
  }

  // Unchecked accessors. Precondition: ok().
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }

 private:
  void check() const {
    if (!ok()) detail::bad_result_access(status_);
  }
  std::optional<T> value_;
  Status status_;
};

SLIMSERVE_NAMESPACE_END

/// Returns early from a function returning Status (or Result) when `expr` is not ok.
#define SLIMSERVE_RETURN_IF_ERROR(expr)                     \
  do {                                                      \
    ::slimserve::Status slimserve_status_ = (expr);         \
    if (!slimserve_status_.ok()) return slimserve_status_;  \
  } while (0)
