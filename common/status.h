#pragma once
// Status and Result<T>: idem's error values.
//
// Outcomes that a caller branches on (a conflict, a bad spec, a store that is
// unavailable) are returned as values, never thrown. Exceptions are kept for
// bugs. Each adapter (SQLite, JSON, OpenSSL) translates the exceptions of its
// third-party library into a Status at its edge.
//
// Thread safety: values; safe to copy between threads.

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace idem {

/// The closed set of error codes. Persisted and printed by name.
enum class Code {
  kOk = 0,
  kInvalidArgument,     ///< bad input from outside (spec, arguments, flags)
  kNotFound,            ///< the named object does not exist
  kConflict,            ///< same key, other content (intent key, step key)
  kFailedPrecondition,  ///< the object is not in a state that allows this
  kIllegalTransition,   ///< a state machine refused an event
  kUnavailable,         ///< transient: store busy or down; retry later
  kAborted,             ///< a transaction was aborted (lost lease, contention)
  kInternal,            ///< a bug or an unexpected third-party failure
};

/// The name of a code, e.g. "conflict".
const char* CodeName(Code code);

/// An error code and a message that names the place ("steps[2].tool: ...").
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status Conflict(std::string m) { return {Code::kConflict, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {Code::kFailedPrecondition, std::move(m)};
  }
  static Status IllegalTransition(std::string m) {
    return {Code::kIllegalTransition, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "conflict: intent key ..." or "ok".
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

/// A value or the Status that explains its absence (like absl::StatusOr).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "Result needs a value or an error");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T& value() & {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace idem

/// Returns early from the enclosing function when `expr` is not OK.
#define IDEM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::idem::Status idem_status_ = (expr);        \
    if (!idem_status_.ok()) return idem_status_; \
  } while (0)
