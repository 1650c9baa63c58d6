#pragma once
// `approvals`, `approve TOKEN` and `reject TOKEN`: the commits waiting for a
// person, and who decides on one.
//
// Who decides: with a credential, the principal of the auth file whose
// bearer token it is, and that principal's roles. The auth file is the one
// `idem serve --auth FILE` reads (`--auth FILE`); the credential is
// `--credential @FILE` (a file holding the token, owner-only) or the
// environment variable IDEM_CREDENTIAL (a token on the command line would
// be visible to every local user, so `--credential TOKEN` is refused).
// Such a decision is authenticated: it counts toward an approval policy's
// role and quorum, and it is refused to whoever asked for the commit
// (saga/approval_rights.h). `--as NAME` then only confirms the name.
//
// Without a credential, `--as NAME` is taken at its word, as before: enough
// for an `"approval": "human"` commit (the journal records the decision as
// not authenticated), refused by the engine for a commit whose policy asks
// a role. `--role` is refused: roles come from the auth file.
//
// Thread safety: called once, from RunCli.

#include <string>
#include <vector>

#include "saga/decisions.h"
#include "storage/store.h"

#include "common/json_util.h"
#include "common/status.h"

namespace idem::cli {

/// The environment variable that may hold the bearer token.
inline constexpr const char* kCredentialEnv = "IDEM_CREDENTIAL";

/// How to pass a credential, for error messages.
std::string CredentialHint();

/// What `approve` and `reject` were told about who decides.
struct DeciderFlags {
  std::string who;                 ///< --as NAME
  std::string auth_path;           ///< --auth FILE
  std::string credential;          ///< --credential @FILE
  std::vector<std::string> roles;  ///< --role: refused (roles come from the auth file)
};

/// The decision's who, roles and whether it is authenticated, from `flags`
/// and `env_credential` (IDEM_CREDENTIAL's value, or nullptr). Errors are
/// kInvalidArgument saying what to pass instead: a literal --credential, a
/// credential without --auth or the reverse, a credential that matches no
/// caller of the auth file, --as naming someone else than the credential,
/// no --as and no credential, --role. The auth file's errors are
/// LoadPrincipals' (server/server.h).
Result<ApprovalDecision> ResolveDecider(const DeciderFlags& flags, const char* env_credential);

/// The commits waiting for a person, as GET /v1/approvals lists them (with
/// each saga's intent key); `error` gets a store error.
Json PendingApprovals(storage::Store* store, Status* error);

/// "rule 2: 2 distinct finance approval(s); 1 so far (maria); 1 more, from
/// anyone with the role finance but maria who did not request the saga",
/// or for "approval": "human" one approver.
std::string PolicyLine(const Json& pending);

}  // namespace idem::cli
