#pragma once
// The calls to the outside world: the only place idem calls a tool.
//
// Every Tool::Invoke, Lookup, Preview and ListEffects made by idem goes
// through these functions, so that each call is marked as a boundary: the
// driver lets go of what it must not hold across a call (saga/run.h,
// OutsideCall), and the simulation (sim/) can tell every call apart. Tools
// must not throw (tools/tool.h); one that does is a fault of the drive,
// which parks the saga with the exception's text (docs/architecture.md).
//
// What to do with the answers is effect/protocol.h's decision, never the
// caller's.
//
// Thread safety: as the tool's; the boundary is the caller's.

#include <cstdint>
#include <string>
#include <vector>

#include "tools/tool.h"

#include "common/clock.h"
#include "common/status.h"
#include "effect/protocol.h"

namespace idem::effect {

/// Marks the span of a call to the outside world for the driver that makes
/// it. Enter before, Leave after, on the same thread.
class Boundary {
 public:
  virtual ~Boundary() = default;
  virtual void Enter() = 0;
  virtual void Leave() = 0;
};

/// The call with its key (call.key). `kind` is what it is for.
ToolOutcome Invoke(CallKind kind, Tool* tool, const ToolCall& call, Boundary* boundary);
/// The tool's status lookup of `key` (only for tools with info().has_status).
LookupOutcome Lookup(CallKind kind, Tool* tool, const std::string& key, Boundary* boundary);
/// A two-phase preview: no effect.
PreviewOutcome Preview(Tool* tool, const ToolCall& call, Boundary* boundary);
/// The effects the provider holds since `since_ms` (tools with has_list).
Result<std::vector<ProviderEffect>> ListEffects(Tool* tool, int64_t since_ms, Boundary* boundary);
/// A backoff between calls: a boundary too (the driver holds nothing while
/// it sleeps).
void Sleep(Clock* clock, int64_t ms, Boundary* boundary);

}  // namespace idem::effect
