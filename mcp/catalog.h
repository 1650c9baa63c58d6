#pragma once
// The MCP tool catalog of idem's server mode (docs/mcp.md "Tools"): what
// tools/list answers and what tools/call looks up.
//
// It lists
//   - every tool of the ToolRegistry that an open saga may call
//     (CheckOpenTool: a write or irreversible tool names its compensation or
//     says it has none), under its own name;
//   - every registered saga spec as one tool, "saga.<spec name>": calling it
//     submits the saga with the arguments as its input;
//   - idem_commit and idem_rollback, which commit or roll back the open saga
//     the session's calls belong to.
// Each with truthful annotations (AnnotationsFor, SpecAnnotations; the
// table is in docs/mcp.md) and an input schema. Registry tools declare no
// schema: {"type": "object"}. A spec's schema names the input members its
// templates reference (`${input.<name>}`), all required.
//
// Thread safety: a built catalog is immutable; share it freely.

#include <cstddef>
#include <string>
#include <vector>

#include "saga/spec.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::mcp {

/// A saga spec offered as a tool (a --spec file, or the server's registry).
struct SpecSource {
  std::string name;
  int version = 0;  ///< 0: given inline (a file)
  Json doc;
};

enum class CatalogKind { kTool, kSpec, kCommit, kRollback };

struct CatalogEntry {
  std::string name;  ///< the MCP tool name
  CatalogKind kind = CatalogKind::kTool;
  std::string target;  ///< the registry tool, or the spec's name
  SagaSpec spec;       ///< kSpec: the parsed spec
  Json definition;     ///< the MCP Tool object tools/list sends
};

inline constexpr const char* kCommitTool = "idem_commit";
inline constexpr const char* kRollbackTool = "idem_rollback";
inline constexpr const char* kSpecToolPrefix = "saga.";

class ToolCatalog {
 public:
  /// The catalog of `tools` and `specs`. A spec that does not parse against
  /// `tools` is left out and named in `skipped` ("trip: ...").
  static ToolCatalog Build(const ToolRegistry& tools, const std::vector<SpecSource>& specs,
                           std::vector<std::string>* skipped = nullptr);

  /// nullptr when no tool has that name.
  const CatalogEntry* Find(const std::string& name) const;
  const std::vector<CatalogEntry>& entries() const { return entries_; }
  /// The registry tools an open saga of this catalog may use (Begin's list).
  const std::vector<std::string>& open_tools() const { return open_tools_; }

  /// One page of tools/list: {"tools": [...], "nextCursor"?: "..."}, at most
  /// `page_size` tools from `cursor` ("" for the first page). The cursor is
  /// opaque to clients; a malformed one is kInvalidArgument.
  Result<Json> Page(const std::string& cursor, size_t page_size) const;

 private:
  std::vector<CatalogEntry> entries_;
  std::vector<std::string> open_tools_;
};

/// readOnlyHint, destructiveHint, idempotentHint, openWorldHint and title
/// for a registry tool (docs/mcp.md "Annotations").
Json AnnotationsFor(const ToolInfo& info);
/// The same for a spec offered as a tool, from its steps' tools.
Json SpecAnnotations(const SagaSpec& spec, const ToolRegistry& tools);
/// The input schema of a spec: the `${input.<name>}` members it references.
Json SpecInputSchema(const Json& spec_doc);

/// Checks `args` against the subset of JSON Schema the catalog writes
/// (type, properties' types, required). "" when they fit, else why, naming
/// the member ("arguments.traveller: required").
std::string CheckArguments(const Json& schema, const Json& args);

}  // namespace idem::mcp
