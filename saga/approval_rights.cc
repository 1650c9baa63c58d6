#include "saga/approval_rights.h"

#include <algorithm>

#include "preview_commit/phase.h"
#include "preview_commit/two_phase.h"
#include "saga/open_saga.h"

#include "common/principal_name.h"

namespace idem {
namespace {

constexpr const char* kApproverRole = "approver";

bool Holds(const ApprovalDecision& d, const std::string& role) {
  return d.any_role || std::find(d.roles.begin(), d.roles.end(), role) != d.roles.end();
}

}  // namespace

std::string IntentKeyOwner(const std::string& intent_key) {
  const size_t colon = intent_key.find(':');
  return colon == std::string::npos ? "" : intent_key.substr(0, colon);
}

std::vector<std::string> Requesters(const storage::SagaRecord& saga, const std::string& step_id) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& name) {
    if (name.empty()) return;
    for (const std::string& n : out) {
      if (SameName(n, name)) return;
    }
    out.push_back(name);
  };
  add(IntentKeyOwner(saga.summary.intent_key));
  if (auto plan = ReadOpenPlan(saga.spec); plan.ok()) {
    for (const OpenPlan::Call& c : plan->calls) {
      if (c.step_id == step_id) add(c.by);
    }
  }
  return out;
}

Status CheckDecider(const storage::SagaRecord& saga, const storage::StepRecord& step,
                    const ApprovalDecision& d) {
  auto phase = preview_commit::PhaseRecord::FromJson(step.phase);
  if (!phase) return Status::Ok();
  const bool asks_role = phase->policy && phase->policy->pass.empty();
  if (asks_role) {
    const preview_commit::PolicyDemand& p = *phase->policy;
    const std::string need = std::to_string(p.quorum) + " distinct " + p.role +
                             " approval(s) (rule " + std::to_string(p.rule) +
                             " of the step's approval policy)";
    if (!d.authenticated) {
      return Status::FailedPrecondition(
          std::string(kUnauthenticatedMessage) + "this commit needs " + need +
          ", and only a person who proved who they are with a credential checked against the "
          "auth file counts; " +
          (d.who.empty() ? std::string("this decision") : d.who) + " did not");
    }
    if (!Holds(d, p.role)) {
      return Status::FailedPrecondition(std::string(preview_commit::kRoleMissingMessage) + p.role +
                                        ": " + d.who + " does not hold the role " + p.role +
                                        " (the commit needs " + need + ")");
    }
  } else if (d.authenticated && !Holds(d, kApproverRole)) {
    return Status::FailedPrecondition(std::string(preview_commit::kRoleMissingMessage) +
                                      kApproverRole + ": " + d.who + " does not hold the role " +
                                      kApproverRole);
  }
  if (d.any_role) return Status::Ok();
  for (const std::string& requester : Requesters(saga, step.step_id)) {
    if (SameName(requester, d.who)) {
      return Status::FailedPrecondition(
          std::string(kSelfApprovalMessage) + d.who + " asked for this commit (" +
          (requester == d.who ? "" : "as \"" + requester + "\", ") + "saga " +
          saga.summary.saga_id + ", step " + step.step_id +
          "): the requester never counts toward its approval; another person decides");
    }
  }
  return Status::Ok();
}

}  // namespace idem
