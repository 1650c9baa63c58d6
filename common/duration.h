#pragma once
// Durations as specs and tools files write them: a count and one unit,
// "30s", "15m", "2h", "3d" (seconds, minutes, hours, days), or an integer
// number of seconds where a JSON value is read.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>

#include "common/json_util.h"
#include "common/status.h"

namespace idem {

/// "15m" -> 900000. InvalidArgument, naming `where`, for anything else
/// (an empty count, another unit, a sign, spaces) and for a value above
/// `max_ms`.
Result<int64_t> ParseDurationMs(const std::string& text, const std::string& where,
                                int64_t max_ms = INT64_MAX / 2);

/// A JSON duration: an integer counts seconds, a string is ParseDurationMs.
Result<int64_t> ParseDurationMs(const Json& value, const std::string& where,
                                int64_t max_ms = INT64_MAX / 2);

/// `ms` as exact text in the units above, largest first: "24h", "1h 30m",
/// "30d 100ms" (milliseconds as "ms"); "0s" for zero.
std::string FormatDurationMs(int64_t ms);

}  // namespace idem
