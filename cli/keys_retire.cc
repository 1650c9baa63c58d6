#include "cli/keys_retire.h"

#include <cstdio>
#include <vector>

#include "preview_commit/phase.h"
#include "saga/states.h"

#include "common/json_util.h"

namespace idem::cli {
namespace {

struct Needing {
  std::string saga_id, step_id, state;
  int64_t expires_ms = 0;
};

// The steps whose undecided, unexpired commit token `key_id` signed.
Result<std::vector<Needing>> StepsNeeding(const std::string& key_id,
                                          const preview_commit::TokenSigner* signer,
                                          storage::Store* store) {
  storage::SagaFilter f;
  f.states = {SagaStateName(SagaState::kAwaitingApproval), SagaStateName(SagaState::kRunning)};
  f.limit = 1'000'000;
  auto list = store->ListSagas(f);
  if (!list.ok()) return list.status();
  std::vector<Needing> out;
  for (const auto& sum : *list) {
    auto rec = store->LoadSaga(sum.saga_id);
    if (!rec.ok()) return rec.status();
    for (const auto& st : rec->steps) {
      if (st.state != StepStateName(StepState::kAwaitingApproval) &&
          st.state != StepStateName(StepState::kPreviewed)) {
        continue;
      }
      auto phase = preview_commit::PhaseRecord::FromJson(st.phase);
      if (!phase || phase->approval || phase->token.empty()) continue;
      auto claims = signer->Open(phase->token);  // expired, or another key's: not needed
      if (!claims.ok() || claims->key_id != key_id) continue;
      out.push_back({sum.saga_id, st.step_id, st.state, claims->expires_at_ms});
    }
  }
  return out;
}

}  // namespace

Status RetireKey(const RetireRequest& request, preview_commit::KeyRing* ring,
                 const preview_commit::TokenSigner* signer, storage::Store* store, Engine* engine) {
  const std::string& key = request.key_id;
  if (key.empty()) return Status::InvalidArgument("keys retire: the KEY to retire is required");
  bool known = false;
  for (const auto& k : ring->keys()) known |= k.key_id == key;
  if (!known) return Status::NotFound("keys retire: no key \"" + key + "\" in " + ring->path());
  if (key == ring->active_key_id()) {
    return Status::InvalidArgument("keys retire: " + key +
                                   " is the active key; rotate first (keys rotate)");
  }
  auto needing = StepsNeeding(key, signer, store);
  if (!needing.ok()) return needing.status();
  if (!needing->empty() && !request.re_preview) {
    std::string list;
    for (const auto& n : *needing) {
      list += "\n  saga " + n.saga_id + " step " + n.step_id + " (" + n.state + ", token expires " +
              FormatTimeMs(n.expires_ms) + ")";
    }
    return Status::FailedPrecondition(
        std::string(kKeyInUseMessage) + key + " signed the commit tokens of " +
        std::to_string(needing->size()) + " step(s) that still wait for a decision; retiring it " +
        "would strand them until their tokens expire:" + list +
        "\nRetire with --re-preview --as NAME to preview them again with the active key " +
        ring->active_key_id() + " and ask again, or decide them first.");
  }
  if (!needing->empty() && (engine == nullptr || request.who.empty())) {
    return Status::InvalidArgument("keys retire --re-preview: --as NAME is required");
  }
  for (const auto& n : *needing) {
    auto rec = engine->RePreview(n.saga_id, n.step_id, key, request.who, "key " + key + " retired");
    if (!rec.ok()) {
      return Status(rec.status().code(), "keys retire: re-preview of saga " + n.saga_id + " step " +
                                             n.step_id + ": " + rec.status().message() + " (" +
                                             key + " is not retired)");
    }
    std::printf("previewed again: saga %s step %s is %s (new token: idem approvals)\n",
                n.saga_id.c_str(), n.step_id.c_str(), rec->summary.state.c_str());
  }
  IDEM_RETURN_IF_ERROR(ring->Retire(key));
  std::printf("retired %s: its tokens no longer verify\n", key.c_str());
  return Status::Ok();
}

}  // namespace idem::cli
