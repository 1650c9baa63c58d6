#include "mcp/session.h"

#include <chrono>
#include <condition_variable>
#include <thread>
#include <utility>

#include "saga/call_view.h"
#include "saga/engine.h"
#include "saga/open_saga.h"
#include "saga/views.h"
#include "storage/store.h"

#include "mcp/protocol.h"

namespace idem::mcp {
namespace {

// notifications/progress every `interval_ms` while a call runs, when the
// request asked for progress.
class ProgressTicker {
 public:
  ProgressTicker(const Json& token, const Session::Notify& notify, int64_t interval_ms,
                 std::string message)
      : token_(token) {
    if (token_.is_null() || !notify || interval_ms <= 0) return;
    thread_ = std::thread([this, notify, interval_ms, message = std::move(message)] {
      std::unique_lock<std::mutex> lock(mu_);
      int n = 0;
      while (!done_) {
        if (cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return done_; })) {
          break;
        }
        ++n;
        lock.unlock();
        notify(Message::Notification(
            "notifications/progress",
            {{"progressToken", token_}, {"progress", n}, {"message", message}}));
        lock.lock();
      }
    });
  }
  ~ProgressTicker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Json token_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

Json SagaMeta(const std::string& saga_id, const std::string& call_id, const std::string& state) {
  return {{"saga_id", saga_id}, {"call_id", call_id}, {"state", state}};
}

std::string StringMeta(const Json& meta, const char* key) {
  if (!meta.is_object() || !meta.contains(key) || !meta[key].is_string()) return "";
  return meta[key].get<std::string>();
}

bool SettledState(const std::string& s) {
  return s == "succeeded" || s == "failed" || s == "compensated" || s == "cancelled";
}

}  // namespace

Json ToolResult(const std::string& text, Json structured, bool is_error, Json saga) {
  Json r = {{"content", Json::array({{{"type", "text"}, {"text", text}}})}, {"isError", is_error}};
  if (structured.is_object()) r["structuredContent"] = std::move(structured);
  if (saga.is_object()) r["_meta"] = {{"io.idem/saga", std::move(saga)}};
  return r;
}

Session::Session(Backend backend, SessionOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  if (options_.session_id.empty()) options_.session_id = NewId("");
}

bool Session::initialized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return initialized_;
}

std::string Session::protocol_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

std::string Session::saga_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return saga_id_;
}

std::string Session::session_intent_key() const {
  return options_.key_scope + "mcp-session:" + options_.session_id;
}

void Session::Adopt(const std::string& version, const std::string& saga_id) {
  std::lock_guard<std::mutex> lock(mu_);
  initialized_ = true;
  version_ = version;
  saga_id_ = saga_id;
}

ToolCatalog Session::Catalog() const {
  std::vector<SpecSource> specs;
  if (backend_.specs) specs = backend_.specs();
  return ToolCatalog::Build(*backend_.tools, specs);
}

std::optional<Message> Session::Handle(const Message& m, const Notify& notify) {
  if (m.is_response()) return std::nullopt;  // the server sends no requests
  if (m.is_notification()) {
    if (m.method == "notifications/cancelled") {
      const Json& rid = m.params.contains("requestId") ? m.params["requestId"] : Json();
      if (rid.is_string() || rid.is_number_integer()) {
        std::lock_guard<std::mutex> lock(mu_);
        const std::string text = rid.dump();
        if (in_flight_.count(text) > 0) cancelled_.insert(text);
      }
    }
    // notifications/initialized and any other: nothing to answer.
    return std::nullopt;
  }
  const RequestId& id = *m.id;
  if (m.method == "initialize") return Initialize(m);
  if (m.method == "ping") return Message::Result(id, Json::object());
  if (!initialized()) {
    return Message::Error(id, rpc_error::kInvalidRequest,
                          "the session is not initialized: send initialize first");
  }
  if (m.method == "tools/list") return ToolsList(m);
  if (m.method == "tools/call") {
    const std::string key = RequestIdText(id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.insert(key);
    }
    Message answer = ToolsCall(m, notify);
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(key);
    if (cancelled_.erase(key) > 0) return std::nullopt;
    return answer;
  }
  return Message::Error(id, rpc_error::kMethodNotFound, "method not found: " + m.method);
}

Message Session::Initialize(const Message& m) {
  const Json& p = m.params;
  if (!p.contains("protocolVersion") || !p["protocolVersion"].is_string()) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "initialize: params.protocolVersion: expected a string");
  }
  if (p.contains("capabilities") && !p["capabilities"].is_object()) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "initialize: params.capabilities: expected an object");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (initialized_) {
      return Message::Error(*m.id, rpc_error::kInvalidRequest,
                            "initialize: the session is initialized already");
    }
  }
  const std::string version = NegotiateProtocolVersion(p["protocolVersion"].get<std::string>());
  // With no tool an open saga may call there is nothing to begin: the
  // session then lives in memory only (mcp/http.h).
  const ToolCatalog catalog = Catalog();
  if (options_.begin_at_initialize && !catalog.open_tools().empty()) {
    auto saga = SagaFor("", catalog);
    if (!saga.ok()) {
      return Message::Error(
          *m.id, rpc_error::kInternalError,
          "initialize: cannot begin the session's open saga: " + saga.status().message());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    initialized_ = true;
    version_ = version;
  }
  Json result = {
      {"protocolVersion", version},
      {"capabilities", {{"tools", {{"listChanged", false}}}}},
      {"serverInfo", {{"name", kServerName}, {"title", "idem"}, {"version", ServerVersion()}}},
      {"instructions",
       "Every tool call runs through idem's journal as a step of an open saga: a repeated call "
       "is answered from the journal, a write that needs a person answers what waits for "
       "approval (call it again once approved), idem_commit ends the saga and idem_rollback "
       "undoes its calls in reverse order."}};
  return Message::Result(*m.id, result);
}

Message Session::ToolsList(const Message& m) {
  std::string cursor;
  if (m.params.contains("cursor")) {
    if (!m.params["cursor"].is_string()) {
      return Message::Error(*m.id, rpc_error::kInvalidParams,
                            "tools/list: params.cursor: expected a string");
    }
    cursor = m.params["cursor"].get<std::string>();
  }
  auto page = Catalog().Page(cursor, options_.page_size);
  if (!page.ok()) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "tools/list: params." + page.status().message());
  }
  return Message::Result(*m.id, *page);
}

Result<std::string> Session::SagaFor(const std::string& intent, const ToolCatalog& catalog) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (intent.empty() && !saga_id_.empty()) return saga_id_;
    auto it = intent_sagas_.find(intent);
    if (!intent.empty() && it != intent_sagas_.end()) return it->second;
  }
  if (catalog.open_tools().empty()) {
    return Status::FailedPrecondition(
        "no tool of the registry may be called in an open saga (each write tool must name its "
        "compensation, or say \"compensate\": null with a reason)");
  }
  BeginRequest br;
  br.tools = catalog.open_tools();
  if (intent.empty()) {
    br.intent_key = session_intent_key();
    br.metadata = {{"mcp", {{"session", options_.session_id}}}};
  } else {
    br.intent_key = options_.key_scope + "mcp:" + intent;
    br.metadata = {{"mcp", {{"intent", intent}}}};
  }
  auto begun = backend_.engine->Begin(br);
  if (!begun.ok()) {
    if (begun.status().code() == Code::kConflict) {
      return Status::Conflict(
          "intent " + br.intent_key +
          " was begun with another tool list (the registry changed): " + begun.status().message());
    }
    return begun.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (intent.empty()) {
    saga_id_ = begun->saga_id;
  } else {
    intent_sagas_[intent] = begun->saga_id;
  }
  return begun->saga_id;
}

Message Session::ToolsCall(const Message& m, const Notify& notify) {
  const Json& p = m.params;
  if (!p.contains("name") || !p["name"].is_string()) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "tools/call: params.name: expected a string");
  }
  const std::string name = p["name"].get<std::string>();
  Json args = Json::object();
  if (p.contains("arguments") && !p["arguments"].is_null()) {
    if (!p["arguments"].is_object()) {
      return Message::Error(*m.id, rpc_error::kInvalidParams,
                            "tools/call: params.arguments: expected an object");
    }
    args = p["arguments"];
  }
  const Json meta = p.contains("_meta") ? p["_meta"] : Json::object();
  if (!meta.is_object()) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "tools/call: params._meta: expected an object");
  }
  const std::string intent = StringMeta(meta, "io.idem/intent");
  std::string call_id = StringMeta(meta, "io.idem/call-id");
  if (intent.size() > 200) {
    return Message::Error(*m.id, rpc_error::kInvalidParams,
                          "tools/call: params._meta[\"io.idem/intent\"]: at most 200 characters");
  }
  const ToolCatalog catalog = Catalog();
  const CatalogEntry* e = catalog.Find(name);
  if (e == nullptr) {
    return Message::Error(*m.id, rpc_error::kInvalidParams, "Unknown tool: " + name,
                          Json{{"tool", name}});
  }
  const std::string bad = CheckArguments(e->definition["inputSchema"], args);
  if (!bad.empty()) {
    return Message::Result(
        *m.id, ToolResult("invalid arguments for " + name + ": " + bad,
                          {{"error", {{"code", "invalid-arguments"}, {"message", bad}}}}, true));
  }
  ProgressTicker ticker(meta.contains("progressToken") ? meta["progressToken"] : Json(), notify,
                        options_.progress_interval_ms, "idem: " + name + " in progress");
  if (e->kind == CatalogKind::kCommit || e->kind == CatalogKind::kRollback) {
    return Message::Result(*m.id, EndSaga(*e, args, intent, catalog));
  }
  if (e->kind == CatalogKind::kSpec) {
    const std::string owner = intent.empty() ? "session:" + options_.session_id : intent;
    return Message::Result(*m.id, CallSpecTool(*e, args, owner, call_id));
  }
  auto saga = SagaFor(intent, catalog);
  if (!saga.ok()) {
    return Message::Result(
        *m.id,
        ToolResult("idem could not begin the open saga: " + saga.status().message(),
                   {{"error", {{"code", "saga-not-begun"}, {"message", saga.status().message()}}}},
                   true));
  }
  if (call_id.empty()) call_id = NewId("mcp_");
  return Message::Result(*m.id, CallRegistryTool(*e, args, *saga, call_id));
}

namespace {

// The approval part of an answer: what waits, and where a person approves
// it. The commit token itself is never given to the agent.
Json ApprovalAnswer(const std::string& saga_id, const std::string& call_id,
                    const storage::StepRecord& step, const std::string& cli) {
  auto view = ApprovalView(saga_id, step);
  if (!view) return Json();
  const Json& preview = (*view)["preview"];
  const std::string token = (*view)["token"].get<std::string>();
  return {{"status", "awaiting_approval"},
          {"saga_id", saga_id},
          {"call_id", call_id},
          {"step_id", step.step_id},
          {"tool", step.tool},
          {"summary", preview.value("summary", "")},
          {"changes", preview.value("changes", Json::object())},
          {"arguments", step.args},
          {"expires_at", (*view)["expires_at"]},
          {"token_ref", Sha256Hex(token).substr(0, 16)},
          {"approve_at",
           {{"cli", cli + " approvals, then " + cli + " approve TOKEN"},
            {"api", "GET /v1/approvals, then POST /v1/approvals/{token}/approve"},
            {"ui", "/ui/approvals/" + saga_id + "/" + step.step_id}}},
          {"next",
           "a person approves or rejects the commit; call this tool again with the same "
           "arguments (or the same io.idem/call-id) to get the outcome"}};
}

std::string ApprovalText(const Json& a) {
  return "Waiting for approval: " + a.value("summary", std::string("a commit")) + " (saga " +
         a.value("saga_id", "") + ", call " + a.value("call_id", "") +
         "). A person approves it with `" + a["approve_at"].value("cli", "") + "`, through " +
         a["approve_at"].value("api", "") + ", or at " + a["approve_at"].value("ui", "") +
         ". Call this tool again with the same arguments to get the outcome.";
}

Json CallStructured(const std::string& saga_id, const CallAnswer& a) {
  return CallAnswerView(saga_id, a);
}

}  // namespace

Json Session::CallRegistryTool(const CatalogEntry& e, const Json& args, const std::string& saga_id,
                               const std::string& call_id) {
  CallRequest req;
  req.call_id = call_id;
  req.tool = e.target;
  req.args = args;
  req.who = options_.who;  // the session's principal: the call's requester
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.busy_wait_ms);
  Result<CallAnswer> answer = Status::Internal("not called");
  for (;;) {
    answer = backend_.engine->Call(saga_id, req);
    if (!answer.ok() || answer->refusal != CallRefusal::kBusy ||
        std::chrono::steady_clock::now() >= deadline) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!answer.ok()) {
    const Status& s = answer.status();
    return ToolResult(
        "idem refused the call: " + s.message(),
        {{"error",
          {{"code", s.code() == Code::kInvalidArgument ? "invalid-call" : "store-error"},
           {"message", s.message()}}}},
        true, SagaMeta(saga_id, call_id, "refused"));
  }
  CallAnswer a = std::move(answer).value();
  if (a.refusal == CallRefusal::kCallPending) {
    // The model asks again for a call that waits for a person: answer that
    // call (the same tool and arguments), as the journal has it.
    auto rec = backend_.store->LoadSaga(saga_id);
    auto plan = rec.ok() ? ReadOpenPlan(rec->spec) : Result<OpenPlan>(rec.status());
    if (rec.ok() && plan.ok()) {
      const std::string fp = Fingerprint(args);
      for (size_t i = 0; i < plan->calls.size() && i < rec->steps.size(); ++i) {
        const storage::StepRecord& st = rec->steps[i];
        if (st.tool != e.target || st.args_fingerprint != fp) continue;
        auto known = backend_.engine->GetCall(saga_id, plan->calls[i].call_id);
        if (!known.ok()) break;
        known->deduplicated = known->call_id != call_id;
        known->duplicate_of = plan->calls[i].call_id;
        known->duplicate_reason = "same tool and arguments";
        known->call_id = call_id;
        a = std::move(known).value();
        break;
      }
    }
  }
  if (a.refusal != CallRefusal::kNone) {
    Json error = {{"code", CallRefusalName(a.refusal)}, {"message", a.message}};
    if (a.refusal == CallRefusal::kCallIdReused) {  // both intents, for the model to see
      error["recorded_tool"] = a.tool;
      error["recorded_args_fingerprint"] = a.args_fingerprint;
      error["tool"] = a.request_tool;
      error["args_fingerprint"] = a.request_fingerprint;
    }
    return ToolResult(
        "idem refused the call (" + std::string(CallRefusalName(a.refusal)) + "): " + a.message,
        {{"error", std::move(error)}, {"saga_id", saga_id}, {"call_id", call_id}}, true,
        SagaMeta(saga_id, call_id, CallRefusalName(a.refusal)));
  }
  Json structured = CallStructured(saga_id, a);
  const Json meta = SagaMeta(saga_id, a.call_id, a.state);
  if (a.state == "awaiting_approval") {
    Json approval = ApprovalAnswer(saga_id, a.duplicate_of.empty() ? a.call_id : a.duplicate_of,
                                   a.step, options_.cli);
    if (approval.is_object()) {
      for (const auto& [k, v] : approval.items()) structured[k] = v;
      structured["call_id"] = a.call_id;
      return ToolResult(ApprovalText(approval), structured, false, meta);
    }
  }
  if (a.state == "succeeded") {
    return ToolResult(a.result.dump(), structured, false, meta);
  }
  if (a.state == "failed") {
    return ToolResult(e.name + " failed: " + a.error, structured, true, meta);
  }
  if (a.state == "needs_attention") {
    return ToolResult(e.name + " needs a person (saga " + saga_id + "): " + a.error +
                          "; an operator resolves it (idem resolve, POST /v1/sagas/" + saga_id +
                          "/resolve)",
                      structured, true, meta);
  }
  if (a.state == "compensated") {
    return ToolResult(e.name + " was rolled back (compensated) in saga " + saga_id, structured,
                      true, meta);
  }
  return ToolResult(e.name + " is " + a.state + " in saga " + saga_id +
                        "; call again with the same arguments for its outcome",
                    structured, false, meta);
}

Json Session::CallSpecTool(const CatalogEntry& e, const Json& args, const std::string& owner,
                           const std::string& call_id) {
  const std::string key =
      options_.key_scope + "mcp-spec:" + owner + ":" +
      (call_id.empty() ? e.target + ":" + Fingerprint(args) : "call:" + call_id);
  // A synchronous caller: the intent rides with the first step's write.
  std::optional<SubmitResult> submitted;
  auto ran = backend_.engine->SubmitAndRun(e.spec, args, key, std::nullopt,
                                           [&](const SubmitResult& sub) { submitted = sub; });
  if (!submitted) {  // nothing recorded: the submission itself failed
    const Status& s = ran.status();
    return ToolResult(
        "idem could not submit saga " + e.target + ": " + s.message(),
        {{"error",
          {{"code", s.code() == Code::kConflict ? "intent-conflict" : "invalid-input"},
           {"message", s.message()}}}},
        true);
  }
  const std::string saga_id = submitted->saga_id;
  auto rec = backend_.store->LoadSaga(saga_id);
  if (!rec.ok()) {
    return ToolResult("saga " + saga_id + ": " + rec.status().message(),
                      {{"saga_id", saga_id}, {"error", rec.status().message()}}, true,
                      SagaMeta(saga_id, call_id, "unknown"));
  }
  (void)ran;  // the saga's record says what came of it (another driver may have it)
  const std::string state = rec->summary.state;
  Json steps = Json::object();
  Json approvals = Json::array();
  for (const storage::StepRecord& st : rec->steps) {
    steps[st.step_id] = {{"tool", st.tool}, {"state", st.state}};
    if (!st.result.is_null()) steps[st.step_id]["result"] = st.result;
    Json a = ApprovalAnswer(saga_id, call_id, st, options_.cli);
    if (a.is_object()) approvals.push_back(a);
  }
  Json structured = {{"saga_id", saga_id},
                     {"spec", e.target},
                     {"state", state},
                     {"created", submitted->created},
                     {"reason", rec->summary.reason},
                     {"steps", steps}};
  const Json meta = SagaMeta(saga_id, call_id, state);
  if (state == "awaiting_approval" && !approvals.empty()) {
    Json first = approvals[0];
    for (const auto& [k, v] : first.items()) {
      if (k != "saga_id") structured[k] = v;
    }
    structured["state"] = state;
    structured["approvals"] = approvals;
    return ToolResult(ApprovalText(first), structured, false, meta);
  }
  if (state == "succeeded") {
    return ToolResult("saga " + e.target + " succeeded (saga " + saga_id + "): " + steps.dump(),
                      structured, false, meta);
  }
  const bool failed = state == "failed" || state == "compensated" || state == "cancelled" ||
                      state == "needs_attention";
  return ToolResult(
      "saga " + e.target + " is " + state + " (saga " + saga_id + ")" +
          (rec->summary.reason.empty() ? "" : ": " + rec->summary.reason) +
          (SettledState(state) || failed ? ""
                                         : "; call again with the same arguments for its outcome"),
      structured, failed, meta);
}

Json Session::EndSaga(const CatalogEntry& e, const Json& args, const std::string& intent,
                      const ToolCatalog& catalog) {
  auto saga = SagaFor(intent, catalog);
  if (!saga.ok()) {
    return ToolResult(
        "no open saga: " + saga.status().message(),
        {{"error", {{"code", "saga-not-begun"}, {"message", saga.status().message()}}}}, true);
  }
  const std::string& saga_id = *saga;
  if (e.kind == CatalogKind::kCommit) {
    auto done = backend_.engine->Commit(saga_id, options_.who);
    if (!done.ok()) {
      return ToolResult(
          "idem could not commit saga " + saga_id + ": " + done.status().message(),
          {{"saga_id", saga_id},
           {"error", {{"code", "commit-refused"}, {"message", done.status().message()}}}},
          true, SagaMeta(saga_id, "", "open"));
    }
    const std::string state = done->summary.state;
    return ToolResult("saga " + saga_id + " committed: " + state,
                      {{"saga_id", saga_id}, {"state", state}}, state != "succeeded",
                      SagaMeta(saga_id, "", state));
  }
  ControlRequest cr;
  cr.who = options_.who;
  cr.reason = args.value("reason", std::string("rolled back through MCP (idem_rollback)"));
  auto done = backend_.engine->Rollback(saga_id, cr);
  if (!done.ok()) {
    return ToolResult(
        "idem could not roll back saga " + saga_id + ": " + done.status().message(),
        {{"saga_id", saga_id},
         {"error", {{"code", "rollback-refused"}, {"message", done.status().message()}}}},
        true, SagaMeta(saga_id, "", "open"));
  }
  const std::string state = done->saga.summary.state;
  Json compensated = Json::array();
  for (const storage::StepRecord& st : done->saga.steps) {
    if (st.state == "compensated") compensated.push_back(st.step_id);
  }
  return ToolResult("saga " + saga_id + " rolled back: " + state +
                        (done->note.empty() ? "" : " (" + done->note + ")"),
                    {{"saga_id", saga_id},
                     {"state", state},
                     {"pending", done->pending},
                     {"compensated_steps", compensated},
                     {"note", done->note}},
                    false, SagaMeta(saga_id, "", state));
}

}  // namespace idem::mcp
