#include "cli/cli.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/approvals.h"
#include "cli/driver_lock.h"
#include "cli/journal.h"
#include "cli/keys_retire.h"
#include "cli/mcp.h"
#include "cli/metrics_endpoint.h"
#include "cli/open.h"
#include "cli/prune.h"
#include "cli/reconcile.h"
#include "cli/serve_tls.h"
#include "preview_commit/token.h"
#include "preview_commit/two_phase.h"
#include "saga/approval_rights.h"
#include "saga/engine.h"
#include "saga/spec.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/server.h"
#include "storage/high_water_mark.h"
#include "storage/store.h"
#include "tools/http_tool.h"

#include "common/failpoint.h"
#include "observability/metrics.h"
#include "observability/observability.h"
#include <signal.h>
#include <unistd.h>

namespace idem::cli {
namespace {

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

int ExitFor(const Status& s) {
  switch (s.code()) {
    case Code::kUnavailable:
      return kExitBusy;  // "busy; try again": a lease or the store
    case Code::kFailedPrecondition:
      if (StartsWith(s.message(), storage::kJournalRegressionMessage)) return kExitJournalRegressed;
      if (StartsWith(s.message(), kKeyInUseMessage)) return kExitKeyInUse;
      if (StartsWith(s.message(), preview_commit::kExpiredTokenMessage)) return kExitTokenExpired;
      if (StartsWith(s.message(), preview_commit::kAlreadyDecidedMessage)) {
        return kExitAlreadyDecided;
      }
      // Who may not decide on a commit (saga/approval_rights.h): a person
      // without the role, unauthenticated, or the commit's requester.
      if (StartsWith(s.message(), preview_commit::kRoleMissingMessage) ||
          StartsWith(s.message(), kUnauthenticatedMessage) ||
          StartsWith(s.message(), kSelfApprovalMessage)) {
        return kExitUsage;
      }
      return kExitInternal;
    case Code::kOk:
      return kExitOk;
    case Code::kInvalidArgument:
      return kExitUsage;
    case Code::kConflict:
      // The same person deciding twice on one commit (an approval policy).
      if (StartsWith(s.message(), preview_commit::kAlreadyCountedMessage)) {
        return kExitAlreadyDecided;
      }
      return kExitConflict;
    case Code::kNotFound:
      return kExitNotFound;
    default:
      return kExitInternal;
  }
}

// The subcommand being run, for the error log.
std::string g_command;

// One answer for the person (stderr) and one log line for the operator.
int FailWith(const Status& s, int exit_code) {
  std::cerr << "error: " << s.message() << "\n";
  observability::Log(observability::LogLevel::kError, "command failed",
                     {{"command", g_command},
                      {"code", CodeName(s.code())},
                      {"error", s.message()},
                      {"exit", exit_code}});
  return exit_code;
}

int Fail(const Status& s) { return FailWith(s, ExitFor(s)); }

int ExitForSagaState(const std::string& state) {
  auto s = ParseSagaState(state);
  if (!s) return kExitInternal;
  switch (*s) {
    case SagaState::kSucceeded:
      return kExitOk;
    case SagaState::kCompensated:
    case SagaState::kFailed:
    case SagaState::kCancelled:
      return kExitRolledBack;
    case SagaState::kNeedsAttention:
      return kExitNeedsAttention;
    case SagaState::kAwaitingApproval:
      return kExitAwaitingApproval;
    case SagaState::kAwaitingCompletion:
      return kExitAwaitingCompletion;
    default:
      return kExitOk;  // pending, running, waiting: not an error
  }
}

std::string Clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

std::string Pad(const std::string& s, size_t n) {
  return s.size() >= n ? s + " " : s + std::string(n - s.size(), ' ');
}

// One line of the live timeline.
void PrintTimelineLine(const storage::JournalEntry& e) {
  std::string time = FormatTimeMs(e.at_ms).substr(11, 12);
  std::string detail;
  const Json& d = e.data;
  auto add = [&](const std::string& text) { detail += (detail.empty() ? "" : "  ") + text; };
  if (d.is_object()) {
    if (d.contains("attempt")) add("attempt " + d["attempt"].dump());
    if (d.contains("tool")) add(d["tool"].get<std::string>());
    if (d.contains("retry_after_ms")) add("after " + d["retry_after_ms"].dump() + " ms");
    if (d.contains("external_ref")) add("ref " + d["external_ref"].get<std::string>());
    if (d.contains("resolved_by")) add("resolved by " + d["resolved_by"].get<std::string>());
    if (d.contains("error")) add(d["error"].get<std::string>());
    if (d.contains("reason") && d["reason"].is_string()) add(d["reason"].get<std::string>());
    if (d.contains("intent_key")) add("intent " + d["intent_key"].get<std::string>());
    if (d.contains("summary") && d["summary"].is_string()) add(d["summary"].get<std::string>());
    if (d.contains("expires_at") && d["expires_at"].is_string()) {
      add("until " + d["expires_at"].get<std::string>());
    }
    if (d.contains("by") && d["by"].is_string()) add("by " + d["by"].get<std::string>());
    if (d.contains("note") && d["note"].is_string() && !d["note"].get<std::string>().empty()) {
      add("\"" + d["note"].get<std::string>() + "\"");
    }
    if (d.contains("approved_by")) add("approved by " + d["approved_by"].get<std::string>());
  }
  std::string who = e.step_id.empty() ? "(saga)" : e.step_id;
  std::printf("  %s  %s%s%s\n", time.c_str(), Pad(who, 18).c_str(), Pad(e.event, 24).c_str(),
              Clip(detail, 120).c_str());
  std::fflush(stdout);
}

Json SagaToJson(const storage::SagaRecord& rec, const std::vector<storage::EffectRecord>& effects,
                const std::vector<storage::JournalEntry>* journal) {
  Json steps = Json::array();
  for (const auto& st : rec.steps) steps.push_back(StepView(st));
  Json effs = Json::array();
  for (const auto& e : effects) effs.push_back(EffectView(e));
  Json out = {{"saga_id", rec.summary.saga_id},
              {"intent_key", rec.summary.intent_key},
              {"spec", rec.summary.spec_name},
              {"state", rec.summary.state},
              {"reason", rec.summary.reason},
              {"created_at", FormatTimeMs(rec.summary.created_ms)},
              {"updated_at", FormatTimeMs(rec.summary.updated_ms)},
              {"input", rec.input},
              {"steps", steps},
              {"effects", effs}};
  if (auto code = SagaParkCode(rec.summary)) out["park_code"] = *code;
  AddSpecRef(rec.summary, &out);
  AddPruned(rec.summary, &out);
  if (journal != nullptr) {
    Json j = Json::array();
    for (const auto& e : *journal) {
      j.push_back({{"seq", e.seq},
                   {"step", e.step_id},
                   {"event", e.event},
                   {"data", e.data},
                   {"at", FormatTimeMs(e.at_ms)}});
    }
    out["journal"] = j;
    // The model decisions (saga/open_saga.h): the submission's, and an open
    // saga's calls in order with theirs.
    out["decision"] = SubmissionDecision(*journal);
    if (IsOpenPlan(rec.spec)) out["calls"] = OpenCallsView(rec, *journal);
  }
  return out;
}

void PrintSagaText(const storage::SagaRecord& rec) {
  std::printf("saga     %s\n", rec.summary.saga_id.c_str());
  std::printf("intent   %s\n", rec.summary.intent_key.c_str());
  std::printf("spec     %s\n", SpecRefText(rec.summary).c_str());
  std::printf("state    %s\n", rec.summary.state.c_str());
  if (!rec.summary.reason.empty()) std::printf("reason   %s\n", rec.summary.reason.c_str());
  std::printf("steps\n");
  for (const auto& st : rec.steps) {
    std::string extra = st.external_ref.empty() ? "" : "ref " + st.external_ref;
    if (!st.error.empty()) extra += (extra.empty() ? "" : "  ") + st.error;
    std::printf("  %d  %s%s%s%s\n", st.index, Pad(st.step_id, 18).c_str(), Pad(st.tool, 18).c_str(),
                Pad(st.state, 20).c_str(), Clip(extra, 100).c_str());
  }
}

struct Options {
  PruneFlags background_prune;          // serve and worker: --prune-older-than ... (cli/prune.h)
  ReconcileFlags background_reconcile;  // serve and worker: --reconcile-every (cli/reconcile.h)
  std::string db;
  std::string spec_path;
  std::string input;
  std::string intent_key;
  std::string saga_id;
  std::string status_filter;
  bool json = false;
  int concurrency = 4;
  std::string step_id;
  std::string decision;
  std::string model_decision;  ///< run --decision: JSON or @FILE (saga/open_saga.h)
  std::string who;
  DeciderFlags decider;  ///< approve/reject: --as, --auth, --credential (cli/approvals.h)
  std::string note;
  std::string result;
  std::string token;
  std::string keys_path;
  std::string keys_action;
  std::string journal_action;
  bool re_preview = false;
  std::string key_id;
  std::string owner;
  int64_t lease_ms = 30'000;
  int64_t poll_ms = 100;
  std::string listen = "127.0.0.1:8080";
  std::string metrics_listen;  // worker: HOST:PORT of /metrics, "" for none
  std::string auth_path;
  std::string tools_path;
  std::string state_path;
  bool insecure_no_auth = false;
  int workers = 4;
  server::ServerOptions limits;  ///< serve: the HTTP front's bounds (its defaults)
};

// What to do when another process drives the journal (DriverLock). A
// server can take the decision itself; the token is never echoed.
std::string BusyAdvice(const DriverLock::Holder& holder) {
  const bool server = holder.command == "serve" || holder.command.empty();
  const std::string later = "try again when it has stopped";
  if (server && (g_command == "approve" || g_command == "reject")) {
    return g_command + " through its server (POST /v1/approvals/TOKEN/" + g_command + ") or " +
           later;
  }
  if (server && g_command == "run") {
    return "submit through its server (POST /v1/sagas) or " + later;
  }
  return later;
}

std::atomic<bool> g_stop{false};
extern "C" void OnStopSignal(int) { g_stop.store(true); }

Result<Json> ReadInput(const std::string& text) {
  if (text.empty()) return Json::object();
  if (text[0] == '@') {
    auto body = ReadFile(text.substr(1));
    if (!body.ok()) return body.status();
    return ParseJson(*body, "--input " + text);
  }
  return ParseJson(text, "--input");
}

// The store this process was pointed at (set once, after parsing).
std::string g_store_locator;
// --max-steps, --max-arg-bytes, --max-saga-bytes (saga/limits.h).
SagaLimits g_limits;

bool IsPostgres(const std::string& locator) {
  return locator.rfind("postgresql://", 0) == 0 || locator.rfind("postgres://", 0) == 0;
}

// The commit-token keys, loaded (or created, mode 0600) on first use.
class Keys {
 public:
  explicit Keys(std::string path) : path_(std::move(path)) {}
  Result<const preview_commit::TokenSigner*> Signer() {
    if (!signer_) {
      auto ring = preview_commit::KeyRing::LoadOrCreate(path_, SystemClock::Get());
      if (!ring.ok()) return ring.status();
      ring_ = std::make_unique<preview_commit::KeyRing>(std::move(ring).value());
      preview_commit::TokenOptions to;
      to.max_ttl_ms = StepSpec::kMaxApprovalTtlMs;
      signer_ = std::make_unique<preview_commit::TokenSigner>(ring_.get(), SystemClock::Get(), to);
    }
    return signer_.get();
  }
  preview_commit::KeyRing* ring() { return ring_.get(); }

 private:
  std::string path_;
  std::unique_ptr<preview_commit::KeyRing> ring_;
  std::unique_ptr<preview_commit::TokenSigner> signer_;
};

EngineOptions LiveEngineOptions(bool live, const preview_commit::TokenSigner* signer) {
  EngineOptions eo;
  // The embedded store has one driving process (DriverLock); PostgreSQL
  // shares sagas between processes through leases.
  eo.use_leases = IsPostgres(g_store_locator);
  eo.limits = g_limits;
  eo.observer = observability::WithJournalLog(live ? PrintTimelineLine : nullptr);
  eo.signer = signer;
  return eo;
}

int CmdValidate(const Options& o, const ToolRegistry& tools) {
  auto text = ReadFile(o.spec_path);
  if (!text.ok()) return Fail(text.status());
  auto spec = ParseSpecText(*text, tools, o.spec_path);
  if (!spec.ok()) return Fail(spec.status());
  std::printf("ok: %s (spec \"%s\" version %d, %zu steps)\n", o.spec_path.c_str(),
              spec->name.c_str(), spec->version, spec->steps.size());
  return kExitOk;
}

// What SPEC, --input, --intent-key and --decision ask to submit.
struct SubmitRequest {
  SagaSpec spec;
  Json input;
  std::string key;
  std::optional<ModelDecision> decision;
};

Result<SubmitRequest> ReadSubmitRequest(const Options& o, const ToolRegistry& tools) {
  auto text = ReadFile(o.spec_path);
  if (!text.ok()) return text.status();
  auto spec = ParseSpecText(*text, tools, o.spec_path);
  if (!spec.ok()) return spec.status();
  auto input = ReadInput(o.input);
  if (!input.ok()) return input.status();
  SubmitRequest req{std::move(spec).value(), std::move(input).value(),
                    o.intent_key.empty() ? NewId("intent_") : o.intent_key, std::nullopt};
  if (!o.model_decision.empty()) {
    auto doc = ReadInput(o.model_decision);
    if (!doc.ok()) return doc.status();
    auto d = ParseModelDecision(*doc, "--decision", g_limits.max_decision_text_bytes);
    if (!d.ok()) return d.status();
    req.decision = *d;
  }
  return req;
}

// Reads the request, then records the intent (idempotent per key).
Result<SubmitResult> SubmitFromOptions(const Options& o, const ToolRegistry& tools, Engine* engine,
                                       std::string* key) {
  auto req = ReadSubmitRequest(o, tools);
  if (!req.ok()) return req.status();
  *key = req->key;
  return engine->Submit(req->spec, req->input, req->key, req->decision);
}

int CmdRun(const Options& o, const ToolRegistry& tools, storage::Store* store,
           const preview_commit::TokenSigner* signer) {
  Engine engine(store, &tools, LiveEngineOptions(true, signer));
  auto req = ReadSubmitRequest(o, tools);
  if (!req.ok()) return Fail(req.status());
  // The intent is recorded with the first step's `submitted` (one commit
  // fewer); the saga is named as soon as it is durable.
  auto rec = engine.SubmitAndRun(
      req->spec, req->input, req->key, req->decision, [&](const SubmitResult& sub) {
        std::printf("saga %s (%s, intent key %s)\n", sub.saga_id.c_str(),
                    sub.created ? "new" : "existing: same intent key and content",
                    req->key.c_str());
        std::fflush(stdout);
      });
  if (!rec.ok() && rec.status().code() == Code::kAborted) {
    // Another worker holds the saga's lease: it drives the saga, not us.
    std::printf("outcome: %s\n", rec.status().message().c_str());
    return kExitOk;
  }
  if (!rec.ok()) return Fail(rec.status());
  std::printf("outcome: %s%s%s\n", rec->summary.state.c_str(),
              rec->summary.reason.empty() ? "" : " - ", rec->summary.reason.c_str());
  return ExitForSagaState(rec->summary.state);
}

int CmdStatus(const Options& o, storage::Store* store) {
  auto rec = store->LoadSaga(o.saga_id);
  if (!rec.ok()) return Fail(rec.status());
  auto effects = store->ListEffects(o.saga_id);
  if (!effects.ok()) return Fail(effects.status());
  if (o.json) {
    auto journal = store->ReadJournal(o.saga_id);
    if (!journal.ok()) return Fail(journal.status());
    std::printf("%s\n", SagaToJson(*rec, *effects, &*journal).dump(2).c_str());
  } else {
    PrintSagaText(*rec);
    std::printf("effects\n");
    for (const auto& e : *effects) {
      std::printf("  %s%s%s%s\n", Pad(e.step_id, 18).c_str(), Pad(e.kind, 14).c_str(),
                  Pad(e.tool, 18).c_str(), e.idempotency_key.c_str());
    }
  }
  return kExitOk;
}

int CmdList(const Options& o, storage::Store* store) {
  storage::SagaFilter f;
  if (!o.status_filter.empty()) {
    if (!ParseSagaState(o.status_filter)) {
      return Fail(
          Status::InvalidArgument("--status: unknown saga state \"" + o.status_filter + "\""));
    }
    f.states.push_back(o.status_filter);
  }
  auto list = store->ListSagas(f);
  if (!list.ok()) return Fail(list.status());
  if (o.json) {
    Json arr = Json::array();
    for (const auto& s : *list) {
      arr.push_back({{"saga_id", s.saga_id},
                     {"intent_key", s.intent_key},
                     {"spec", s.spec_name},
                     {"state", s.state},
                     {"reason", s.reason},
                     {"created_at", FormatTimeMs(s.created_ms)},
                     {"updated_at", FormatTimeMs(s.updated_ms)}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  for (const auto& s : *list) {
    std::printf("%s  %s%s%s%s\n", s.saga_id.c_str(), Pad(s.state, 18).c_str(),
                Pad(s.spec_name, 12).c_str(), Pad(FormatTimeMs(s.created_ms), 26).c_str(),
                s.intent_key.c_str());
  }
  return kExitOk;
}

// What `recover` did, one line per saga: which moved, which it left parked
// and why, which it could not move. The worst outcome decides the exit code:
// an error (1) > a saga left needing attention (4) > rolled back (3) > 0.
int PrintRecovery(const RecoveryReport& report) {
  int worst = kExitOk;
  int waiting = 0;
  for (const RecoveredSaga& s : report.sagas) {
    const char* sep = s.reason.empty() ? "" : " - ";
    switch (s.outcome) {
      case RecoveredSaga::Outcome::kMoved:
        std::printf("recovered %s: %s%s%s\n", s.saga_id.c_str(), s.state.c_str(), sep,
                    s.reason.c_str());
        if (ExitForSagaState(s.state) == kExitRolledBack && worst == kExitOk) {
          worst = kExitRolledBack;
        }
        break;
      case RecoveredSaga::Outcome::kParked:
        std::printf("parked %s: needs_attention - %s\n", s.saga_id.c_str(), s.reason.c_str());
        worst = kExitNeedsAttention;
        break;
      case RecoveredSaga::Outcome::kWaiting:
        if (s.state == SagaStateName(SagaState::kAwaitingCompletion)) {
          // Waiting for its provider (saga/completion.h): not a person's wait.
          std::printf("waiting %s: %s%s%s\n", s.saga_id.c_str(), s.state.c_str(), sep,
                      s.reason.c_str());
        } else {
          ++waiting;
        }
        break;
      case RecoveredSaga::Outcome::kFailed:
        std::printf("not moved %s: %s\n", s.saga_id.c_str(), s.reason.c_str());
        break;
      case RecoveredSaga::Outcome::kSkipped:
        break;
    }
  }
  int not_moved = 0;
  for (const RecoveredSaga& s : report.sagas) {
    not_moved += s.outcome == RecoveredSaga::Outcome::kFailed ? 1 : 0;
  }
  for (const std::string& e : report.errors) std::fprintf(stderr, "error: %s\n", e.c_str());
  std::printf(
      "recovery: %d saga(s) resumed (%d of them parked: needs attention), %d not moved, %d "
      "waiting for approval, %d left to the workers that hold them\n",
      report.resumed, report.parked, not_moved, waiting, report.skipped);
  if (report.waiting_completion > 0) {
    std::printf("recovery: %d saga(s) waiting for their provider (checked when due)\n",
                report.waiting_completion);
  }
  return report.errors.empty() ? worst : kExitInternal;
}

int CmdRecover(const Options& o, const ToolRegistry& tools, storage::Store* store,
               const preview_commit::TokenSigner* signer) {
  Engine engine(store, &tools, LiveEngineOptions(true, signer));
  auto report = engine.Recover(o.concurrency);
  if (!report.ok()) return Fail(report.status());
  return PrintRecovery(*report);
}

int CmdResolve(const Options& o, const ToolRegistry& tools, storage::Store* store,
               const preview_commit::TokenSigner* signer) {
  auto decision = ParseDecision(o.decision);
  if (!decision.ok()) return Fail(decision.status());
  Resolution r;
  r.step_id = o.step_id;
  r.decision = *decision;
  r.who = o.who;
  r.note = o.note;
  if (!o.result.empty()) {
    auto result = ReadInput(o.result);
    if (!result.ok()) return Fail(result.status());
    r.result = *result;
  }
  Engine engine(store, &tools, LiveEngineOptions(true, signer));
  auto rec = engine.Resolve(o.saga_id, r);
  if (!rec.ok()) return Fail(rec.status());
  std::printf("outcome: %s%s%s\n", rec->summary.state.c_str(),
              rec->summary.reason.empty() ? "" : " - ", rec->summary.reason.c_str());
  return ExitForSagaState(rec->summary.state);
}

// cancel, pause, resume SAGA --as WHO [--reason TEXT]: a durable request
// (saga/engine.h). `drive`: this process holds the journal (or PostgreSQL
// leases arbitrate) and carries the request out when nobody else drives the
// saga; else it is recorded for the process that drives the journal.
int CmdControl(const Options& o, const std::string& verb, bool drive, const std::string& driver,
               const ToolRegistry& tools, storage::Store* store,
               const preview_commit::TokenSigner* signer) {
  Engine engine(store, &tools, LiveEngineOptions(drive, signer));
  ControlRequest req{o.who, o.note, drive};
  auto out = verb == "cancel"  ? engine.Cancel(o.saga_id, req)
             : verb == "pause" ? engine.Pause(o.saga_id, req)
                               : engine.Resume(o.saga_id, req);
  if (!out.ok()) {
    const Status& s = out.status();
    return FailWith(s, s.code() == Code::kFailedPrecondition ? kExitUsage : ExitFor(s));
  }
  std::printf("%s: %s\n", verb.c_str(), out->note.c_str());
  if (out->pending && !driver.empty()) {
    std::printf("%s drives this journal and carries the request out\n", driver.c_str());
  }
  std::printf("saga %s: %s%s%s\n", out->saga.summary.saga_id.c_str(),
              out->saga.summary.state.c_str(), out->saga.summary.reason.empty() ? "" : " - ",
              out->saga.summary.reason.c_str());
  if (out->pending && out->saga.summary.state != SagaStateName(SagaState::kNeedsAttention)) {
    return kExitOk;  // recorded: the driving process carries it out
  }
  return ExitForSagaState(out->saga.summary.state);
}

int CmdApprovals(const Options& o, storage::Store* store) {
  Status error;
  Json pending = PendingApprovals(store, &error);
  if (!error.ok()) return Fail(error);
  if (o.json) {
    std::printf("%s\n", pending.dump(2).c_str());
    return kExitOk;
  }
  if (pending.empty()) std::printf("no commits waiting for approval\n");
  for (const auto& p : pending) {
    std::printf("saga %s  step %s  (%s)\n", p["saga_id"].get<std::string>().c_str(),
                p["step"].get<std::string>().c_str(), p["tool"].get<std::string>().c_str());
    std::printf("  preview:  %s\n", p["preview"].value("summary", "").c_str());
    std::printf("  version:  %s\n", p["preview"].value("resource_version", "").c_str());
    std::printf("  expires:  %s\n", p["expires_at"].get<std::string>().c_str());
    std::printf("  policy:   %s\n", PolicyLine(p).c_str());
    for (const auto& a : p["approvals"]) {
      std::printf("  approved: %s (%s) at %s%s%s\n", a.value("by", "").c_str(),
                  a.value("role", "").c_str(), a.value("at", "").c_str(),
                  a.value("note", "").empty() ? "" : ": ", a.value("note", "").c_str());
    }
    std::printf("  token:    %s\n", p["token"].get<std::string>().c_str());
  }
  return kExitOk;
}

// approve, reject TOKEN: who decides is a credential's principal, or --as
// taken at its word (cli/approvals.h).
int CmdDecide(const Options& o, bool approve, const ToolRegistry& tools, storage::Store* store,
              const preview_commit::TokenSigner* signer) {
  auto decider = ResolveDecider(o.decider, std::getenv(kCredentialEnv));
  if (!decider.ok()) return Fail(decider.status());
  ApprovalDecision d = std::move(decider).value();
  d.approve = approve;
  d.note = o.note;
  Engine engine(store, &tools, LiveEngineOptions(true, signer));
  auto rec = engine.Decide(o.token, d);
  if (!rec.ok()) {
    const Status& s = rec.status();
    if (s.message().rfind(kUnauthenticatedMessage, 0) == 0) {
      return FailWith(Status(s.code(), s.message() + "; " + CredentialHint()), kExitUsage);
    }
    return Fail(s);
  }
  std::printf("outcome: %s%s%s\n", rec->summary.state.c_str(),
              rec->summary.reason.empty() ? "" : " - ", rec->summary.reason.c_str());
  for (const auto& st : rec->steps) {
    // A commit under a policy that waits for more approvals.
    if (auto view = ApprovalView(rec->summary.saga_id, st);
        view && (*view)["policy"]["rule"].is_number()) {
      std::printf("policy:  %s\n", PolicyLine(*view).c_str());
    }
  }
  return ExitForSagaState(rec->summary.state);
}

// `keys`; `retire` runs with the journal open (`store`, and `engine` for
// --re-preview), the others without it.
int CmdKeys(const Options& o, Keys* keys, storage::Store* store, Engine* engine) {
  auto signer = keys->Signer();
  if (!signer.ok()) return Fail(signer.status());
  preview_commit::KeyRing* ring = keys->ring();
  if (o.keys_action == "rotate") {
    auto id = ring->Rotate();
    if (!id.ok()) return Fail(id.status());
    std::printf("new active key %s\n", id->c_str());
  } else if (o.keys_action == "retire") {
    Status s = RetireKey({o.key_id, o.re_preview, o.who}, ring, *signer, store, engine);
    if (!s.ok()) return Fail(s);
  } else if (o.keys_action != "list") {
    return Fail(Status::InvalidArgument("keys: expected list, rotate or retire KEY"));
  }
  for (const auto& k : ring->keys()) {
    std::printf("%-8s %s%s  created %s\n", k.key_id.c_str(), k.active ? "active" : "      ",
                k.retired ? " retired" : "", FormatTimeMs(k.created_at_ms).c_str());
  }
  return kExitOk;
}

int CmdSubmit(const Options& o, const ToolRegistry& tools, storage::Store* store) {
  Engine engine(store, &tools, LiveEngineOptions(false, nullptr));
  std::string key;
  auto sub = SubmitFromOptions(o, tools, &engine, &key);
  if (!sub.ok()) return Fail(sub.status());
  std::printf("%s %s\n", sub->saga_id.c_str(), sub->created ? "new" : "existing");
  return kExitOk;
}

int CmdWorker(const Options& o, const ToolRegistry& tools, storage::Store* store,
              const preview_commit::TokenSigner* signer) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  EngineOptions eo = LiveEngineOptions(false, signer);
  eo.owner = o.owner.empty() ? NewId("worker_") : o.owner;
  eo.lease_ms = o.lease_ms;
  eo.stop = &g_stop;
  observability::Metrics metrics;
  observability::ReportTo(&metrics, store, &eo);
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (!o.metrics_listen.empty()) {
    auto started = MetricsEndpoint::Start(o.metrics_listen, &metrics, store);
    if (!started.ok()) return Fail(started.status());
    endpoint = std::move(started).value();
    std::printf("worker %s: metrics on http://%s:%d/metrics\n", eo.owner.c_str(),
                endpoint->host().c_str(), endpoint->port());
  }
  std::unique_ptr<BackgroundPruner> pruner;
  if (!o.background_prune.older_than.empty()) {
    auto started = BackgroundPruner::Start(o.background_prune, store, SystemClock::Get());
    if (!started.ok()) return Fail(started.status());
    pruner = std::move(started).value();
  }
  std::unique_ptr<BackgroundReconciler> reconciler;
  if (!o.background_reconcile.every.empty()) {
    auto started = BackgroundReconciler::Start(o.background_reconcile, &tools, store,
                                               SystemClock::Get(), eo.observer);
    if (!started.ok()) return FailWith(started.status(), kExitUsage);
    reconciler = std::move(started).value();
  }
  Engine engine(store, &tools, eo);
  WorkerOptions wo;
  wo.concurrency = o.concurrency;
  wo.poll_ms = o.poll_ms;
  std::mutex out_mu;
  wo.on_done = [&](const std::string& saga_id, const Status& s) {
    std::lock_guard<std::mutex> lock(out_mu);
    if (s.ok()) {
      auto rec = store->LoadSaga(saga_id);
      std::printf("%s drove %s: %s\n", eo.owner.c_str(), saga_id.c_str(),
                  rec.ok() ? rec->summary.state.c_str() : "?");
    } else {
      std::printf("%s left %s: %s\n", eo.owner.c_str(), saga_id.c_str(), s.ToString().c_str());
    }
    std::fflush(stdout);
  };
  std::printf("worker %s: claiming sagas (concurrency %d, lease %lld ms)\n", eo.owner.c_str(),
              o.concurrency, static_cast<long long>(o.lease_ms));
  std::fflush(stdout);
  Status s = engine.Work(wo);
  std::printf("worker %s: stopped, leases released\n", eo.owner.c_str());
  if (!s.ok()) return Fail(s);
  return kExitOk;
}

// `serve`: the REST API (server/server.h) until SIGTERM or SIGINT.
int CmdServe(const Options& o, const ToolRegistry& tools, storage::Store* store,
             const preview_commit::TokenSigner* signer) {
  server::ServerOptions so = o.limits;
  Status listen = ParseListen(o.listen, "--listen", &so.host, &so.port);
  if (!listen.ok()) return Fail(listen);
  Status tls = CheckServeTls(so.tls_cert_file, so.tls_key_file);
  if (!tls.ok()) return FailWith(tls, kExitUsage);
  // Over HTTPS the web UI's session cookie is Secure (docs/server.md "Web UI").
  if (!so.tls_cert_file.empty()) so.ui.secure_cookie = true;
  if (!o.auth_path.empty()) {
    auto principals = server::LoadPrincipals(o.auth_path);
    if (!principals.ok()) return Fail(principals.status());
    so.principals = std::move(principals).value();
  }
  so.insecure_no_auth = o.insecure_no_auth;
  so.workers = o.workers;
  so.use_leases = IsPostgres(g_store_locator);
  so.limits = g_limits;
  if (!o.state_path.empty()) {
    // Deprecated for one release: server state lives in the journal's store.
    std::fprintf(stderr,
                 "idem serve: --state is deprecated and ignored: Idempotency-Key records and "
                 "specs live in the journal's store (%s)\n",
                 g_store_locator.c_str());
  }
  so.signer = signer;
  auto srv = server::Server::Create(store, &tools, so);
  if (!srv.ok() && srv.status().code() == Code::kFailedPrecondition) {
    Fail(srv.status());
    return kExitUsage;  // no --auth, or --insecure-no-auth off loopback
  }
  if (!srv.ok()) return Fail(srv.status());
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::unique_ptr<BackgroundPruner> pruner;
  if (!o.background_prune.older_than.empty()) {
    auto pruning = BackgroundPruner::Start(o.background_prune, store, SystemClock::Get());
    if (!pruning.ok()) return Fail(pruning.status());
    pruner = std::move(pruning).value();
  }
  std::unique_ptr<BackgroundReconciler> reconciler;
  if (!o.background_reconcile.every.empty()) {
    auto reconciling = BackgroundReconciler::Start(o.background_reconcile, &tools, store,
                                                   SystemClock::Get(), (*srv)->journal_observer());
    if (!reconciling.ok()) return FailWith(reconciling.status(), kExitUsage);
    reconciler = std::move(reconciling).value();
  }
  Status started = (*srv)->Start();
  if (!started.ok()) return Fail(started);
  observability::Log(observability::LogLevel::kInfo, "serving",
                     {{"host", so.host},
                      {"port", (*srv)->port()},
                      {"store", so.use_leases ? "postgresql" : "sqlite"},
                      {"workers", so.workers},
                      {"callers", so.principals.size()}});
  std::printf("idem server listening on %s:%d (%s%s, %d workers%s)\n", so.host.c_str(),
              (*srv)->port(), so.tls_cert_file.empty() ? "" : "HTTPS, ",
              so.use_leases ? "PostgreSQL, leases" : "SQLite, one driver", so.workers,
              so.principals.empty() ? ", NO AUTH" : "");
  std::fflush(stdout);
  while (!g_stop.load()) ::usleep(100'000);
  std::printf("idem server: stopping (running steps finish)\n");
  std::fflush(stdout);
  (*srv)->Stop();
  std::printf("idem server: stopped\n");
  return kExitOk;
}

// A --ui-session-*-s value (whole seconds, 1..max) as milliseconds.
CLI::Validator UiSecondsToMs(int64_t max_s) {
  return CLI::Validator(
      [max_s](std::string& s) {
        bool digits = !s.empty() && s.size() <= 9 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || std::stoll(s) < 1 || std::stoll(s) > max_s) {
          return "expected whole seconds, 1.." + std::to_string(max_s);
        }
        s = std::to_string(std::stoll(s) * 1000);
        return std::string();
      },
      "SECONDS");
}

int CmdFailpoints() {
  for (const auto& fp : failpoint::KnownFailpoints()) {
    std::printf("%-32s %s\n", fp.name, fp.boundary);
  }
  return kExitOk;
}

}  // namespace

int RunCli(int argc, char** argv, const FrontendConfig& config) {
  // A peer that closes its end (a provider killed mid-request, an MCP
  // client gone, a caller that hung up on `serve`) must come back as a
  // write error on that one connection, not as a signal that kills the
  // process: cpp-httplib writes with flags 0 and OpenSSL through write(2).
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{config.description, config.program};
  app.require_subcommand(1);
  // Global options are accepted after the subcommand too (`run SPEC --db x`):
  // a subcommand hands the options it does not know to the app. Subcommands
  // inherit this when they are added, so it is set first.
  app.fallthrough();
  Options o;
  const char* env_db = std::getenv("IDEM_DB");
  o.db = env_db != nullptr && *env_db != '\0' ? env_db : "idem.db";
  const char* env_store = std::getenv("IDEM_STORE");
  if (env_store != nullptr && *env_store != '\0') o.db = env_store;
  app.add_option("--store,--db", o.db,
                 "the journal: a SQLite file, or postgresql://... (default $IDEM_STORE, "
                 "$IDEM_DB or ./idem.db)");
  const char* env_keys = std::getenv("IDEM_KEYS");
  if (env_keys != nullptr) o.keys_path = env_keys;
  app.add_option("--keys", o.keys_path,
                 "commit-token keys (created 0600 on first use; default <db>.keys.json or "
                 "$IDEM_KEYS)");
  // Global, not serve's alone: a saga driven by `serve` with HTTP tools is
  // recovered, checked (awaiting_completion) and reconciled by the other
  // commands with the same tools.
  app.add_option("--tools", o.tools_path,
                 "an HTTP tools file to register, for every command (tools/http_tool.h)");
  std::string log_format = "text";
  std::string log_level;
  app.add_option("--log-format", log_format, "logs on stderr: text (default) or json, a line each")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error, critical or off (default: info for serve "
                 "and worker, off for the other commands)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--max-steps", g_limits.max_steps, "steps a submitted saga may have (default 100)")
      ->check(CLI::Range(1, 100));
  app.add_option("--max-arg-bytes", g_limits.max_arg_bytes,
                 "resolved arguments of one tool call, in bytes (default 1 MiB)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--max-saga-bytes", g_limits.max_saga_bytes,
                 "a saga's input and all resolved arguments, in bytes (default 8 MiB)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 32));
  if (config.add_options) config.add_options(app);

  auto* validate =
      app.add_subcommand("validate", "check a saga spec; exit 2 with the place if bad");
  validate->add_option("SPEC", o.spec_path, "spec file")->required();

  auto* run = app.add_subcommand("run", "submit an intent and run its saga, with a live timeline");
  run->add_option("SPEC", o.spec_path, "spec file")->required();
  run->add_option("--input", o.input, "input JSON, or @FILE");
  run->add_option(
      "--intent-key", o.intent_key,
      "intent key: the same key and content returns the same saga (default: a new key)");
  run->add_option("--decision", o.model_decision,
                  "the model decision behind it, JSON or @FILE: {model, prompt_sha256, ...} "
                  "(journaled with saga_created)");

  auto* status = app.add_subcommand("status", "show a saga, its steps and effects");
  status->add_option("SAGA", o.saga_id, "saga id")->required();
  status->add_flag("--json", o.json, "JSON, with the journal");

  auto* list = app.add_subcommand("list", "list sagas, newest first");
  list->add_option("--status", o.status_filter, "only sagas in this state");
  list->add_flag("--json", o.json, "JSON");

  auto* recover = app.add_subcommand("recover", "resume every saga that had not finished");
  recover->add_option("--concurrency", o.concurrency, "sagas resumed at once")
      ->check(CLI::Range(1, 64));

  std::string reconcile_since = "7d";
  auto* reconcile_cmd = app.add_subcommand(
      "reconcile", "re-check recorded effects against the providers; exit 13 on drift");
  reconcile_cmd->add_option("--since", reconcile_since,
                            "effects of the last DURATION (30m, 2h, 7d; default 7d)");
  reconcile_cmd->add_flag("--json", o.json, "JSON");

  auto* resolve = app.add_subcommand(
      "resolve", "record a person's decision about a parked step, then drive the saga on");
  resolve->add_option("SAGA", o.saga_id, "saga id")->required();
  resolve->add_option("STEP", o.step_id, "step id")->required();
  resolve
      ->add_option("--decision", o.decision,
                   "applied | not_applied | retry (a needs_attention step); "
                   "undone | retry_undo (a compensation_failed step)")
      ->required();
  resolve->add_option("--as", o.who, "who decides (recorded in the journal)")->required();
  resolve->add_option("--note", o.note, "why (recorded in the journal)");
  resolve->add_option("--result", o.result, "for applied: the provider's result, JSON or @FILE");

  // Durable requests (saga/engine.h): recorded in the store, honoured by
  // whichever process drives the saga.
  std::map<std::string, CLI::App*> controls;
  for (const auto& [verb, help] : std::vector<std::pair<std::string, std::string>>{
           {"cancel", "cancel a saga: completed steps are compensated in reverse"},
           {"pause", "pause a saga between steps (it holds no lease until resumed)"},
           {"resume", "resume a paused saga the way it was going"}}) {
    auto* c = app.add_subcommand(verb, help);
    c->add_option("SAGA", o.saga_id, "saga id")->required();
    c->add_option("--as", o.who, "who asks (recorded in the journal)")->required();
    c->add_option("--reason", o.note, "why (recorded in the journal)");
    controls[verb] = c;
  }

  auto* submit = app.add_subcommand("submit", "record an intent and its saga for workers to run");
  submit->add_option("SPEC", o.spec_path, "spec file")->required();
  submit->add_option("--input", o.input, "input JSON, or @FILE");
  submit->add_option("--intent-key", o.intent_key, "intent key (default: a new key)");

  auto* worker = app.add_subcommand(
      "worker", "claim and drive sagas until SIGTERM (then finish the step, release the leases)");
  worker->add_option("--owner", o.owner, "this worker's name in the leases (default: a new id)");
  worker->add_option("--concurrency", o.concurrency, "sagas driven at once")
      ->check(CLI::Range(1, 256));
  worker->add_option("--lease-ms", o.lease_ms, "lease length; renewed every third of it")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}));
  worker->add_option("--poll-ms", o.poll_ms, "wait between empty claims")
      ->check(CLI::Range(int64_t{1}, int64_t{60'000}));
  worker->add_option(
      "--metrics-listen", o.metrics_listen,
      "serve /metrics and /healthz on HOST:PORT (e.g. 127.0.0.1:9464; default: off)");

  auto* approvals = app.add_subcommand("approvals", "list commits waiting for a person");
  approvals->add_flag("--json", o.json, "JSON, with previews and tokens");

  auto* approve = app.add_subcommand("approve", "approve a waiting commit; the commit runs now");
  approve->add_option("TOKEN", o.token, "the commit token (from `approvals`)")->required();
  approve->add_option("--note", o.note, "why (journaled)");
  auto* reject = app.add_subcommand("reject", "reject a waiting commit; the saga rolls back");
  reject->add_option("TOKEN", o.token, "the commit token (from `approvals`)")->required();
  reject->add_option("--reason", o.note, "why (journaled)")->required();
  for (CLI::App* c : {approve, reject}) {  // who decides (cli/approvals.h)
    c->add_option("--auth", o.decider.auth_path,
                  "the auth file of `idem serve --auth`: your credential's principal and roles "
                  "decide");
    c->add_option("--credential", o.decider.credential,
                  std::string("@FILE: a file (chmod 600) holding your bearer token; or set ") +
                      kCredentialEnv);
    c->add_option("--as", o.decider.who,
                  "without a credential: who decides an \"approval\": \"human\" commit "
                  "(journaled, not authenticated); with one: must be its principal");
    c->add_option("--role", o.decider.roles, "refused: the roles come from the auth file");
  }

  auto* keys_cmd =
      app.add_subcommand("keys", "commit-token signing keys: list, rotate, retire KEY");
  keys_cmd->add_option("ACTION", o.keys_action, "list | rotate | retire")->required();
  keys_cmd->add_option("KEY", o.key_id, "the key id to retire");
  keys_cmd->add_flag("--re-preview", o.re_preview,
                     "retire: preview again (and ask again) the pending commits whose tokens "
                     "the key signed, with the active key");
  keys_cmd->add_option("--as", o.who, "retire --re-preview: who asks again (journaled)");

  auto* journal = app.add_subcommand(
      "journal", "the journal's high-water mark: check, accept-regression --as NAME --reason TEXT");
  journal->add_option("ACTION", o.journal_action, "check | accept-regression")->required();
  journal->add_option("--as", o.who, "who accepts the regression (recorded)");
  journal->add_option("--reason", o.note, "why (recorded)");

  auto* serve = app.add_subcommand(
      "serve", "serve the REST API (/v1) and drive sagas until SIGTERM (docs/server.md)");
  serve->add_option("--listen", o.listen, "HOST:PORT (default 127.0.0.1:8080)");
  serve->add_option("--auth", o.auth_path,
                    "callers: JSON [{\"name\", \"token_sha256\", \"roles\": [...]}]");
  serve->add_flag("--insecure-no-auth", o.insecure_no_auth,
                  "serve without authentication (loopback only)");
  serve->add_option("--workers", o.workers, "sagas driven at once")->check(CLI::Range(1, 256));
  // The HTTP front's bounds (docs/server.md "Limits"); the defaults are
  // ServerOptions'.
  server::ServerOptions& lim = o.limits;
  serve
      ->add_option("--request-timeout-ms", lim.request_timeout_ms,
                   "one deadline for a whole request, first byte to last body byte (10000)")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-header-bytes", lim.max_header_bytes,
                   "request line + header fields; larger: 431 (16384)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--max-header-fields", lim.max_header_fields, "header lines; more: 431 (64)")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-body-bytes", lim.max_body_bytes,
                   "decoded body, any transfer coding; larger: 413 (1048576)")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-connections", lim.max_connections,
                   "connections open at once; more: 503 (1024)")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-connections-per-client", lim.max_connections_per_client,
                   "connections per client IP address; more: 503 (64)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--max-streams", lim.max_streams, "event streams open at once (512)")
      ->check(CLI::PositiveNumber);
  serve
      ->add_option("--max-streams-per-client", lim.max_streams_per_client,
                   "event streams per client IP address (32)")
      ->check(CLI::PositiveNumber);
  serve->add_option("--http-threads", lim.http_threads, "threads running handlers (8)")
      ->check(CLI::Range(1, 256));
  serve->add_option("--tls-cert", lim.tls_cert_file,
                    "serve HTTPS: a PEM certificate chain (with --tls-key; docs/server.md)");
  serve->add_option("--tls-key", lim.tls_key_file,
                    "serve HTTPS: its PEM private key, owner-only (with --tls-cert)");
  // The web UI at /ui (docs/server.md "Web UI").
  serve->add_flag("!--no-ui", lim.ui.enabled, "do not serve the web UI at /ui");
  // MCP over Streamable HTTP at /mcp (docs/mcp.md).
  serve->add_flag("!--no-mcp", lim.mcp.enabled, "do not serve MCP at /mcp");
  serve->add_option("--mcp-allow-origin", lim.mcp.allowed_origins,
                    "an Origin allowed to call /mcp besides loopback ones (repeatable)");
  serve->add_option("--mcp-allow-host", lim.mcp.allowed_hosts,
                    "a Host name /mcp answers to besides loopback and --listen's (repeatable)");
  serve
      ->add_option("--ui-session-idle-s", lim.ui.session_idle_ms,
                   "a web UI session unused this many seconds ends (1800)")
      ->transform(UiSecondsToMs(7 * 24 * 3600));
  serve
      ->add_option("--ui-session-max-s", lim.ui.session_max_ms,
                   "a web UI session ends this many seconds after sign-in (43200)")
      ->transform(UiSecondsToMs(30 * 24 * 3600));
  serve->add_flag("--ui-secure-cookie", lim.ui.secure_cookie,
                  "mark the web UI's session cookie Secure (set when clients reach the server "
                  "over HTTPS, e.g. through a TLS proxy)");
  serve->add_option("--state", o.state_path,
                    "deprecated, ignored: Idempotency-Key records and the spec registry live "
                    "in the journal's store");

  OpenCommand open_cmd(&app);  // idem open begin|call|commit|rollback (cli/open.h)
  McpCommand mcp_cmd(&app);    // idem mcp: MCP over stdio (cli/mcp.h)
  AddBackgroundPruneFlags(serve, &o.background_prune);
  AddBackgroundPruneFlags(worker, &o.background_prune);
  AddBackgroundReconcileFlags(serve, &o.background_reconcile);
  AddBackgroundReconcileFlags(worker, &o.background_reconcile);
  PruneFlags prune_flags;
  auto* prune = AddPruneCommand(&app, &prune_flags);

  auto* fps = app.add_subcommand("failpoints", "list the failpoint names IDEM_FAILPOINT accepts");

  app.footer(
      "exit codes: 0 ok/succeeded, 1 internal or store error, 2 bad usage or input,\n"
      "            3 rolled back or failed, 4 needs attention, 5 intent key conflict, 6 not "
      "found,\n"
      "            7 waiting for approval, 8 busy: the journal is driven by another process,\n"
      "            or the saga or store is busy (try again), 9 commit token expired,\n"
      "            10 commit already decided, 11 the journal went back in time,\n"
      "            12 keys retire refused: pending commits still need the key,\n"
      "            13 reconcile found drift, 14 waiting for its provider to finish");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  for (const CLI::App* sub : app.get_subcommands()) g_command = sub->get_name();
  {
    const bool serves = serve->parsed() || worker->parsed();
    auto format = observability::ParseLogFormat(log_format);
    auto level = observability::ParseLogLevel(!log_level.empty() ? log_level
                                              : serves           ? "info"
                                                                 : "off");
    if (!format.ok()) return Fail(format.status());
    if (!level.ok()) return Fail(level.status());
    observability::SetUpLogging(*format, *level);
    observability::Log(observability::LogLevel::kDebug, "command",
                       {{"command", g_command}, {"pid", ::getpid()}});
  }

  Status armed = failpoint::ArmFromEnv();
  if (!armed.ok()) return Fail(armed);
  if (fps->parsed()) return CmdFailpoints();

  ToolRegistry tools;
  Context ctx{o.db};
  if (config.register_tools) {
    Status s = config.register_tools(tools, ctx);
    if (!s.ok()) return Fail(s);
  }
  if (!o.tools_path.empty()) {
    Status loaded = LoadHttpTools(o.tools_path, &tools);
    if (!loaded.ok()) return Fail(loaded);
  }
  // `mcp --tools F` and the global `--tools F` name one file: loaded once.
  if (mcp_cmd.parsed() && !mcp_cmd.tools_path().empty() && mcp_cmd.tools_path() != o.tools_path) {
    Status loaded = LoadHttpTools(mcp_cmd.tools_path(), &tools);
    if (!loaded.ok()) return Fail(loaded);
  }
  if (validate->parsed()) return CmdValidate(o, tools);

  g_store_locator = o.db;
  if (o.keys_path.empty()) o.keys_path = IsPostgres(o.db) ? "idem.keys.json" : o.db + ".keys.json";
  Keys keys(o.keys_path);
  const bool retire = keys_cmd->parsed() && o.keys_action == "retire";
  if (keys_cmd->parsed() && !retire) return CmdKeys(o, &keys, nullptr, nullptr);

  bool drives = run->parsed() || recover->parsed() || resolve->parsed() || approve->parsed() ||
                reject->parsed() || worker->parsed() || serve->parsed() ||
                (retire && o.re_preview) || open_cmd.drives() || mcp_cmd.parsed();
  const preview_commit::TokenSigner* signer = nullptr;
  if (drives || retire) {
    auto sg = keys.Signer();
    if (!sg.ok()) return Fail(sg.status());
    signer = *sg;
  }
  DriverLock lock;
  // The embedded journal has one driving process at a time; PostgreSQL
  // shares the work between processes with leases instead.
  if ((drives || journal->parsed()) && !IsPostgres(o.db)) {
    Status locked = lock.Acquire(o.db, g_command);
    if (locked.code() == Code::kAborted) {
      return FailWith(Status::Aborted(locked.message() + "; " + BusyAdvice(lock.holder())),
                      kExitBusy);
    }
    if (!locked.ok()) return Fail(locked);
  }
  for (const auto& [verb, c] : controls) {
    if (!c->parsed()) continue;
    // The request is a store write that the driving process honours: it
    // needs no driver lock. This process drives it on only if it gets the
    // lock at once (PostgreSQL: the saga's lease decides).
    auto sg = keys.Signer();
    if (!sg.ok()) return Fail(sg.status());
    bool drive = true;
    std::string driver;
    if (!IsPostgres(o.db)) {
      Status locked = lock.Acquire(o.db, g_command, /*wait_ms=*/0);
      drive = locked.ok();
      if (locked.code() == Code::kAborted) {
        const DriverLock::Holder& h = lock.holder();
        driver = h.pid > 0 ? "pid " + std::to_string(h.pid) +
                                 (h.command.empty() ? "" : " (`" + h.command + "`)")
                           : "another process";
      } else if (!locked.ok()) {
        return Fail(locked);
      }
    }
    auto cstore = storage::OpenStore(o.db);
    if (!cstore.ok()) return Fail(cstore.status());
    return CmdControl(o, verb, drive, driver, tools, cstore->get(), *sg);
  }
  auto store = storage::OpenStore(o.db);
  if (!store.ok()) return Fail(store.status());
  if (journal->parsed()) {
    Status done = JournalCommand(o.journal_action, o.who, o.note, store->get());
    return done.ok() ? kExitOk : Fail(done);
  }
  if (drives || submit->parsed() || open_cmd.parsed()) {
    // A journal behind its high-water mark is never driven.
    Status intact = (*store)->JournalIntegrity();
    if (!intact.ok()) return Fail(intact);
  }
  if (retire) {
    Engine engine(store->get(), &tools, LiveEngineOptions(false, signer));
    return CmdKeys(o, &keys, store->get(), o.re_preview ? &engine : nullptr);
  }
  if (prune->parsed()) {
    Status pruned = RunPrune(prune_flags, store->get(), SystemClock::Get(), stdout);
    return pruned.ok() ? kExitOk : Fail(pruned);
  }
  if (run->parsed()) return CmdRun(o, tools, store->get(), signer);
  if (status->parsed()) return CmdStatus(o, store->get());
  if (list->parsed()) return CmdList(o, store->get());
  if (recover->parsed()) return CmdRecover(o, tools, store->get(), signer);
  if (reconcile_cmd->parsed()) return CmdReconcile(reconcile_since, o.json, tools, store->get());
  if (resolve->parsed()) return CmdResolve(o, tools, store->get(), signer);
  if (approvals->parsed()) return CmdApprovals(o, store->get());
  if (submit->parsed()) return CmdSubmit(o, tools, store->get());
  if (worker->parsed()) return CmdWorker(o, tools, store->get(), signer);
  if (approve->parsed()) return CmdDecide(o, true, tools, store->get(), signer);
  if (reject->parsed()) return CmdDecide(o, false, tools, store->get(), signer);
  if (serve->parsed()) return CmdServe(o, tools, store->get(), signer);
  if (open_cmd.parsed())
    return open_cmd.Run(tools, store->get(), LiveEngineOptions(false, signer), Fail);
  if (mcp_cmd.parsed()) {
    // A PostgreSQL URL may hold a password: the hint names $IDEM_DB instead.
    const std::string cli = IsPostgres(o.db) ? "idem --db \"$IDEM_DB\"" : "idem --db " + o.db;
    return mcp_cmd.Run(&tools, store->get(), LiveEngineOptions(false, signer), cli, Fail);
  }
  return kExitUsage;
}

}  // namespace idem::cli
