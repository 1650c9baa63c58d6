#pragma once
// The JSON views of the API's resources (server/openapi.json) and the owner
// check every saga endpoint makes. Internal to the server.

#include <optional>
#include <string>
#include <vector>

#include "server/context.h"
#include "server/http.h"
#include "server/server.h"
#include "server/spec_registry.h"
#include "storage/store.h"

#include "common/json_util.h"

namespace idem::server {

/// "<owner>:<client key>": the owner is the part before the first ':' ("" if none).
std::string OwnerOf(const std::string& intent_key);
/// The client's Idempotency-Key: the part after the first ':'.
std::string ClientKeyOf(const std::string& intent_key);

/// A saga in a list.
Json SummaryView(const storage::SagaSummary& s);
/// A saga with its input, steps and effects.
Json SagaView(const storage::SagaRecord& rec, const std::vector<storage::EffectRecord>& effects);
/// A spec version, with its document when `with_doc`.
Json SpecView(const SpecVersion& v, bool with_doc);

/// Sends the saga (with its effects, read now) as `status`.
void SendSaga(const ServerContext& ctx, HttpResponse& res, int status,
              const storage::SagaRecord& rec);

/// Whether `p` has `role`.
bool HasRole(const Principal& p, const char* role);

/// The saga `p` may act on: an operator any, an agent its own (else nullopt
/// and a 404 problem, or the store's error, in `res`).
std::optional<storage::SagaRecord> ActOnSaga(const ServerContext& ctx, const Principal& p,
                                             const std::string& id, HttpResponse& res);

/// The saga `id`, whoever owns it; else nullopt and a 404 problem or the
/// store's error in `res` (callers that may act on any saga: operators).
std::optional<storage::SagaRecord> AnySaga(const ServerContext& ctx, const std::string& id,
                                           HttpResponse& res);

/// The saga if `p` owns it, else nullopt and a 404 problem (also for another
/// caller's saga) or the store's error in `res`.
std::optional<storage::SagaRecord> OwnedSaga(const ServerContext& ctx, const Principal& p,
                                             const std::string& id, HttpResponse& res);

}  // namespace idem::server
