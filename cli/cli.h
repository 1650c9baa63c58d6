#pragma once
// The idem command-line front end, as a library function.
//
// An embedding program builds its own tool registry and hands over to
// RunCli; the `idem` binary is one such program, examples/travel_booking
// another. Subcommands:
//   validate SPEC
//   run SPEC --input JSON|@FILE [--intent-key K]   live timeline, then outcome
//   status SAGA [--json]
//   list [--status S] [--json]
//   recover                                        resume unfinished sagas
//   resolve SAGA STEP --decision D --as NAME       a person's decision on a parked step
//   approvals [--json]                             commits waiting for a person
//   approve TOKEN [--auth F --credential @F | --as NAME] [--note TEXT]
//                                                  approve: the commit runs now
//   reject TOKEN [--auth F --credential @F | --as NAME] --reason TEXT
//                                                  reject: the saga rolls back
//     (who decides: cli/approvals.h; IDEM_CREDENTIAL may hold the token)
//   cancel|pause|resume SAGA --as NAME [--reason TEXT]  a durable request: honoured by
//                                                  whichever process drives the saga
//   keys list|rotate|retire KEY [--re-preview --as NAME]  commit-token signing keys
//   journal check|accept-regression --as NAME --reason TEXT  the high-water mark
//   submit SPEC --input JSON|@FILE [--intent-key K]  record a saga for workers
//   worker [--owner N] [--concurrency C] [--lease-ms L]  drive sagas until SIGTERM
//   failpoints                                     list the failpoint names
//   serve [--listen H:P] [--auth F] [--tools F] [--workers N]  the REST API (docs/server.md)
// Global options: --store (or --db) LOCATOR: a SQLite file or postgresql://...
// (default $IDEM_STORE, $IDEM_DB or ./idem.db); --keys PATH
// (commit-token keys, default <db>.keys.json, created with mode 0600);
// --log-format text|json and --log-level L (structured logs on stderr,
// observability/observability.h). Global options may come before or after
// the subcommand.
//
// Exit codes (kExit*): 0 the command succeeded / the saga succeeded;
// 1 internal or store error; 2 bad usage or bad input (spec, JSON, flags,
// IDEM_FAILPOINT); 3 the saga was rolled back or failed; 4 a saga needs
// attention; 5 the intent key is in use with other content; 6 not found;
// 7 a saga waits for a person's approval; 8 another process drives the
// embedded journal (`serve`, `worker`, or a one-shot command that did not
// finish within cli/driver_lock.h's wait), or the saga or the store is busy
// ("busy; try again"): nothing was done; 9 the commit token expired;
// 10 the commit was already decided otherwise (approved, then rejected, or
// the reverse); 11 the journal went back in time (its high-water mark,
// storage/high_water_mark.h): nothing is driven until `journal
// accept-regression` or the lost WAL is put back; 12 `keys retire` refused:
// pending commits still need the key (cli/keys_retire.h); 13 `reconcile`
// found drift between the journal and a provider (cli/reconcile.h).
//
// Thread safety: call once per process, from main().

#include <functional>
#include <string>

#include "tools/tool.h"

#include "common/status.h"
#include <CLI/CLI.hpp>

namespace idem::cli {

constexpr int kExitOk = 0;
constexpr int kExitInternal = 1;
constexpr int kExitUsage = 2;
constexpr int kExitRolledBack = 3;
constexpr int kExitNeedsAttention = 4;
constexpr int kExitConflict = 5;
constexpr int kExitNotFound = 6;
constexpr int kExitAwaitingApproval = 7;
constexpr int kExitBusy = 8;
constexpr int kExitTokenExpired = 9;
constexpr int kExitAlreadyDecided = 10;
constexpr int kExitJournalRegressed = 11;
constexpr int kExitKeyInUse = 12;
constexpr int kExitDrift = 13;  ///< `reconcile` found drift (cli/reconcile.h)
/// The saga waits for its provider to finish a step (awaiting_completion,
/// saga/completion.h): neither done nor failed; a sweep checks it when due.
constexpr int kExitAwaitingCompletion = 14;

/// What the front end tells the embedding program once options are parsed.
struct Context {
  std::string db_path;  ///< the journal database
};

struct FrontendConfig {
  std::string program = "idem";
  std::string description = "idem: durable sagas for AI-agent tool calls";
  /// Adds the program's own global options (called before parsing).
  std::function<void(CLI::App&)> add_options;
  /// Registers the program's tools (called after parsing, before the command).
  std::function<Status(ToolRegistry&, const Context&)> register_tools;
};

/// Parses argv, runs the subcommand, returns the process exit code.
int RunCli(int argc, char** argv, const FrontendConfig& config);

}  // namespace idem::cli
