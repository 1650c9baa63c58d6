// The open-saga resource (docs/server.md "Open sagas"): begin, call, read a
// call, commit, roll back. The engine does the work (saga/open_saga.h);
// this file reads bodies, maps answers to statuses and waits for outcomes
// when asked (`Prefer: wait=N`, server/waiter.h).

#include <initializer_list>
#include <optional>
#include <string>

#include "saga/engine.h"
#include "saga/open_saga.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/handlers.h"
#include "server/problem.h"
#include "server/resources.h"
#include "server/waiter.h"

#include "common/json_util.h"

namespace idem::server {
namespace {

bool OnlyFields(const Json& body, std::initializer_list<const char*> allowed, HttpResponse& res) {
  if (!body.is_object()) {
    Problem(res, 400, "invalid-request", "Invalid request", "body: expected a JSON object");
    return false;
  }
  for (const auto& [k, v] : body.items()) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) {
      Problem(res, 400, "invalid-request", "Invalid request", "body: unknown field \"" + k + "\"");
      return false;
    }
  }
  return true;
}

// The optional "decision" member; false (and a 422) when malformed.
bool ReadDecision(const ServerContext& ctx, const Json& body, std::optional<ModelDecision>* out,
                  HttpResponse& res) {
  if (!body.contains("decision") || body["decision"].is_null()) return true;
  auto d = ParseModelDecision(body["decision"], "decision",
                              ctx.engine->options().limits.max_decision_text_bytes);
  if (!d.ok()) {
    Problem(res, 422, "invalid-decision", "Invalid model decision", d.status().message());
    return false;
  }
  *out = std::move(d).value();
  return true;
}

Json Links(const std::string& id) {
  const std::string base = "/v1/sagas/" + id;
  return {{"self", base},
          {"calls", base + "/calls"},
          {"commit", base + "/commit"},
          {"rollback", base + "/rollback"}};
}

Json OpenSagaView(const ServerContext& ctx, const storage::SagaRecord& rec) {
  auto plan = ReadOpenPlan(rec.spec);
  auto journal = ctx.store->ReadJournal(rec.summary.saga_id);
  Json view = {{"saga_id", rec.summary.saga_id},
               {"state", rec.summary.state},
               {"reason", rec.summary.reason},
               {"intent_key", ClientKeyOf(rec.summary.intent_key)},
               {"tools", plan.ok() ? Json(plan->tools) : Json::array()},
               {"metadata", plan.ok() ? plan->metadata : Json::object()},
               {"idle_timeout_ms", plan.ok() ? plan->idle_timeout_ms : 0},
               {"on_idle", plan.ok() && plan->on_idle == OnIdle::kPark ? "park" : "rollback"},
               {"created_at", FormatTimeMs(rec.summary.created_ms)},
               {"updated_at", FormatTimeMs(rec.summary.updated_ms)},
               {"links", Links(rec.summary.saga_id)}};
  view["calls"] = journal.ok() ? OpenCallsView(rec, *journal) : Json::array();
  view["decision"] = journal.ok() ? SubmissionDecision(*journal) : Json();
  return view;
}

Json CallView(const Principal& p, const std::string& saga_id, const CallAnswer& a) {
  Json v = {{"saga_id", saga_id},
            {"call_id", a.call_id},
            {"step_id", a.step_id},
            {"tool", a.tool},
            {"state", a.state},
            {"saga_state", a.saga_state},
            {"deduplicated", a.deduplicated},
            {"links",
             {{"self", "/v1/sagas/" + saga_id + "/calls/" + a.call_id},
              {"saga", "/v1/sagas/" + saga_id}}}};
  if (a.deduplicated) {
    v["duplicate_of"] = a.duplicate_of;
    v["reason"] = a.duplicate_reason;
  }
  if (a.state == "succeeded" || a.state == "compensated" || a.state == "compensating" ||
      a.state == "compensation_failed") {
    v["result"] = a.result;
  }
  if (a.state == "failed" || a.state == "needs_attention" || a.state == "unknown") {
    v["error"] = {{"code", a.state == "failed" ? "tool-failed" : a.state},
                  {"message", a.error},
                  {"retryable", false}};
  }
  if (auto approval = ApprovalView(saga_id, a.step)) {
    const std::string token = (*approval)["token"].get<std::string>();
    const bool approver = HasRole(p, kRoleApprover);
    const Json& preview = (*approval)["preview"];
    Json view = {
        {"summary", preview.value("summary", "")},
        {"changes", preview.value("changes", Json::object())},
        {"arguments", a.step.args},
        {"expires_at", (*approval)["expires_at"]},
        {"token_ref", Sha256Hex(token).substr(0, 16)},
        {"approve_at",
         {{"cli", approver ? "idem approve " + token : "idem approve TOKEN"},
          {"api", "/v1/approvals/" + (approver ? token : std::string("{token}")) + "/approve"},
          {"ui", "/ui/approvals/" + saga_id + "/" + a.step_id}}}};
    if (approver) view["token"] = token;
    v["approval"] = view;
  }
  return v;
}

// Waits (Prefer: wait=N) for the call to settle, then sends it: 200 once
// settled, 202 while it waits for a person or an outcome.
void SendCall(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, const Principal& p,
              const std::string& saga_id, CallAnswer answer) {
  const int wait = PreferredWaitSeconds(req.Header("Prefer"));
  if (!answer.settled() && wait > 0) {
    const std::string call_id = answer.call_id;
    CallAnswer seen = answer;
    ctx.waiter->WaitFor(saga_id, wait, [&] {
      auto rec = ctx.store->LoadSaga(saga_id);
      if (!rec.ok()) return true;
      // A call answered by an earlier one is looked up under that one's id.
      auto now = AnswerCall(*rec, seen.duplicate_of.empty() ? call_id : seen.duplicate_of);
      if (!now.ok()) return true;
      // Keep what the first answer said of itself (its id, the duplicate).
      now->call_id = seen.call_id;
      now->deduplicated = seen.deduplicated;
      now->duplicate_of = seen.duplicate_of;
      now->duplicate_reason = seen.duplicate_reason;
      answer = *now;
      return answer.settled();
    });
    res.SetHeader("Preference-Applied", "wait=" + std::to_string(wait));
  }
  SendJson(res, answer.settled() ? 200 : 202, CallView(p, saga_id, answer));
}

void SendRefusal(HttpResponse& res, const CallAnswer& a) {
  switch (a.refusal) {
    case CallRefusal::kToolNotAllowed:
      return Problem(res, 403, "tool-not-allowed", "Tool not allowed", a.message);
    case CallRefusal::kSagaNotOpen:
      return Problem(res, 409, "saga-not-open", "Saga not open", a.message);
    case CallRefusal::kCallPending:
      return Problem(res, 409, "call-pending", "An earlier call is unsettled", a.message);
    case CallRefusal::kCallIdReused:
      return Problem(res, 409, "call-id-reused", "Call id reused for another call", a.message,
                     {{"code", "call-id-reused"},
                      {"call_id", a.call_id},
                      {"step_id", a.step_id},
                      {"recorded_tool", a.tool},
                      {"recorded_args_fingerprint", a.args_fingerprint},
                      {"tool", a.request_tool},
                      {"args_fingerprint", a.request_fingerprint}});
    case CallRefusal::kBusy:
    case CallRefusal::kNone:
      res.SetHeader("Retry-After", "1");
      return Problem(res, 409, "call-in-progress", "Another call is in progress", a.message);
  }
}

void Begin(ServerContext& ctx, const Principal& p, const Json& body, const BeginRequest& br,
           HttpResponse& res) {
  (void)body;
  auto out = ctx.engine->Begin(br);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kConflict) {
      return Problem(res, 409, "intent-conflict", "Intent key reused",
                     "intent_key " + ClientKeyOf(br.intent_key) +
                         " was begun with another body (tools, metadata, idle policy)");
    }
    if (s.code() == Code::kInvalidArgument) {
      return Problem(res, 422, "invalid-open-saga", "Invalid open saga", s.message());
    }
    return ProblemFor(res, s);
  }
  auto rec = ctx.store->LoadSaga(out->saga_id);
  if (!rec.ok()) return ProblemFor(res, rec.status());
  (void)p;
  res.SetHeader("Location", "/v1/sagas/" + out->saga_id);
  SendJson(res, out->created ? 201 : 200, OpenSagaView(ctx, *rec));
}

}  // namespace

void PostOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent});
  if (p == nullptr) return;
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth);
  if (!body) return;
  if (!OnlyFields(*body, {"intent_key", "tools", "metadata", "idle_timeout", "on_idle", "decision"},
                  res)) {
    return;
  }
  BeginRequest br;
  const Json& b = *body;
  if (!b.contains("intent_key") || !b["intent_key"].is_string() ||
      b["intent_key"].get<std::string>().empty()) {
    return Problem(res, 422, "invalid-open-saga", "Invalid open saga",
                   "intent_key: required, a non-empty string");
  }
  br.intent_key = p->name + ":" + b["intent_key"].get<std::string>();
  if (!b.contains("tools") || !b["tools"].is_array()) {
    return Problem(res, 422, "invalid-open-saga", "Invalid open saga",
                   "tools: required, an array of tool names");
  }
  for (size_t i = 0; i < b["tools"].size(); ++i) {
    if (!b["tools"][i].is_string()) {
      return Problem(res, 422, "invalid-open-saga", "Invalid open saga",
                     "tools[" + std::to_string(i) + "]: expected a tool name");
    }
    br.tools.push_back(b["tools"][i].get<std::string>());
  }
  br.metadata = b.value("metadata", Json::object());
  if (b.contains("idle_timeout") && !b["idle_timeout"].is_null()) {
    br.idle_timeout_ms = ParseDurationMs(b["idle_timeout"]);
    if (br.idle_timeout_ms <= 0) {
      return Problem(res, 422, "invalid-open-saga", "Invalid open saga",
                     "idle_timeout: seconds, or a duration such as \"30s\", \"15m\", \"24h\" "
                     "(at most 30 days)");
    }
  }
  if (b.contains("on_idle")) {
    if (b["on_idle"] == "park") {
      br.on_idle = OnIdle::kPark;
    } else if (b["on_idle"] != "rollback") {
      return Problem(res, 422, "invalid-open-saga", "Invalid open saga",
                     "on_idle: expected \"rollback\" or \"park\"");
    }
  }
  if (!ReadDecision(ctx, b, &br.decision, res)) return;
  if (req.HasHeader("Idempotency-Key")) {
    ctx.keys->Serve(p->name, req, res,
                    [&](const HttpRequest&, HttpResponse& out) { Begin(ctx, *p, b, br, out); });
    return;
  }
  Begin(ctx, *p, b, br, res);
}

void PostCall(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth);
  if (!body) return;
  if (!OnlyFields(*body, {"call_id", "tool", "args", "repeat", "decision"}, res)) return;
  if (!ActOnSaga(ctx, *p, id, res)) return;
  const Json& b = *body;
  CallRequest cr;
  if (!b.contains("call_id") || !b["call_id"].is_string()) {
    return Problem(res, 422, "invalid-call", "Invalid call", "call_id: required, a string");
  }
  cr.call_id = b["call_id"].get<std::string>();
  if (!b.contains("tool") || !b["tool"].is_string()) {
    return Problem(res, 422, "invalid-call", "Invalid call", "tool: required, a tool name");
  }
  cr.tool = b["tool"].get<std::string>();
  cr.args = b.value("args", Json::object());
  cr.who = p->name;  // the requester of the call's effect: never its approver
  if (b.contains("repeat")) {
    if (!b["repeat"].is_boolean()) {
      return Problem(res, 422, "invalid-call", "Invalid call", "repeat: expected true or false");
    }
    cr.repeat = b["repeat"].get<bool>();
  }
  if (!ReadDecision(ctx, b, &cr.decision, res)) return;
  auto out = ctx.engine->Call(id, cr);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kInvalidArgument) {
      return Problem(res, 422, "invalid-call", "Invalid call", s.message());
    }
    return ProblemFor(res, s);
  }
  if (out->refusal != CallRefusal::kNone) return SendRefusal(res, *out);
  SendCall(ctx, req, res, *p, id, std::move(out).value());
}

void GetCall(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto rec = ActOnSaga(ctx, *p, id, res);
  if (!rec) return;
  auto out = AnswerCall(*rec, req.matches[2]);
  if (!out.ok()) {
    if (out.status().code() == Code::kNotFound) {
      return Problem(res, 404, "not-found", "Not found", out.status().message());
    }
    return Problem(res, 409, "saga-not-open", "Not an open saga", out.status().message());
  }
  SendCall(ctx, req, res, *p, id, std::move(out).value());
}

void CommitOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth, Json::object());
  if (!body) return;
  if (!OnlyFields(*body, {"decision"}, res)) return;
  if (!ActOnSaga(ctx, *p, id, res)) return;
  std::optional<ModelDecision> decision;
  if (!ReadDecision(ctx, *body, &decision, res)) return;
  auto out = ctx.engine->Commit(id, p->name, decision);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kFailedPrecondition) {
      auto rec = ctx.store->LoadSaga(id);
      const bool unsettled =
          rec.ok() && (rec->summary.state == SagaStateName(SagaState::kAwaitingApproval) ||
                       rec->summary.state == SagaStateName(SagaState::kRunning) ||
                       rec->summary.state == SagaStateName(SagaState::kNeedsAttention));
      return Problem(res, 409, unsettled ? "calls-pending" : "saga-not-open",
                     unsettled ? "A call is unsettled" : "Saga not open", s.message());
    }
    if (s.code() == Code::kUnavailable) res.SetHeader("Retry-After", "1");
    return ProblemFor(res, s);
  }
  SendJson(res, 200, OpenSagaView(ctx, *out));
}

void RollbackOpenSaga(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const Principal* p = ctx.auth->Authorize(req, res, {kRoleAgent, kRoleOperator});
  if (p == nullptr) return;
  const std::string id = req.matches[1];
  auto body = ReadJsonBody(req, res, ctx.options->max_json_depth, Json::object());
  if (!body) return;
  if (!OnlyFields(*body, {"reason"}, res)) return;
  if (body->contains("reason") && !(*body)["reason"].is_string()) {
    return Problem(res, 400, "invalid-request", "Invalid request", "reason: expected a string");
  }
  if (!ActOnSaga(ctx, *p, id, res)) return;
  ControlRequest cr;
  cr.who = p->name;
  cr.reason = body->value("reason", "");
  const bool held = ctx.pool->BeginDrive(id);  // from this server's drivers meanwhile
  cr.drive = held;
  auto out = ctx.engine->Rollback(id, cr);
  if (held) ctx.pool->EndDrive(id);
  if (!out.ok()) {
    const Status& s = out.status();
    if (s.code() == Code::kFailedPrecondition) {
      return Problem(res, 409, "saga-not-open", "Saga not open", s.message());
    }
    return ProblemFor(res, s);
  }
  if (out->pending) {
    ctx.pool->Enqueue(id);
    ctx.pool->Kick();
  }
  storage::SagaRecord rec = out->saga;
  auto finished = [&] {
    auto now = ctx.store->LoadSaga(id);
    if (!now.ok()) return true;
    rec = std::move(now).value();
    auto st = ParseSagaState(rec.summary.state);
    return st && (IsTerminal(*st) || *st == SagaState::kNeedsAttention);
  };
  const int wait = PreferredWaitSeconds(req.Header("Prefer"));
  bool done = finished();
  if (!done && wait > 0) {
    done = ctx.waiter->WaitFor(id, wait, finished);
    res.SetHeader("Preference-Applied", "wait=" + std::to_string(wait));
  }
  Json view = OpenSagaView(ctx, rec);
  view["control"] = {{"recorded", out->recorded}, {"pending", out->pending}, {"note", out->note}};
  SendJson(res, done ? 200 : 202, view);
}

}  // namespace idem::server
