#pragma once
// spdlog formatters for idem's two log formats (internal to observability).
//
// A structured line's fields travel beside the spdlog message: Log() puts
// them in a FieldsScope on its own thread, and the (synchronous) logger
// formats on that same thread. A plain spdlog message has no fields.
//
//   TextFormatter: `<ts> <level> <msg> key=value ...`; a value with spaces,
//                  quotes or control characters is JSON-quoted, so a line is
//                  always one line.
//   JsonFormatter: {"ts","level","msg", then the fields}, one object a line.
// The first fields are, when present, saga_id, step, key, attempt, outcome;
// the rest follow in name order.
//
// Thread safety: spdlog calls a formatter under its sink's mutex.

#include <memory>

#include <spdlog/formatter.h>

#include "common/json_util.h"

namespace idem::observability {

/// Makes `fields` (an object, kept by pointer) the fields of the lines this
/// thread logs until the scope ends.
class FieldsScope {
 public:
  explicit FieldsScope(const Json* fields);
  ~FieldsScope();
  FieldsScope(const FieldsScope&) = delete;
  FieldsScope& operator=(const FieldsScope&) = delete;

 private:
  const Json* previous_;
};

class TextFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

}  // namespace idem::observability
