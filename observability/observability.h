#pragma once
// Structured logs: one line per journal event and per error, on stderr.
//
// A program (the CLI, `serve`, `worker`) calls SetUpLogging once with the
// format and level the operator chose; until then, and in programs that never
// call it, nothing is logged (the library never writes to a stream it was
// not given). Lines go to stderr so that stdout stays the commands' output.
//
//   text: `2026-12-01T07:49:43.123Z info journal saga_id=saga_... step=book_hotel
//          key=saga_.../book_hotel attempt=1 outcome=submitted tool=hotels.book`
//   json: {"ts":"...","level":"info","msg":"journal","saga_id":"...",...}
//          (one object per line)
//
// Nothing secret is ever logged: every field passes through one redaction
// (observability/redact.h) that drops commit tokens, signing keys, bearer
// tokens and Authorization headers, by field name and by value.
//
// Thread safety: SetUpLogging before other threads log; Log, LogJournalEntry
// and the observers WithJournalLog returns may be called from any thread.

#include <functional>
#include <string>
#include <string_view>

#include "storage/store.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::observability {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };
enum class LogFormat { kText, kJson };

/// "trace", "debug", "info", "warn", "error", "critical", "off";
/// kInvalidArgument for anything else.
Result<LogLevel> ParseLogLevel(std::string_view name);
/// "text" or "json"; kInvalidArgument for anything else.
Result<LogFormat> ParseLogFormat(std::string_view name);

/// Sends this process's logs to stderr in `format`, from `level` up.
void SetUpLogging(LogFormat format, LogLevel level);

/// True when a line at `level` would be written.
bool LogEnabled(LogLevel level);

/// Writes one line: `msg` and the members of `fields` (an object), redacted.
void Log(LogLevel level, std::string_view msg, const Json& fields = Json::object());

/// One line for a committed journal entry: saga_id, step, key, attempt,
/// outcome (the event) and, where present, tool, error, reason and who
/// decided; at debug level also the entry's (redacted) data. Trouble
/// (failed, unknown, needs_attention, ...) is logged at warn, the rest at info.
void LogJournalEntry(const storage::JournalEntry& entry);

using JournalObserver = std::function<void(const storage::JournalEntry&)>;

/// An EngineOptions::observer that logs each entry, then calls `next` (if
/// set): it composes with an observer already in place.
JournalObserver WithJournalLog(JournalObserver next);

}  // namespace idem::observability
