#pragma once
// `idem keys retire KEY [--re-preview --as NAME]`: retiring a commit-token
// key that pending commits still need.
//
// A token signed by a retired key no longer verifies, so a commit waiting
// for a person (or a previewed one about to commit) with such a token could
// never be approved, rejected or resolved: it would wait out its TTL. So
// RetireKey first looks for undecided, unexpired tokens of KEY in the journal
// (steps previewed or awaiting approval). If there are any it refuses
// (kFailedPrecondition, kKeyInUseMessage, with the list of sagas and steps),
// unless `re_preview`: then each such step is previewed again with a token
// of the active key (Engine::RePreview: the old approval is journaled as
// superseded and the person is asked again), and only then is KEY retired.
// Expired tokens need no key: `recover` applies their on_expiry.
//
// Thread safety: called once, from RunCli.

#include <string>
#include <string_view>

#include "preview_commit/token.h"
#include "saga/engine.h"
#include "storage/store.h"

#include "common/status.h"

namespace idem::cli {

/// The start of the refusal's message; the CLI answers it with kExitKeyInUse.
inline constexpr std::string_view kKeyInUseMessage = "key still signs pending commits: ";

struct RetireRequest {
  std::string key_id;
  bool re_preview = false;
  std::string who;  ///< recorded with each re-preview
};

/// Retires `request.key_id` in `ring` (see above), printing what it did.
/// `engine` drives the re-previews (nullptr without re_preview); `signer`
/// opens the tokens found.
Status RetireKey(const RetireRequest& request, preview_commit::KeyRing* ring,
                 const preview_commit::TokenSigner* signer, storage::Store* store, Engine* engine);

}  // namespace idem::cli
