#include "cli/open.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/cli.h"
#include "saga/call_view.h"
#include "saga/engine.h"
#include "saga/open_saga.h"
#include "saga/views.h"

#include <CLI/CLI.hpp>

namespace idem::cli {
namespace {

// JSON text, or @FILE; `empty` when not given.
Result<Json> ReadJsonArg(const std::string& text, const std::string& flag, Json empty) {
  if (text.empty()) return empty;
  if (text[0] == '@') {
    std::ifstream in(text.substr(1), std::ios::binary);
    if (!in) return Status::InvalidArgument(flag + ": cannot read " + text.substr(1));
    std::stringstream ss;
    ss << in.rdbuf();
    return ParseJson(ss.str(), flag + " " + text);
  }
  return ParseJson(text, flag);
}

Result<std::optional<ModelDecision>> ReadDecisionArg(const std::string& text,
                                                     const EngineOptions& eo) {
  if (text.empty()) return std::optional<ModelDecision>();
  auto doc = ReadJsonArg(text, "--decision", Json());
  if (!doc.ok()) return doc.status();
  auto d = ParseModelDecision(*doc, "--decision", eo.limits.max_decision_text_bytes);
  if (!d.ok()) return d.status();
  return std::optional<ModelDecision>(std::move(d).value());
}

int ExitForCall(const CallAnswer& a) {
  switch (a.refusal) {
    case CallRefusal::kNone:
      break;
    case CallRefusal::kBusy:
      return kExitBusy;
    case CallRefusal::kCallPending:
      return kExitAwaitingApproval;
    case CallRefusal::kCallIdReused:
      return kExitConflict;  // a call id in use for another call, like an intent key
    default:
      return kExitUsage;
  }
  if (a.state == "succeeded") return kExitOk;
  if (a.state == "awaiting_approval") return kExitAwaitingApproval;
  if (a.state == "needs_attention") return kExitNeedsAttention;
  if (a.state == "processing" || a.state == "unknown") return kExitBusy;
  return kExitRolledBack;  // failed, compensated
}

Json AnswerJson(const std::string& saga_id, const CallAnswer& a) {
  if (a.refusal != CallRefusal::kNone) {
    return {{"saga_id", saga_id}, {"refused", CallRefusalName(a.refusal)}, {"message", a.message}};
  }
  Json j = CallAnswerView(saga_id, a);
  if (auto approval = ApprovalView(saga_id, a.step)) {
    (*approval).erase("token");  // `idem approvals` shows tokens to whoever may approve
    j["approval"] = *approval;
  }
  return j;
}

}  // namespace

OpenCommand::OpenCommand(CLI::App* app) {
  open_ =
      app->add_subcommand("open", "an open saga for an agent loop: begin, call, commit, rollback");
  open_->require_subcommand(1);
  begin_ = open_->add_subcommand("begin", "begin an open saga: the tools its calls may use");
  begin_
      ->add_option("--intent-key", intent_key_,
                   "intent key (the same key and content: the same saga)")
      ->required();
  begin_->add_option("--tool", tools_, "a tool the calls may use (repeat the flag)")->required();
  begin_->add_option("--metadata", metadata_, "metadata JSON, or @FILE");
  begin_->add_option("--idle-timeout", idle_timeout_, "idle timeout: seconds or 30s, 15m, 24h");
  begin_->add_option("--on-idle", on_idle_, "rollback (default) or park")
      ->check(CLI::IsMember({"rollback", "park"}));
  begin_->add_option("--decision", decision_, "the model's decision, JSON or @FILE");
  call_ = open_->add_subcommand("call",
                                "one tool call of an open saga (a known call id calls nothing)");
  call_->add_option("SAGA", saga_id_, "saga id")->required();
  call_->add_option("--call-id", call_id_, "the model's tool-call id")->required();
  call_->add_option("--tool", tool_, "the tool")->required();
  call_->add_option("--args", args_, "arguments JSON, or @FILE (default {})");
  call_->add_flag("--repeat", repeat_, "a second effect on purpose: no deduplication by arguments");
  call_->add_option("--decision", decision_, "the model's decision, JSON or @FILE");
  commit_ = open_->add_subcommand("commit", "end an open saga: succeeded");
  commit_->add_option("SAGA", saga_id_, "saga id")->required();
  commit_->add_option("--as", who_, "who commits (journaled)")->required();
  commit_->add_option("--decision", decision_, "the model's decision, JSON or @FILE");
  rollback_ = open_->add_subcommand("rollback", "roll an open saga back: every call compensated");
  rollback_->add_option("SAGA", saga_id_, "saga id")->required();
  rollback_->add_option("--as", who_, "who rolls back (journaled)")->required();
  rollback_->add_option("--reason", reason_, "why (journaled)");
}

bool OpenCommand::parsed() const { return open_->parsed(); }

bool OpenCommand::drives() const { return parsed() && !begin_->parsed(); }

int OpenCommand::Run(const ToolRegistry& tools, storage::Store* store,
                     const EngineOptions& engine_options, int (*fail)(const Status&)) {
  Engine engine(store, &tools, engine_options);
  auto decision = ReadDecisionArg(decision_, engine_options);
  if (!decision.ok()) return fail(decision.status());
  if (begin_->parsed()) {
    BeginRequest br;
    br.intent_key = intent_key_;
    br.tools = tools_;
    auto metadata = ReadJsonArg(metadata_, "--metadata", Json::object());
    if (!metadata.ok()) return fail(metadata.status());
    br.metadata = *metadata;
    if (!idle_timeout_.empty()) {
      Json v = idle_timeout_;
      if (idle_timeout_.find_first_not_of("0123456789") == std::string::npos) {
        v = std::stoll(idle_timeout_.substr(0, 9));
      }
      br.idle_timeout_ms = ParseDurationMs(v);
      if (br.idle_timeout_ms <= 0) {
        return fail(
            Status::InvalidArgument("--idle-timeout: seconds, or 30s, 15m, 24h (at most 30d)"));
      }
    }
    br.on_idle = on_idle_ == "park" ? OnIdle::kPark : OnIdle::kRollback;
    br.decision = *decision;
    auto out = engine.Begin(br);
    if (!out.ok()) return fail(out.status());
    std::printf("%s\n",
                Json({{"saga_id", out->saga_id}, {"created", out->created}, {"state", "open"}})
                    .dump(2)
                    .c_str());
    return kExitOk;
  }
  if (call_->parsed()) {
    CallRequest cr;
    cr.call_id = call_id_;
    cr.tool = tool_;
    auto args = ReadJsonArg(args_, "--args", Json::object());
    if (!args.ok()) return fail(args.status());
    cr.args = *args;
    cr.repeat = repeat_;
    cr.decision = *decision;
    auto out = engine.Call(saga_id_, cr);
    if (!out.ok()) return fail(out.status());
    std::printf("%s\n", AnswerJson(saga_id_, *out).dump(2).c_str());
    if (out->refusal != CallRefusal::kNone)
      std::fprintf(stderr, "error: %s\n", out->message.c_str());
    return ExitForCall(*out);
  }
  if (commit_->parsed()) {
    auto out = engine.Commit(saga_id_, who_, *decision);
    if (!out.ok()) return fail(out.status());
    std::printf("%s\n",
                Json({{"saga_id", saga_id_}, {"state", out->summary.state}}).dump(2).c_str());
    return kExitOk;
  }
  ControlRequest cr;
  cr.who = who_;
  cr.reason = reason_;
  auto out = engine.Rollback(saga_id_, cr);
  if (!out.ok()) return fail(out.status());
  std::printf("%s\n", Json({{"saga_id", saga_id_},
                            {"state", out->saga.summary.state},
                            {"pending", out->pending},
                            {"note", out->note}})
                          .dump(2)
                          .c_str());
  return out->pending ? kExitOk : kExitRolledBack;
}

}  // namespace idem::cli
