#pragma once
// `idem open begin|call|commit|rollback`: an open saga from the command line
// (saga/open_saga.h), one verb per process, each printing its answer as
// JSON on stdout.
//
//   idem open begin --intent-key K --tool T [--tool T2 ...] [--metadata JSON|@FILE]
//                   [--idle-timeout 15m] [--on-idle rollback|park] [--decision JSON|@FILE]
//   idem open call SAGA --call-id ID --tool T [--args JSON|@FILE] [--repeat]
//                   [--decision JSON|@FILE]
//   idem open commit SAGA --as WHO [--decision JSON|@FILE]
//   idem open rollback SAGA --as WHO [--reason TEXT]
//
// Exit codes (cli/cli.h): 0 a call succeeded (or begin, commit, a rollback
// done); 3 the call failed (the saga stays open) or the saga rolled back; 4
// needs attention; 7 awaiting approval; 8 busy (another call in progress); 5
// the call id was recorded for another tool or other arguments; 2 bad input
// or a refused call (not open, tool not allowed, a call pending).
//
// Thread safety: called once, from RunCli.

#include <string>
#include <vector>

#include "saga/options.h"
#include "storage/store.h"
#include "tools/tool.h"

#include "common/json_util.h"
#include "common/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace idem::cli {

/// The parsed `open` verb and its flags.
class OpenCommand {
 public:
  /// Adds `open` and its verbs to `app`.
  explicit OpenCommand(CLI::App* app);
  /// Whether `open` was given.
  bool parsed() const;
  /// Whether the verb drives sagas (every verb but begin): it takes the
  /// embedded journal's driver lock.
  bool drives() const;
  /// Runs the verb with `engine_options` (the CLI's: leases, limits, the
  /// journal log, the commit-token signer).
  /// `fail` prints an error and gives its exit code (the CLI's Fail).
  int Run(const ToolRegistry& tools, storage::Store* store, const EngineOptions& engine_options,
          int (*fail)(const Status&));

 private:
  CLI::App* open_ = nullptr;
  CLI::App* begin_ = nullptr;
  CLI::App* call_ = nullptr;
  CLI::App* commit_ = nullptr;
  CLI::App* rollback_ = nullptr;
  std::string saga_id_, intent_key_, call_id_, tool_, args_, metadata_, decision_, who_, reason_;
  std::string idle_timeout_, on_idle_ = "rollback";
  std::vector<std::string> tools_;
  bool repeat_ = false;
};

}  // namespace idem::cli
