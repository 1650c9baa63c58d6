// The JSON views of journal records (saga/views.h) that `idem status --json`,
// `idem approvals` and the server's GET /v1/sagas/{id} and GET /v1/approvals
// show: steps, effects, and the commits waiting for a person.

#include "saga/views.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "saga/states.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/json_util.h"

namespace idem {
namespace {

// 2023-11-14T22:13:20.000Z
constexpr int64_t kExpiresMs = 1'700'000'000'000;

/// A step that succeeded, as the engine journals it.
storage::StepRecord SucceededStep() {
  storage::StepRecord st;
  st.saga_id = "sg_1";
  st.index = 1;
  st.step_id = "reserve";
  st.tool = "flights.reserve";
  st.state = "succeeded";
  st.attempt = 2;
  st.step_key = "sg_1/reserve";
  st.args = {{"who", "ana"}};
  st.args_fingerprint = "sha256:00";
  st.result = {{"ref", "FL-7"}};
  st.external_ref = "FL-7";
  st.error = "503 busy";  // the first attempt's
  st.updated_ms = 5;
  return st;
}

/// A two-phase step waiting for a person, with its phase as the engine
/// writes it (saga/engine.cc: preview + token, then the approval request).
storage::StepRecord WaitingStep() {
  storage::StepRecord st;
  st.saga_id = "sg_1";
  st.index = 2;
  st.step_id = "charge";
  st.tool = "payments.charge";
  st.state = StepStateName(StepState::kAwaitingApproval);
  st.attempt = 0;
  st.step_key = "sg_1/charge";
  st.args = {{"amount_cents", 184000}};
  st.args_fingerprint = "sha256:11";
  st.phase = {{"preview",
               {{"summary", "charge EUR 1,840.00"},
                {"changes", {{"amount_cents", 184000}}},
                {"resource_version", "v3"}}},
              {"token", "idem1.payload.mac"},
              {"nonce", "n-1"},
              {"expires_ms", kExpiresMs},
              {"args_fingerprint", "sha256:11"},
              {"previews", 1}};
  return st;
}

// ---- StepView

TEST(StepViewTest, ShowsTheJournalFieldsOfAStep) {
  Json want = {{"index", 1},
               {"id", "reserve"},
               {"tool", "flights.reserve"},
               {"state", "succeeded"},
               {"attempts", 2},
               {"key", "sg_1/reserve"},
               {"args", {{"who", "ana"}}},
               {"result", {{"ref", "FL-7"}}},
               {"external_ref", "FL-7"},
               {"error", "503 busy"},
               {"compensation_attempts", 0},
               {"compensation_result", nullptr}};
  EXPECT_EQ(StepView(SucceededStep()), want);
}

TEST(StepViewTest, ShowsTheCompensationOfAnUndoneStep) {
  storage::StepRecord st = SucceededStep();
  st.state = "compensated";
  st.comp_attempt = 1;
  st.comp_result = {{"cancelled", "FL-7"}};
  Json v = StepView(st);
  EXPECT_EQ(v["state"], "compensated");
  EXPECT_EQ(v["compensation_attempts"], 1);
  EXPECT_EQ(v["compensation_result"], (Json{{"cancelled", "FL-7"}}));
}

TEST(StepViewTest, AStepThatNeverRanHasNullArgumentsAndResult) {
  storage::StepRecord st;
  st.index = 0;
  st.step_id = "first";
  st.tool = "a.do";
  st.state = "planned";
  st.step_key = "sg_1/first";
  Json v = StepView(st);
  EXPECT_EQ(v["state"], "planned");
  EXPECT_EQ(v["attempts"], 0);
  EXPECT_TRUE(v["args"].is_null());
  EXPECT_TRUE(v["result"].is_null());
  EXPECT_EQ(v["external_ref"], "");
  EXPECT_EQ(v["error"], "");
}

TEST(StepViewTest, AOnePhaseStepHasNoPreviewOrApprovalFields) {
  Json v = StepView(SucceededStep());
  EXPECT_FALSE(v.contains("preview"));
  EXPECT_FALSE(v.contains("approval"));
  EXPECT_FALSE(v.contains("approval_expires_at"));
}

TEST(StepViewTest, ATwoPhaseStepShowsItsPreviewAndDeadlineButNotItsToken) {
  Json v = StepView(WaitingStep());
  EXPECT_EQ(v["state"], "awaiting_approval");
  EXPECT_EQ(v["preview"], WaitingStep().phase["preview"]);
  EXPECT_TRUE(v["approval"].is_null()) << "no decision yet";
  EXPECT_EQ(v["approval_expires_at"], FormatTimeMs(kExpiresMs));
  EXPECT_EQ(v["approval_expires_at"], "2023-11-14T22:13:20.000Z");
  // The token goes to approvers only (ApprovalView), never into a status.
  EXPECT_EQ(v.dump().find("idem1.payload.mac"), std::string::npos) << v.dump();
  EXPECT_FALSE(v.contains("token"));
  EXPECT_FALSE(v.contains("nonce"));
}

TEST(StepViewTest, AnApprovedStepShowsTheDecision) {
  storage::StepRecord st = WaitingStep();
  st.state = "succeeded";
  Json approval = {{"decision", "approved"}, {"by", "bea"}, {"note", "ok"}, {"at_ms", 7}};
  st.phase["approval"] = approval;
  Json v = StepView(st);
  EXPECT_EQ(v["approval"], approval);
}

TEST(StepViewTest, APhaseWithoutADeadlineHasNoApprovalExpiry) {
  storage::StepRecord st = WaitingStep();
  st.phase.erase("expires_ms");
  Json v = StepView(st);
  EXPECT_TRUE(v.contains("preview"));
  EXPECT_FALSE(v.contains("approval_expires_at"));
}

// ---- EffectView

TEST(EffectViewTest, ShowsTheEffectWithItsTime) {
  storage::EffectRecord e;
  e.saga_id = "sg_1";
  e.step_id = "reserve";
  e.kind = "compensation";
  e.tool = "flights.cancel";
  e.idempotency_key = "sg_1/reserve:compensate";
  e.result = {{"cancelled", true}};
  e.external_ref = "FL-7";
  e.at_ms = kExpiresMs + 42;
  Json want = {{"step", "reserve"},
               {"kind", "compensation"},
               {"tool", "flights.cancel"},
               {"key", "sg_1/reserve:compensate"},
               {"external_ref", "FL-7"},
               {"result", {{"cancelled", true}}},
               {"at", "2023-11-14T22:13:20.042Z"}};
  EXPECT_EQ(EffectView(e), want);
}

// ---- ApprovalView

TEST(ApprovalViewTest, AWaitingStepIsShownWithItsToken) {
  std::optional<Json> v = ApprovalView("sg_1", WaitingStep());
  ASSERT_TRUE(v.has_value());
  Json want = {{"saga_id", "sg_1"},
               {"step", "charge"},
               {"tool", "payments.charge"},
               {"args", {{"amount_cents", 184000}}},
               {"preview",
                {{"summary", "charge EUR 1,840.00"},
                 {"changes", {{"amount_cents", 184000}}},
                 {"resource_version", "v3"}}},
               {"expires_at", "2023-11-14T22:13:20.000Z"},
               {"token", "idem1.payload.mac"},
               // "approval": "human" is one person with the role approver,
               // and nobody has approved yet.
               {"policy", {{"rule", nullptr}, {"role", "approver"}, {"quorum", 1}}},
               {"approvals", Json::array()}};
  EXPECT_EQ(*v, want);
}

TEST(ApprovalViewTest, StepsThatAreNotWaitingAreNotShown) {
  for (StepState s :
       {StepState::kPlanned, StepState::kPreviewed, StepState::kSubmitted, StepState::kUnknown,
        StepState::kSucceeded, StepState::kFailed, StepState::kCompensating,
        StepState::kCompensated, StepState::kCompensationFailed, StepState::kNeedsAttention}) {
    storage::StepRecord st = WaitingStep();  // with a phase and a token
    st.state = StepStateName(s);
    EXPECT_EQ(ApprovalView("sg_1", st), std::nullopt) << st.state;
  }
  EXPECT_EQ(ApprovalView("sg_1", SucceededStep()), std::nullopt);
}

TEST(ApprovalViewTest, AWaitingStepWithoutAPhaseIsNotShown) {
  storage::StepRecord st = WaitingStep();
  st.phase = Json();
  EXPECT_EQ(ApprovalView("sg_1", st), std::nullopt);
}

}  // namespace
}  // namespace idem
