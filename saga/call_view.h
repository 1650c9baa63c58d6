#pragma once
// The JSON view of an open saga's call answer (saga/open_saga.h
// CallAnswer) that `idem open call` prints and MCP's tools/call answers as
// structuredContent (mcp/session.cc): saga, call, step, tool, state, the
// saga's state, duplicates, result and error. No approval part: each caller
// adds what its reader may see.
//
// Thread safety: a pure function.

#include <string>

#include "saga/open_saga.h"

#include "common/json_util.h"

namespace idem {

Json CallAnswerView(const std::string& saga_id, const CallAnswer& a);

}  // namespace idem
