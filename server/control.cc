// The operator endpoints: cancel, pause, resume and resolve a saga
// (docs/server.md). Cancel, pause and resume are the engine's durable
// control requests (saga/engine.h): recorded in the store, so whichever
// process drives the saga honours them. 200: carried out here (or nothing to
// do); 202: recorded, and the process driving the saga carries it out after
// the step in progress (or, for a saga that needs attention, after the
// resolve). Roles: operator for any saga; an agent may cancel its own.

#include <string>

#include "saga/decisions.h"
#include "saga/engine.h"
#include "server/auth.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"

namespace idem::server {
namespace {

enum class Verb { kCancel, kPause, kResume };

const char* VerbName(Verb v) {
  return v == Verb::kCancel ? "cancel" : v == Verb::kPause ? "pause" : "resume";
}

bool HasRole(const Principal& p, const char* role) {
  for (const std::string& r : p.roles) {
    if (r == role) return true;
  }
  return false;
}

// The body of a control request: {} or {"reason": "..."}; empty allowed.
std::optional<std::string> ReadReason(ServerContext& ctx, const HttpRequest& req,
                                      HttpResponse& res) {
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth, Json::object());
  if (!body) return std::nullopt;
  if (!body->is_object()) {
    Problem(res, 400, "invalid-request", "Invalid request", "body: expected an object");
    return std::nullopt;
  }
  for (const auto& [k, v] : body->items()) {
    if (k != "reason" || !v.is_string()) {
      Problem(res, 400, "invalid-request", "Invalid request",
              k == "reason"
                  ? "reason: expected a string"
                  : "body: unknown member \"" + k + "\" (expected {\"reason\": \"...\"})");
      return std::nullopt;
    }
  }
  return body->value("reason", "");
}

// The saga the principal may act on: an operator any, an agent its own.
std::optional<storage::SagaRecord> ActOn(const ServerContext& ctx, const Principal& p,
                                         const std::string& id, HttpResponse& res) {
  if (!HasRole(p, kRoleOperator)) return OwnedSaga(ctx, p, id, res);
  return AnySaga(ctx, id, res);
}

void SendControl(const ServerContext& ctx, HttpResponse& res, const ControlResult& out) {
  auto effects = ctx.store->ListEffects(out.saga.summary.saga_id);
  if (!effects.ok()) return ProblemFor(res, effects.status());
  Json view = SagaView(out.saga, *effects);
  view["control"] = {{"recorded", out.recorded}, {"pending", out.pending}, {"note", out.note}};
  SendJson(res, out.pending ? 202 : 200, view);
}

void Control(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, Verb verb) {
  const Principal* p = verb == Verb::kCancel
                           ? ctx.auth->Authorize(req, res, {kRoleAgent, kRoleOperator})
                           : ctx.auth->Authorize(req, res, {kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto reason = ReadReason(ctx, req, res);
  if (!reason) return;
  if (!ActOn(ctx, *p, id, res)) return;
  ControlRequest cr;
  cr.who = p->name;
  cr.reason = *reason;
  // A resume drives the rest of the saga: the drivers do that, not this
  // request. Cancel and pause are carried out here when the saga is free
  // (held from this server's drivers meanwhile).
  const bool held = verb != Verb::kResume && ctx.pool->BeginDrive(id);
  cr.drive = held;
  Result<ControlResult> out = Status::Internal("unset");
  switch (verb) {
    case Verb::kCancel:
      out = ctx.engine->Cancel(id, cr);
      break;
    case Verb::kPause:
      out = ctx.engine->Pause(id, cr);
      break;
    case Verb::kResume:
      out = ctx.engine->Resume(id, cr);
      break;
  }
  if (held) ctx.pool->EndDrive(id);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kFailedPrecondition) {
      return Problem(res, 409, std::string(VerbName(verb)) + "-not-possible",
                     std::string("Cannot ") + VerbName(verb), s.message());
    }
    return ProblemFor(res, s);
  }
  if (out->pending) {
    ctx.pool->Enqueue(id);  // a driver here honours it (SQLite) ...
    ctx.pool->Kick();       // ... or the sweeper (leases) picks the saga up
  }
  SendControl(ctx, res, *out);
}

}  // namespace

void CancelSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  Control(ctx, req, res, Verb::kCancel);
}

void PauseSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  Control(ctx, req, res, Verb::kPause);
}

void ResumeSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  Control(ctx, req, res, Verb::kResume);
}

void ResolveSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth, Json::object());
  if (!body) return;
  auto bad = [&](const std::string& detail) {
    Problem(res, 400, "invalid-request", "Invalid request", detail);
  };
  if (!body->is_object()) return bad("body: expected an object");
  for (const auto& [k, v] : body->items()) {
    if (k == "result") {
      if (!v.is_object()) return bad("result: expected an object");
    } else if (k == "step" || k == "decision" || k == "note" || k == "reason") {
      if (!v.is_string()) return bad(k + ": expected a string");
    } else {
      return bad("body: unknown member \"" + k +
                 "\" (expected step, decision, result, note, reason)");
    }
  }
  if (body->value("step", "").empty()) return bad("step: required");
  auto decision = ParseDecision(body->value("decision", ""));
  if (!decision.ok()) return bad("decision: " + decision.status().message());
  if (!ActOn(ctx, *p, id, res)) return;
  Resolution r;
  r.step_id = body->value("step", "");
  r.decision = *decision;
  r.result = body->contains("result") ? (*body)["result"] : Json::object();
  r.who = p->name;
  r.note = body->value("note", "");
  if (r.note.empty()) r.note = body->value("reason", "");
  if (!ctx.pool->BeginDrive(id)) {
    res.SetHeader("Retry-After", "1");
    return Problem(res, 409, "saga-busy", "Saga is being driven",
                   "the saga is busy; resolve again in a moment");
  }
  auto out = ctx.engine->Resolve(id, r);
  ctx.pool->EndDrive(id);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kFailedPrecondition) {
      return Problem(res, 409, "resolve-not-possible", "Cannot resolve", s.message());
    }
    if (s.code() == Code::kUnavailable) {
      res.SetHeader("Retry-After", "1");
      return Problem(res, 409, "saga-busy", "Saga is being driven", s.message());
    }
    return ProblemFor(res, s);
  }
  SendSaga(ctx, res, 200, *out);
}

}  // namespace idem::server
