// Open sagas (saga/open_saga.h): the plan helpers, and Engine::Begin, Call,
// GetCall, Commit and Rollback.

#include "saga/open_saga.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "saga/completion.h"
#include "saga/engine.h"
#include "saga/limits.h"
#include "saga/machines.h"
#include "saga/states.h"

#include "common/failpoint.h"
#include "common/time_ordered_id.h"
#include "effect/mutation.h"

namespace idem {
namespace {

constexpr const char* kOpenPlanName = "open";
constexpr size_t kMaxCallIdBytes = 200;

Status Bad(const std::string& place, const std::string& problem) {
  return Status::InvalidArgument(place + ": " + problem);
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

const char* OnIdleName(OnIdle o) { return o == OnIdle::kPark ? "park" : "rollback"; }

// `v` with every string value (not key) replaced by f(string), at any depth.
Json MapStrings(const Json& v, const std::function<std::string(const std::string&)>& f) {
  if (v.is_string()) return f(v.get_ref<const std::string&>());
  if (v.is_object()) {
    Json out = Json::object();
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = MapStrings(*it, f);
    return out;
  }
  if (v.is_array()) {
    Json out = Json::array();
    for (const Json& x : v) out.push_back(MapStrings(x, f));
    return out;
  }
  return v;
}

// Every "${" becomes "$${" (a literal): an agent's arguments are data, never
// templates.
std::string EscapeString(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "${") == 0) out += '$';
    out += s[i];
  }
  return out;
}

// EscapeString undone: each "$${" back to "${" (the arguments as the agent
// sent them).
std::string UnescapeString(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
    } else {
      out += s[i++];
    }
  }
  return out;
}

// The registry's compensation templates (`${args.x}`, `${result.x}`) as a
// spec's for step `step_id` (`${steps.<id>.args.x}`, ...). `$${` stays literal.
std::string RebaseString(const std::string& s, const std::string& step_id) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 3, "$${") == 0) {
      out += "$${";
      i += 3;
    } else if (s.compare(i, 2, "${") == 0) {
      out += "${";
      i += 2;
      for (const char* root : {"args", "result"}) {
        const size_t n = std::char_traits<char>::length(root);
        if (s.compare(i, n, root) == 0 && i + n < s.size() &&
            (s[i + n] == '.' || s[i + n] == '}')) {
          out += "steps." + step_id + ".";
          break;
        }
      }
    } else {
      out += s[i++];
    }
  }
  return out;
}

// The spec step an open saga's call becomes.
Json CallStep(const std::string& step_id, const ToolInfo& info, const Json& args) {
  Json step = {{"id", step_id}, {"tool", info.name}, {"args", MapStrings(args, EscapeString)}};
  const OpenCallPolicy& p = info.open;
  if (!p.compensate_tool.empty()) {
    step["compensate"] = {{"tool", p.compensate_tool},
                          {"args", MapStrings(p.compensate_args, [&](const std::string& x) {
                             return RebaseString(x, step_id);
                           })}};
  } else if (!p.no_compensation_reason.empty()) {
    step["compensate"] = nullptr;
    step["reason"] = p.no_compensation_reason;
  }
  if (p.two_phase) step["two_phase"] = true;
  if (p.human_approval) {
    step["approval"] = "human";
  } else if (!p.no_approval_reason.empty()) {
    // One "reason" says why there is no compensation and why nobody approves.
    step["approval"] = "none";
    const std::string said = step.value("reason", "");
    step["reason"] = said.empty() || said == p.no_approval_reason
                         ? p.no_approval_reason
                         : said + "; " + p.no_approval_reason;
  }
  return step;
}

bool IsHex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool ValidCallId(const std::string& id) {
  return !id.empty() && id.size() <= kMaxCallIdBytes &&
         std::all_of(id.begin(), id.end(),
                     [](char c) { return static_cast<unsigned char>(c) > 0x20 && c != 0x7f; });
}

// An awaiting_completion saga whose waiting call's check is due (or has
// none): the caller drives it, as the sweeper would (saga/completion.h).
bool CompletionDue(storage::Store* store, const std::string& saga_id, int64_t now_ms) {
  auto earliest = completion::EarliestCheck(store, saga_id);
  return earliest.ok() && (!earliest->has_value() || **earliest <= now_ms);
}

// A step's state as a call's answer shows it.
std::string CallState(const storage::StepRecord& st) {
  auto s = ParseStepState(st.state);
  if (!s) return st.state;
  switch (*s) {
    case StepState::kPlanned:
    case StepState::kPreviewed:
    case StepState::kSubmitted:
      return "processing";
    case StepState::kUnknown:
      return "unknown";
    case StepState::kCompensating:
    case StepState::kCompensated:
    case StepState::kCompensationFailed:
      return StepStateName(*s);
    default:
      return st.state;
  }
}

// The Fingerprint of the arguments call `index` was made with: its plan
// step's literal arguments, unescaped.
std::string RecordedFingerprint(const storage::SagaRecord& rec, int index) {
  if (!rec.spec.is_object()) return "";
  auto steps = rec.spec.find("steps");
  if (steps == rec.spec.end() || !steps->is_array() || static_cast<size_t>(index) >= steps->size())
    return "";
  const Json& step = (*steps)[static_cast<size_t>(index)];
  auto args = step.find("args");
  return Fingerprint(MapStrings(args != step.end() ? *args : Json::object(), UnescapeString));
}

CallAnswer AnswerFor(const storage::SagaRecord& rec, int index, const std::string& call_id) {
  const storage::StepRecord& st = rec.steps[static_cast<size_t>(index)];
  CallAnswer a;
  a.call_id = call_id;
  a.step_id = st.step_id;
  a.tool = st.tool;
  a.args_fingerprint = RecordedFingerprint(rec, index);
  a.state = CallState(st);
  a.result = st.result;
  a.error = st.error;
  a.saga_state = rec.summary.state;
  a.step = st;
  return a;
}

CallAnswer Refuse(CallRefusal r, std::string message, const storage::SagaRecord& rec) {
  CallAnswer a;
  a.refusal = r;
  a.message = std::move(message);
  a.saga_state = rec.summary.state;
  return a;
}

// The answer to a call whose id is known (`known`, as recorded): the
// recorded answer when the tool and arguments are the same, else a
// kCallIdReused refusal naming both fingerprints.
CallAnswer AnswerKnownCall(CallAnswer known, const CallRequest& request,
                           const storage::SagaRecord& rec) {
  const std::string fp = Fingerprint(request.args);
  const bool other_intent = known.tool != request.tool || known.args_fingerprint != fp;
  // The test-only switch puts back the defect this replaced: any arguments
  // got the recorded answer, flagged deduplicated.
  if (other_intent && !effect::Mutated(effect::Mutation::kCallIdIgnoresArguments)) {
    CallAnswer a =
        Refuse(CallRefusal::kCallIdReused,
               "call_id " + Quoted(request.call_id) + " was recorded for tool " +
                   Quoted(known.tool) + " with arguments " + known.args_fingerprint +
                   "; this call has tool " + Quoted(request.tool) + " with arguments " + fp +
                   ": a call id names one intent, so a new call needs a new call_id (nothing was "
                   "called)",
               rec);
    a.call_id = request.call_id;
    a.step_id = known.step_id;
    a.tool = known.tool;
    a.args_fingerprint = known.args_fingerprint;
    a.request_fingerprint = fp;
    a.request_tool = request.tool;
    return a;
  }
  if (!known.deduplicated) {  // an alias already names the call it repeats
    known.deduplicated = true;
    known.duplicate_of = request.call_id;
    known.duplicate_reason = "same call_id";
  }
  return known;
}

// Gives a lease up on every way out unless a drive or a batch released it.
class LeaseGuard {
 public:
  LeaseGuard(storage::Store* store, storage::Lease lease)
      : store_(store), lease_(std::move(lease)) {}
  ~LeaseGuard() {
    if (held_ && lease_.epoch != 0) (void)store_->ReleaseLease(lease_);
  }
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;
  const storage::Lease& lease() const { return lease_; }
  /// The lease is handed on (to a drive, or a batch that releases it).
  void Released() { held_ = false; }

 private:
  storage::Store* store_;
  storage::Lease lease_;
  bool held_ = true;
};

}  // namespace

class Engine::ProcessHold {
 public:
  ProcessHold(Engine* engine, std::string saga_id, bool want)
      : engine_(engine), saga_id_(std::move(saga_id)) {
    held_ = want && engine_->TryHold(saga_id_);
    ok_ = !want || held_;
  }
  ~ProcessHold() {
    if (held_) engine_->Unhold(saga_id_);
  }
  ProcessHold(const ProcessHold&) = delete;
  ProcessHold& operator=(const ProcessHold&) = delete;
  bool ok() const { return ok_; }      ///< held, or not wanted (a store lease holds it)
  bool held() const { return held_; }  ///< this scope holds it

 private:
  Engine* engine_;
  std::string saga_id_;
  bool held_ = false;
  bool ok_ = false;
};

// ---- decisions

Json ModelDecision::ToJson() const {
  Json j = {{"model", model}, {"prompt_sha256", prompt_sha256}};
  if (!message_id.empty()) j["message_id"] = message_id;
  if (!call_id.empty()) j["call_id"] = call_id;
  if (!prompt.empty()) j["prompt"] = prompt;
  if (!reasoning.empty()) j["reasoning"] = reasoning;
  return j;
}

Result<ModelDecision> ParseModelDecision(const Json& doc, const std::string& where,
                                         size_t max_text_bytes) {
  if (!doc.is_object()) return Bad(where, "expected an object");
  ModelDecision d;
  const std::pair<const char*, std::string*> fields[] = {
      {"model", &d.model},     {"message_id", &d.message_id},
      {"call_id", &d.call_id}, {"prompt_sha256", &d.prompt_sha256},
      {"prompt", &d.prompt},   {"reasoning", &d.reasoning}};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    auto f = std::find_if(std::begin(fields), std::end(fields),
                          [&](const auto& x) { return it.key() == x.first; });
    if (f == std::end(fields)) return Bad(where + "." + it.key(), "unknown field");
    if (!it->is_string()) return Bad(where + "." + it.key(), "expected a string");
    *f->second = it->get<std::string>();
  }
  if (d.model.empty()) return Bad(where + ".model", "is required");
  if (d.model.size() > 200) return Bad(where + ".model", "longer than 200 bytes");
  if (d.message_id.size() > kMaxCallIdBytes)
    return Bad(where + ".message_id", "longer than 200 bytes");
  if (d.call_id.size() > kMaxCallIdBytes) return Bad(where + ".call_id", "longer than 200 bytes");
  if (!IsHex64(d.prompt_sha256)) {
    return Bad(where + ".prompt_sha256", "expected 64 lower-case hex digits (SHA-256)");
  }
  using Text = std::pair<const char*, const std::string*>;
  for (const Text& t : {Text{"prompt", &d.prompt}, Text{"reasoning", &d.reasoning}}) {
    const char* name = t.first;
    const std::string* text = t.second;
    if (text->size() > max_text_bytes) {
      return Bad(where + "." + name, std::to_string(text->size()) +
                                         " bytes, more than max_decision_text_bytes (" +
                                         std::to_string(max_text_bytes) + " bytes)");
    }
  }
  return d;
}

// ---- plans

const char* CallRefusalName(CallRefusal r) {
  switch (r) {
    case CallRefusal::kNone:
      return "none";
    case CallRefusal::kSagaNotOpen:
      return "saga-not-open";
    case CallRefusal::kToolNotAllowed:
      return "tool-not-allowed";
    case CallRefusal::kCallPending:
      return "call-pending";
    case CallRefusal::kBusy:
      return "busy";
    case CallRefusal::kCallIdReused:
      return "call-id-reused";
  }
  return "?";
}

bool CallAnswer::settled() const {
  return refusal == CallRefusal::kNone &&
         (state == "succeeded" || state == "failed" || state == "compensated");
}

bool IsOpenPlan(const Json& spec) { return spec.is_object() && spec.contains("open"); }

Result<OpenPlan> ReadOpenPlan(const Json& spec) {
  if (!IsOpenPlan(spec) || !spec["open"].is_object()) return Bad("spec.open", "not an open saga");
  const Json& o = spec["open"];
  OpenPlan p;
  try {
    for (const Json& t : o.at("tools")) p.tools.push_back(t.get<std::string>());
    p.metadata = o.value("metadata", Json::object());
    p.idle_timeout_ms = o.value("idle_timeout_ms", int64_t{0});
    p.on_idle = o.value("on_idle", "rollback") == "park" ? OnIdle::kPark : OnIdle::kRollback;
    for (const Json& c : o.value("calls", Json::array())) {
      p.calls.push_back(
          {c.at("call_id").get<std::string>(), c.at("step").get<std::string>(), c.value("by", "")});
    }
    for (const Json& c : o.value("aliases", Json::array())) {
      p.aliases.push_back(
          {c.at("call_id").get<std::string>(), c.at("step").get<std::string>(), ""});
    }
  } catch (const std::exception& e) {
    return Bad("spec.open", std::string("malformed: ") + e.what());
  }
  return p;
}

Result<SagaSpec> ParseOpenPlan(const Json& doc, const ToolRegistry& tools) {
  auto plan = ReadOpenPlan(doc);
  if (!plan.ok()) return plan.status();
  Json plain = doc;
  plain.erase("open");
  if (!plain.contains("steps") || !plain["steps"].is_array() || plain["steps"].empty()) {
    SagaSpec spec;
    spec.name = plain.value("name", kOpenPlanName);
    spec.raw = doc;
    return spec;
  }
  auto spec = ParseSpec(plain, tools);
  if (!spec.ok()) return spec.status();
  spec->raw = doc;
  return spec;
}

Result<SagaSpec> ParseStoredPlan(const Json& doc, const ToolRegistry& tools) {
  return IsOpenPlan(doc) ? ParseOpenPlan(doc, tools) : ParseSpec(doc, tools);
}

Status CheckOpenTool(const ToolRegistry& tools, const std::string& name, const std::string& where) {
  Tool* tool = tools.Find(name);
  if (tool == nullptr) return Bad(where, "unknown tool " + Quoted(name));
  const ToolInfo& info = tool->info();
  const OpenCallPolicy& p = info.open;
  const bool writes =
      info.effect == EffectClass::kWrite || info.effect == EffectClass::kIrreversible;
  if (writes && p.compensate_tool.empty() && p.no_compensation_reason.empty()) {
    return Bad(where, "tool " + Quoted(name) + " is " + EffectClassName(info.effect) +
                          " and its registry entry names no compensation: declare one, or "
                          "\"compensate\": null with a \"reason\"");
  }
  if (!p.compensate_tool.empty() && tools.Find(p.compensate_tool) == nullptr) {
    return Bad(where,
               "tool " + Quoted(name) + ": unknown compensation tool " + Quoted(p.compensate_tool));
  }
  if (p.two_phase && !info.has_preview) {
    return Bad(where, "tool " + Quoted(name) + " is two-phase but offers no preview");
  }
  if (info.effect == EffectClass::kIrreversible && !(p.two_phase && p.human_approval) &&
      p.no_approval_reason.empty()) {
    return Bad(where, "tool " + Quoted(name) +
                          " is irreversible: make its registry entry two_phase with \"approval\": "
                          "\"human\", or say \"approval\": \"none\" with a \"reason\"");
  }
  return Status::Ok();
}

bool OpenIdleDue(const storage::SagaRecord& saga, int64_t now_ms) {
  if (saga.summary.state != SagaStateName(SagaState::kOpen)) return false;
  auto plan = ReadOpenPlan(saga.spec);
  if (!plan.ok() || plan->idle_timeout_ms <= 0) return false;
  return now_ms >= saga.summary.updated_ms + plan->idle_timeout_ms;
}

Status AddIdleDue(storage::Store* store, int64_t now_ms, std::vector<storage::SagaSummary>* list) {
  storage::SagaFilter f;
  f.states = {SagaStateName(SagaState::kOpen)};
  f.limit = 1'000'000;
  auto open = store->ListSagas(f);
  if (!open.ok()) return open.status();
  for (const storage::SagaSummary& s : *open) {
    auto rec = store->LoadSaga(s.saga_id);
    if (rec.ok() && OpenIdleDue(*rec, now_ms)) list->push_back(rec->summary);
  }
  return Status::Ok();
}

Result<CallAnswer> AnswerCall(const storage::SagaRecord& saga, const std::string& call_id) {
  auto plan = ReadOpenPlan(saga.spec);
  if (!plan.ok())
    return Status::FailedPrecondition("saga " + saga.summary.saga_id + " is not an open saga");
  for (size_t i = 0; i < plan->calls.size() && i < saga.steps.size(); ++i) {
    if (plan->calls[i].call_id == call_id) return AnswerFor(saga, static_cast<int>(i), call_id);
  }
  for (const OpenPlan::Call& alias : plan->aliases) {
    if (alias.call_id != call_id) continue;
    for (size_t i = 0; i < plan->calls.size() && i < saga.steps.size(); ++i) {
      if (plan->calls[i].step_id != alias.step_id) continue;
      CallAnswer a = AnswerFor(saga, static_cast<int>(i), plan->calls[i].call_id);
      a.call_id = call_id;
      a.deduplicated = true;
      a.duplicate_of = plan->calls[i].call_id;
      a.duplicate_reason = "same tool and arguments";
      return a;
    }
  }
  return Status::NotFound("saga " + saga.summary.saga_id + " has no call " + Quoted(call_id));
}

Json SubmissionDecision(const std::vector<storage::JournalEntry>& journal) {
  for (const storage::JournalEntry& e : journal) {
    if (e.event == "saga_created")
      return e.data.is_object() ? e.data.value("decision", Json()) : Json();
  }
  return Json();
}

Json OpenCallsView(const storage::SagaRecord& saga,
                   const std::vector<storage::JournalEntry>& journal) {
  Json out = Json::array();
  auto plan = ReadOpenPlan(saga.spec);
  if (!plan.ok()) return out;
  for (size_t i = 0; i < plan->calls.size() && i < saga.steps.size(); ++i) {
    CallAnswer a = AnswerFor(saga, static_cast<int>(i), plan->calls[i].call_id);
    Json decision;
    bool repeat = false;
    for (const storage::JournalEntry& e : journal) {
      if (e.event == "call_appended" && e.step_id == a.step_id && e.data.is_object()) {
        decision = e.data.value("decision", Json());
        repeat = e.data.value("repeat", false);
      }
    }
    out.push_back({{"call_id", a.call_id},
                   {"step_id", a.step_id},
                   {"tool", a.tool},
                   {"state", a.state},
                   {"args", a.step.args},
                   {"result", a.result},
                   {"error", a.error},
                   {"repeat", repeat},
                   {"decision", decision}});
  }
  return out;
}

// ---- the engine's calls

Result<BeginResult> Engine::Begin(const BeginRequest& request) {
  if (request.intent_key.empty()) return Bad("intent_key", "must not be empty");
  if (request.intent_key.size() > 255) return Bad("intent_key", "longer than 255 bytes");
  if (request.tools.empty()) return Bad("tools", "name at least one tool");
  std::set<std::string> seen;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    IDEM_RETURN_IF_ERROR(CheckOpenTool(*tools_, request.tools[i], where));
    if (!seen.insert(request.tools[i]).second) {
      return Bad(where, "tool " + Quoted(request.tools[i]) + " is listed twice");
    }
  }
  if (!request.metadata.is_object()) return Bad("metadata", "expected a JSON object");
  if (JsonBytes(request.metadata, options_.limits.max_arg_bytes + 1) >
      options_.limits.max_arg_bytes) {
    return Bad("metadata", "larger than max_arg_bytes (" +
                               std::to_string(options_.limits.max_arg_bytes) + " bytes)");
  }
  if (request.idle_timeout_ms < 0) return Bad("idle_timeout", "must not be negative");
  Json plan = {{"name", kOpenPlanName},
               {"description", "an open saga: steps appended one call at a time"},
               {"open",
                {{"tools", request.tools},
                 {"metadata", request.metadata},
                 {"idle_timeout_ms", request.idle_timeout_ms},
                 {"on_idle", OnIdleName(request.on_idle)},
                 {"calls", Json::array()}}},
               {"steps", Json::array()}};
  storage::NewSaga ns;
  ns.saga_id = NewSagaId(options_.random_saga_ids);  // time-ordered by default
  ns.intent_key = request.intent_key;
  ns.fingerprint = Fingerprint({{"spec", plan}, {"input", request.metadata}});
  ns.spec_name = kOpenPlanName;
  ns.spec_sha256 = Fingerprint(plan);
  ns.spec = plan;
  ns.input = request.metadata;
  ns.state = SagaStateName(SagaState::kOpen);
  ns.created_ms = options_.clock->NowMs();
  storage::JournalEntry created;
  created.saga_id = ns.saga_id;
  created.event = "saga_created";
  created.data = {{"intent_key", request.intent_key},
                  {"spec", kOpenPlanName},
                  {"open", true},
                  {"tools", request.tools},
                  {"idle_timeout_ms", request.idle_timeout_ms},
                  {"on_idle", OnIdleName(request.on_idle)},
                  {"spec_sha256", ns.spec_sha256},
                  {"fingerprint", ns.fingerprint}};
  if (request.decision) created.data["decision"] = request.decision->ToJson();
  created.at_ms = ns.created_ms;
  ns.journal.push_back(created);
  auto out = store_->CreateIntent(ns);
  if (!out.ok()) return out.status();
  if (out->created && options_.observer) options_.observer(created);
  if (!out->created && options_.duplicate_observer) options_.duplicate_observer("existing_intent");
  return BeginResult{out->saga_id, out->created};
}

Result<CallAnswer> Engine::GetCall(const std::string& saga_id, const std::string& call_id) {
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  return AnswerCall(*rec, call_id);
}

Result<CallAnswer> Engine::Call(const std::string& saga_id, const CallRequest& request) {
  if (!ValidCallId(request.call_id)) {
    return Bad("call_id", "expected 1..200 printable characters without spaces");
  }
  if (request.tool.empty()) return Bad("tool", "is required");
  if (!request.args.is_object()) return Bad("args", "expected a JSON object");
  if (JsonBytes(request.args, options_.limits.max_arg_bytes + 1) > options_.limits.max_arg_bytes) {
    return Bad("args", "larger than max_arg_bytes (" +
                           std::to_string(options_.limits.max_arg_bytes) + " bytes)");
  }
  // A call found in flight (a crash between its `submitted` and its answer)
  // is settled first; then the call is judged again: at most twice.
  for (int round = 0; round < 2; ++round) {
    auto claimed = ClaimForDecision(saga_id);
    if (!claimed.ok()) {
      if (claimed.status().code() != Code::kUnavailable) return claimed.status();
      // Driven elsewhere right now: a repeat of a known call answers as it stands.
      auto rec = store_->LoadSaga(saga_id);
      if (!rec.ok()) return rec.status();
      auto known = AnswerCall(*rec, request.call_id);
      if (known.ok()) return AnswerKnownCall(std::move(known).value(), request, *rec);
      return Refuse(CallRefusal::kBusy, "saga " + saga_id + " is busy with another call; try again",
                    *rec);
    }
    LeaseGuard guard(store_, *claimed);
    ProcessHold hold(this, saga_id, claimed->epoch == 0);
    if (!hold.ok()) {
      auto rec = store_->LoadSaga(saga_id);
      if (!rec.ok()) return rec.status();
      return Refuse(CallRefusal::kBusy, "saga " + saga_id + " is busy with another call; try again",
                    *rec);
    }
    auto rec = store_->LoadSaga(saga_id);
    if (!rec.ok()) return rec.status();
    auto plan = ReadOpenPlan(rec->spec);
    if (!plan.ok()) {
      return Refuse(CallRefusal::kSagaNotOpen, "saga " + saga_id + " is not an open saga", *rec);
    }
    auto state = ParseSagaState(rec->summary.state);
    if (!state)
      return Status::Internal("saga " + saga_id + ": unknown state " + rec->summary.state);
    auto known = AnswerCall(*rec, request.call_id);
    const bool unsettled =
        *state == SagaState::kRunning || *state == SagaState::kPending ||
        *state == SagaState::kCompensating ||
        (*state == SagaState::kAwaitingApproval && NeedsDrive(*rec, options_.clock->NowMs())) ||
        (*state == SagaState::kAwaitingCompletion &&
         CompletionDue(store_, saga_id, options_.clock->NowMs()));
    if (unsettled) {
      // A drive left off (a crash, a decided approval): carry it on here.
      guard.Released();
      auto driven = RunLeased(guard.lease(), /*held=*/hold.held());
      if (!driven.ok() && driven.status().code() != Code::kAborted) return driven.status();
      continue;
    }
    if (known.ok()) return AnswerKnownCall(std::move(known).value(), request, *rec);
    if (*state != SagaState::kOpen) {
      if (*state == SagaState::kAwaitingCompletion) {
        return Refuse(CallRefusal::kCallPending,
                      "saga " + saga_id +
                          " is awaiting_completion: an earlier call waits for its provider; it "
                          "settles when its status says so",
                      *rec);
      }
      if (*state == SagaState::kAwaitingApproval || *state == SagaState::kNeedsAttention) {
        return Refuse(CallRefusal::kCallPending,
                      "saga " + saga_id + " is " + rec->summary.state +
                          ": an earlier call waits for a person; settle it first",
                      *rec);
      }
      return Refuse(CallRefusal::kSagaNotOpen,
                    "saga " + saga_id + " is " + rec->summary.state + ", not open", *rec);
    }
    if (std::find(plan->tools.begin(), plan->tools.end(), request.tool) == plan->tools.end()) {
      return Refuse(CallRefusal::kToolNotAllowed,
                    "tool " + Quoted(request.tool) + " is not among the tools saga " + saga_id +
                        " began with",
                    *rec);
    }
    Tool* tool = tools_->Find(request.tool);
    if (tool == nullptr) return Bad("tool", "unknown tool " + Quoted(request.tool));
    const ToolInfo& info = tool->info();
    // The model repeating itself: the same write under a new call id.
    const bool writes =
        info.effect == EffectClass::kWrite || info.effect == EffectClass::kIrreversible;
    if (writes && info.open.deduplicate_repeats && !request.repeat) {
      const std::string fp = Fingerprint(request.args);
      for (size_t i = 0; i < plan->calls.size() && i < rec->steps.size(); ++i) {
        const storage::StepRecord& st = rec->steps[i];
        if (st.tool != request.tool || st.args_fingerprint != fp ||
            st.state == StepStateName(StepState::kFailed)) {
          continue;
        }
        CallAnswer a = AnswerFor(*rec, static_cast<int>(i), plan->calls[i].call_id);
        a.call_id = request.call_id;
        a.deduplicated = true;
        a.duplicate_of = plan->calls[i].call_id;
        a.duplicate_reason = "same tool and arguments";
        storage::WriteBatch b;
        b.saga_id = saga_id;
        storage::JournalEntry e;
        e.saga_id = saga_id;
        e.step_id = st.step_id;
        e.event = "call_deduplicated";
        e.data = {{"call_id", request.call_id},
                  {"duplicate_of", a.duplicate_of},
                  {"tool", request.tool},
                  {"args_fingerprint", fp}};
        if (!request.who.empty()) e.data["by"] = request.who;
        if (request.decision) e.data["decision"] = request.decision->ToJson();
        e.at_ms = options_.clock->NowMs();
        b.journal.push_back(e);
        // Bind the new call id to the step, so it answers the same later; at
        // most max_steps of them, so a model that loops cannot grow the plan
        // without bound (past that a repeat is still answered, unbound).
        if (plan->aliases.size() < static_cast<size_t>(options_.limits.max_steps)) {
          Json next = rec->spec;
          next["open"]["aliases"].push_back({{"call_id", request.call_id}, {"step", st.step_id}});
          b.spec = std::move(next);
        }
        IDEM_RETURN_IF_ERROR(CommitClaimed(guard.lease(), &b));
        return a;
      }
    }
    // Append the call as the plan's next step, then drive it.
    const int index = static_cast<int>(rec->steps.size());
    if (index >= options_.limits.max_steps) {
      return Bad("call_id", "saga " + saga_id + " has " + std::to_string(index) +
                                " calls, the most max_steps (" +
                                std::to_string(options_.limits.max_steps) + ") allows");
    }
    const std::string step_id = "c" + std::to_string(index + 1);
    Json next = rec->spec;
    next["steps"].push_back(CallStep(step_id, info, request.args));
    Json bound = {{"call_id", request.call_id}, {"step", step_id}};
    if (!request.who.empty()) bound["by"] = request.who;
    next["open"]["calls"].push_back(std::move(bound));
    auto parsed = ParseOpenPlan(next, *tools_);
    if (!parsed.ok()) return parsed.status();
    SagaMachine machine(SagaState::kOpen);
    auto cmds = machine.Fire(SagaEvent::kCallAppended);
    if (!cmds.ok()) return cmds.status();
    const int64_t now = options_.clock->NowMs();
    storage::StepRecord st;
    st.saga_id = saga_id;
    st.index = index;
    st.step_id = step_id;
    st.tool = request.tool;
    st.state = StepStateName(StepState::kPlanned);
    st.step_key = StepKey(saga_id, step_id);
    st.updated_ms = now;
    storage::WriteBatch b;
    b.saga_id = saga_id;
    b.saga_state = SagaStateName(machine.state());
    b.steps.push_back(st);
    b.spec = next;
    b.open_call = storage::WriteBatch::OpenCall{request.call_id, index, now};
    storage::JournalEntry e;
    e.saga_id = saga_id;
    e.step_id = step_id;
    e.event = "call_appended";
    e.data = {{"call_id", request.call_id},
              {"tool", request.tool},
              {"key", st.step_key},
              {"args_fingerprint", Fingerprint(request.args)},
              {"repeat", request.repeat}};
    if (!request.who.empty()) e.data["by"] = request.who;
    if (request.decision) e.data["decision"] = request.decision->ToJson();
    e.at_ms = now;
    b.journal.push_back(e);
    IDEM_FAILPOINT("open.before_append");
    IDEM_RETURN_IF_ERROR(CommitClaimed(guard.lease(), &b));
    IDEM_FAILPOINT("open.after_append");
    guard.Released();
    auto driven = RunLeased(guard.lease(), /*held=*/hold.held());
    if (!driven.ok() && driven.status().code() != Code::kAborted) return driven.status();
    if (driven.ok()) return AnswerFor(*driven, index, request.call_id);
    auto now_rec = store_->LoadSaga(saga_id);  // driven elsewhere now: as it stands
    if (!now_rec.ok()) return now_rec.status();
    return AnswerFor(*now_rec, index, request.call_id);
  }
  // Still unsettled after a drive: answer as it stands.
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  auto known = AnswerCall(*rec, request.call_id);
  if (known.ok()) return AnswerKnownCall(std::move(known).value(), request, *rec);
  return Refuse(CallRefusal::kBusy, "saga " + saga_id + " is " + rec->summary.state + "; try again",
                *rec);
}

Result<storage::SagaRecord> Engine::Commit(const std::string& saga_id, const std::string& who,
                                           const std::optional<ModelDecision>& decision) {
  if (who.empty()) return Bad("who", "who commits is required");
  auto claimed = ClaimForDecision(saga_id);
  if (!claimed.ok()) return claimed.status();
  LeaseGuard guard(store_, *claimed);
  ProcessHold hold(this, saga_id, claimed->epoch == 0);
  if (!hold.ok()) return Status::Unavailable("saga " + saga_id + " is busy; try again");
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  if (!IsOpenPlan(rec->spec)) {
    return Status::FailedPrecondition("saga " + saga_id + " is not an open saga");
  }
  auto state = ParseSagaState(rec->summary.state);
  if (state == SagaState::kSucceeded) return rec;  // committed already: twice is once
  if (state != SagaState::kOpen) {
    std::string pending;
    for (const storage::StepRecord& st : rec->steps) {
      const std::string s = CallState(st);
      if (s != "succeeded" && s != "failed")
        pending += (pending.empty() ? "" : ", ") + st.step_id + " " + s;
    }
    return Status::FailedPrecondition(
        "saga " + saga_id + " is " + rec->summary.state + ", not open" +
        (pending.empty() ? std::string() : "; unsettled calls: " + pending));
  }
  SagaMachine machine(SagaState::kOpen);
  auto cmds = machine.Fire(SagaEvent::kCommitRequested);
  if (!cmds.ok()) return cmds.status();
  storage::WriteBatch b;
  b.saga_id = saga_id;
  b.saga_state = SagaStateName(machine.state());
  storage::JournalEntry e;
  e.saga_id = saga_id;
  e.event = "saga_succeeded";
  e.data = {{"by", who}, {"committed", true}};
  if (decision) e.data["decision"] = decision->ToJson();
  e.at_ms = options_.clock->NowMs();
  b.journal.push_back(e);
  b.release_lease = guard.lease().epoch != 0;
  IDEM_RETURN_IF_ERROR(CommitClaimed(guard.lease(), &b));
  if (b.release_lease) guard.Released();
  return store_->LoadSaga(saga_id);
}

Result<ControlResult> Engine::Rollback(const std::string& saga_id, const ControlRequest& request) {
  auto rec = store_->LoadSaga(saga_id);
  if (!rec.ok()) return rec.status();
  if (!IsOpenPlan(rec->spec)) {
    return Status::FailedPrecondition("saga " + saga_id + " is not an open saga");
  }
  ControlRequest r = request;
  if (r.reason.empty()) r.reason = "rolled back by " + r.who;
  return Cancel(saga_id, r);
}

}  // namespace idem
