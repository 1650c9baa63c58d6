// The saga resource: submit, read and list (cancel and the other operator
// endpoints: server/control.cc).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "saga/engine.h"
#include "saga/open_saga.h"
#include "saga/spec.h"
#include "saga/states.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"
#include "server/waiter.h"

namespace idem::server {
namespace {

constexpr int kDefaultListLimit = 100;
constexpr int kMaxListLimit = 1000;

// The Idempotency-Key as the layer reads it: an RFC 8941 sf-string is
// unquoted, anything else is taken as sent.
std::string IdempotencyKeyOf(const HttpRequest& req) {
  std::string v = req.Header("Idempotency-Key");
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
    std::string out;
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      if (v[i] == '\\' && i + 2 < v.size()) ++i;
      out += v[i];
    }
    return out;
  }
  return v;
}

struct Submission {
  SagaSpec spec;
  Json input;
  std::optional<ModelDecision> decision;
};

// The spec and input of a submission, or a 400/422 problem.
std::optional<Submission> ReadSubmission(const ServerContext& ctx, const Principal& p,
                                         const Json& body, HttpResponse& res) {
  if (!body.is_object()) {
    Problem(res, 400, "invalid-request", "Invalid request", "body: expected a JSON object");
    return std::nullopt;
  }
  for (const auto& [k, v] : body.items()) {
    if (k != "spec" && k != "input" && k != "version" && k != "decision") {
      Problem(res, 400, "invalid-request", "Invalid request",
              "body: unknown field \"" + k + "\" (expected spec, input, version, decision)");
      return std::nullopt;
    }
  }
  std::optional<ModelDecision> decision;
  if (body.contains("decision") && !body["decision"].is_null()) {
    auto d = ParseModelDecision(body["decision"], "decision",
                                ctx.engine->options().limits.max_decision_text_bytes);
    if (!d.ok()) {
      Problem(res, 422, "invalid-decision", "Invalid model decision", d.status().message());
      return std::nullopt;
    }
    decision = std::move(d).value();
  }
  if (!body.contains("spec") || !(body["spec"].is_object() || body["spec"].is_string())) {
    Problem(res, 400, "invalid-request", "Invalid request",
            "spec: required, a spec object or the name of a registered spec (\"name\" or "
            "\"name@version\")");
    return std::nullopt;
  }
  Json input = body.value("input", Json::object());
  if (!input.is_object()) {
    Problem(res, 400, "invalid-request", "Invalid request", "input: expected a JSON object");
    return std::nullopt;
  }
  Json doc = body["spec"];
  int registered_version = 0;
  if (body.contains("version") && (!doc.is_string() || !body["version"].is_number_integer() ||
                                   body["version"] < 1 || body["version"] > 999'999'999)) {
    Problem(res, 400, "invalid-request", "Invalid request",
            "version: a positive integer, with the name of a registered spec");
    return std::nullopt;
  }
  if (doc.is_string()) {
    std::string ref = doc.get<std::string>();
    std::string name = ref;
    int version = 0;
    size_t at = ref.find('@');
    if (at != std::string::npos) {
      name = ref.substr(0, at);
      try {
        size_t used = 0;
        version = std::stoi(ref.substr(at + 1), &used);
        if (used != ref.size() - at - 1 || version < 1) version = -1;
      } catch (const std::exception&) {
        version = -1;
      }
    }
    if (body.contains("version")) {
      if (at != std::string::npos) {
        Problem(res, 400, "invalid-request", "Invalid request",
                "version: given twice (in \"spec\" and \"version\")");
        return std::nullopt;
      }
      version = body["version"].get<int>();
    }
    // The name's owner decides who may run it: the owner, or everyone once
    // shared. A name that is not registered is unknown, as before.
    auto owner = ctx.specs->Owner(name);
    if (owner.ok() && !SpecRegistry::MayUse(*owner, p.name)) {
      NotShared(res, name);
      return std::nullopt;
    }
    if (!owner.ok() && owner.status().code() != Code::kNotFound) {
      ProblemFor(res, owner.status());
      return std::nullopt;
    }
    auto found = version < 0 ? Result<SpecVersion>(Status::NotFound("bad version"))
                             : ctx.specs->Get(name, version);
    if (!found.ok()) {
      if (found.status().code() == Code::kNotFound) {
        Problem(res, 422, "unknown-spec", "Unknown spec",
                "spec: no registered spec \"" + ref + "\" (PUT /v1/specs/{name} first)");
      } else {
        ProblemFor(res, found.status());
      }
      return std::nullopt;
    }
    doc = found->doc;
    registered_version = found->version;
  }
  auto spec = ParseSpec(doc, *ctx.tools);
  if (!spec.ok()) {
    Problem(res, 422, "invalid-spec", "Invalid saga spec", spec.status().message());
    return std::nullopt;
  }
  spec->registered_version = registered_version;
  // Before the key layer and the journal: a saga past the limits stores
  // nothing at all.
  Status within = CheckSubmitLimits(*spec, input, ctx.engine->options().limits);
  if (!within.ok()) {
    Problem(res, 422, "saga-too-large", "Saga exceeds a limit", within.message());
    return std::nullopt;
  }
  return Submission{std::move(spec).value(), std::move(input), std::move(decision)};
}

// A submission whose caller waits (Prefer: wait) handed to a driver thread:
// Engine::SubmitAndRun records the intent with the first step's `submitted`
// (one commit fewer, and no claim with leases) and drives on, while the
// handler waits only for that first write. Shared by the handler and the
// posted drive, either of which may outlive the other.
struct Handoff {
  enum class Phase { kQueued, kStarted, kRecorded, kFailed, kAbandoned };
  std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kQueued;  // GUARDED_BY(mu)
  SubmitResult recorded;         // GUARDED_BY(mu) set with kRecorded
  Status failure;                // GUARDED_BY(mu) set with kFailed

  void Set(Phase next, SubmitResult r = {}, Status why = Status::Ok()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      phase = next;
      recorded = std::move(r);
      failure = std::move(why);
    }
    cv.notify_all();
  }
};

// Submits through a driver thread and waits for the intent to be recorded:
// the saga (as Submit answers it), or the drive's error, or nullopt when the
// pool could not take it (stopping) or no thread started it within `wait`
// seconds (it then never runs, and the caller submits the plain way). Once
// started, the first write is waited for however long it takes: the
// saga cannot be answered before it exists.
std::optional<Result<SubmitResult>> SubmitThroughDriver(ServerContext& ctx, const Submission& sub,
                                                        const std::string& key, int wait) {
  auto h = std::make_shared<Handoff>();
  Engine* engine = ctx.engine;
  bool posted =
      ctx.pool->Post([h, engine, spec = sub.spec, input = sub.input, key, decision = sub.decision] {
        {
          std::lock_guard<std::mutex> lock(h->mu);
          if (h->phase == Handoff::Phase::kAbandoned) return;
          h->phase = Handoff::Phase::kStarted;
        }
        auto out = engine->SubmitAndRun(spec, input, key, decision, [&](const SubmitResult& r) {
          h->Set(Handoff::Phase::kRecorded, r);
        });
        std::lock_guard<std::mutex> lock(h->mu);
        if (h->phase == Handoff::Phase::kStarted) {
          h->phase = Handoff::Phase::kFailed;
          h->failure = out.ok() ? Status::Internal("the drive ended without recording the intent")
                                : out.status();
          h->cv.notify_all();
        }
      });
  if (!posted) return std::nullopt;
  std::unique_lock<std::mutex> lock(h->mu);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait);
  h->cv.wait_until(lock, deadline, [&] { return h->phase != Handoff::Phase::kQueued; });
  if (h->phase == Handoff::Phase::kQueued) {
    h->phase = Handoff::Phase::kAbandoned;
    return std::nullopt;
  }
  h->cv.wait(lock, [&] { return h->phase != Handoff::Phase::kStarted; });
  if (h->phase == Handoff::Phase::kFailed) return Result<SubmitResult>(h->failure);
  return Result<SubmitResult>(h->recorded);
}

// Runs once per (caller, key), under the key layer. With `wait` >= 0 (the
// caller waits for the outcome) a driver thread records and drives it;
// otherwise the intent is recorded here and queued for a driver.
void Submit(ServerContext& ctx, const Principal& p, const Submission& sub, const HttpRequest& req,
            HttpResponse& res, int wait) {
  const std::string key = p.name + ":" + IdempotencyKeyOf(req);
  std::optional<Result<SubmitResult>> handed;
  if (wait >= 0 && !ctx.stopping->load()) handed = SubmitThroughDriver(ctx, sub, key, wait);
  auto out =
      handed ? std::move(*handed) : ctx.engine->Submit(sub.spec, sub.input, key, sub.decision);
  if (!out.ok()) {
    if (out.status().code() == Code::kConflict) {
      return Problem(res, 422, "idempotency-key-reused", "Idempotency-Key reused",
                     "this Idempotency-Key was used with another request");
    }
    return ProblemFor(res, out.status());
  }
  auto rec = ctx.store->LoadSaga(out->saga_id);
  if (!rec.ok()) return ProblemFor(res, rec.status());
  res.SetHeader("Location", "/v1/sagas/" + out->saga_id);
  SendSaga(ctx, res, out->created ? 201 : 200, *rec);
  if (!handed && !ctx.stopping->load()) ctx.pool->Enqueue(out->saga_id);
}

// Prefer: wait=N (RFC 7240) on a submission: outside the key layer (which
// keeps the first answer), the saga is read again once it finished, parked
// or waits for a person, or after N seconds; 202 while it still runs.
void WaitForOutcome(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const int wait = PreferredWaitSeconds(req.Header("Prefer"));
  if (wait < 0 || (res.status != 200 && res.status != 201)) return;
  const std::string location = res.Header("Location");
  const std::string prefix = "/v1/sagas/";
  std::string id;
  if (location.compare(0, prefix.size(), prefix) == 0) {
    id = location.substr(prefix.size());
  } else {
    auto doc = ParseJson(res.body, "response");
    if (doc.ok() && doc->is_object()) id = doc->value("saga_id", "");
  }
  if (id.empty()) return;
  storage::SagaRecord rec;
  auto settled = [&] {
    auto now = ctx.store->LoadSaga(id);
    if (!now.ok()) return true;
    rec = std::move(now).value();
    auto st = ParseSagaState(rec.summary.state);
    return st && (IsTerminal(*st) || *st == SagaState::kNeedsAttention ||
                  *st == SagaState::kAwaitingApproval || *st == SagaState::kPaused ||
                  *st == SagaState::kOpen);
  };
  const bool done = ctx.waiter->WaitFor(id, wait, settled);
  if (rec.summary.saga_id.empty()) return;
  const int status = done ? res.status : 202;
  const std::string replayed = res.Header("Idempotent-Replayed");
  SendSaga(ctx, res, status, rec);
  res.SetHeader("Preference-Applied", "wait=" + std::to_string(wait));
  res.SetHeader("Location", location.empty() ? prefix + id : location);
  if (!replayed.empty()) res.SetHeader("Idempotent-Replayed", replayed);
}

}  // namespace

void PostSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  // Validated before the key layer: a malformed request stores nothing.
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth);
  if (!body) return;
  auto sub = ReadSubmission(ctx, *p, *body, res);
  if (!sub) return;
  const size_t max_key = MaxIdempotencyKeyLength();
  if (req.HasHeader("Idempotency-Key") &&
      p->name.size() + 1 + IdempotencyKeyOf(req).size() > max_key) {
    Problem(res, 400, "idempotency-key-invalid", "Invalid Idempotency-Key",
            "Idempotency-Key: at most " + std::to_string(max_key - p->name.size() - 1) +
                " characters for this caller");
    return;
  }
  const int wait = PreferredWaitSeconds(req.Header("Prefer"));
  ctx.keys->Serve(p->name, req, res, [&](const HttpRequest& r, HttpResponse& out) {
    Submit(ctx, *p, *sub, r, out, wait);
  });
  if (res.Header("Idempotent-Replayed") == "true") {
    ctx.metrics->Duplicate("stored_response");
  } else if (res.status == 409) {
    ctx.metrics->Duplicate("in_flight");
  }
  WaitForOutcome(ctx, req, res);
}

void GetSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  auto rec = OwnedSaga(ctx, *p, req.matches[1], res);
  if (!rec) return;
  SendSaga(ctx, res, 200, *rec);
}

void ListSagas(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  storage::SagaFilter f;
  if (req.HasParam("status")) {
    std::string s = req.Param("status");
    if (!ParseSagaState(s)) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "status: unknown saga state \"" + s + "\"");
    }
    f.states.push_back(s);
  }
  int limit = kDefaultListLimit;
  if (req.HasParam("limit")) {
    std::string l = req.Param("limit");
    bool digits = !l.empty() && l.size() <= 4 &&
                  std::all_of(l.begin(), l.end(), [](char c) { return c >= '0' && c <= '9'; });
    limit = digits ? std::stoi(l) : -1;
    if (limit < 1 || limit > kMaxListLimit) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "limit: expected 1.." + std::to_string(kMaxListLimit));
    }
  }
  f.owner = p->name;  // in the query, on an index (migration 14)
  f.limit = limit;
  auto list = ctx.store->ListSagas(f);
  if (!list.ok()) return ProblemFor(res, list.status());
  Json sagas = Json::array();
  for (const auto& s : *list) sagas.push_back(SummaryView(s));
  SendJson(res, 200, {{"sagas", sagas}});
}

}  // namespace idem::server
