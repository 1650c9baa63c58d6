// The chaos sweep's checker (chaos/checker.h) finds each defect it names:
// every check is fed a broken input (a duplicated effect, an orphan, a
// missing compensation, ...) and must count it, and a clean input gives no
// finding. The last tests run `idem-chaos check` on a real journal and
// ledger made by travel-booking, then break the ledger with a real provider
// call. Also: the sweep's plan is a pure function of its seed.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "examples/travel_booking/providers.h"
#include "tests/test_util.h"

#include "chaos/checker.h"
#include "chaos/schedule.h"
#include <sys/wait.h>

namespace idem::chaos {
namespace {

using storage::SagaRecord;
using storage::StepRecord;
using travel::LedgerEffect;

// A two-step saga (flights.reserve, hotels.book, each with a compensation)
// in `state`, its steps in `step_state`.
SagaRecord Saga(const std::string& id, const std::string& state, const std::string& step_state) {
  SagaRecord r;
  r.summary.saga_id = id;
  r.summary.intent_key = "ik-" + id;
  r.summary.state = state;
  r.spec = Json::parse(R"({"steps": [
      {"id": "a", "tool": "flights.reserve", "compensate": {"tool": "flights.cancel"}},
      {"id": "b", "tool": "hotels.book", "compensate": {"tool": "hotels.cancel"}}]})");
  for (int i = 0; i < 2; ++i) {
    StepRecord st;
    st.saga_id = id;
    st.index = i;
    st.step_id = i == 0 ? "a" : "b";
    st.tool = i == 0 ? "flights.reserve" : "hotels.book";
    st.state = step_state;
    st.step_key = id + "/" + st.step_id;
    r.steps.push_back(st);
  }
  return r;
}

// The journal's action effect rows of `saga`'s succeeded and compensated
// steps (what the engine records with each step's outcome).
std::vector<storage::EffectRecord> Rows(const SagaRecord& saga) {
  std::vector<storage::EffectRecord> rows;
  for (const auto& st : saga.steps) {
    if (st.state != "succeeded" && st.state != "compensated") continue;
    storage::EffectRecord e;
    e.saga_id = saga.summary.saga_id;
    e.step_id = st.step_id;
    e.kind = "action";
    e.tool = st.tool;
    e.idempotency_key = st.step_key;
    rows.push_back(e);
  }
  return rows;
}

void AddSaga(CheckData* d, const SagaRecord& saga) {
  d->sagas.push_back(saga);
  for (auto& e : Rows(saga)) d->journal_effects.push_back(std::move(e));
}

LedgerEffect Effect(const std::string& provider, const std::string& op, const std::string& key) {
  LedgerEffect e;
  e.provider = provider;
  e.operation = op;
  e.idempotency_key = key;
  e.result = Json::object();
  return e;
}

// A clean world: one succeeded saga with both effects, one compensated saga
// with both effects undone, one acknowledged saga present.
CheckData Clean() {
  CheckData d;
  AddSaga(&d, Saga("sg_ok", "succeeded", "succeeded"));
  AddSaga(&d, Saga("sg_rb", "compensated", "compensated"));
  d.effects = {Effect("flights", "reserve", "sg_ok/a"),
               Effect("hotels", "book", "sg_ok/b"),
               Effect("flights", "reserve", "sg_rb/a"),
               Effect("hotels", "book", "sg_rb/b"),
               Effect("flights", "cancel", "sg_rb/a:compensate"),
               Effect("hotels", "cancel", "sg_rb/b:compensate")};
  d.acked = {{"sg_ok", "ik-sg_ok"}};
  return d;
}

// Only `check` has findings, exactly `n` of them.
void ExpectOnly(const CheckResult& r, const std::string& check, int n) {
  // The check is a row of the table, with the count.
  EXPECT_EQ(r.Count(check), n) << check;
  EXPECT_NE(std::find(CheckNames().begin(), CheckNames().end(), check), CheckNames().end())
      << check << " is not a row of the table";
  EXPECT_EQ(r.findings.size(), static_cast<size_t>(n));
  for (const auto& name : CheckNames()) {
    EXPECT_EQ(r.Count(name), name == check ? n : 0) << name;
  }
  EXPECT_FALSE(r.ok());
}

TEST(ChaosChecker, CleanWorldHasNoFinding) {
  CheckResult r = Check(Clean(), {true});
  EXPECT_TRUE(r.ok()) << r.findings.front().detail;
  EXPECT_EQ(r.sagas, 2);
  EXPECT_EQ(r.effects, 6);
  EXPECT_EQ(r.counts.size(), CheckNames().size());
}

TEST(ChaosChecker, DuplicatedEffect) {
  CheckData d = Clean();
  d.effects.push_back(Effect("hotels", "book", "sg_ok/b"));
  CheckResult r = Check(d, {});
  ExpectOnly(r, "duplicate_effects", 1);
  EXPECT_NE(r.findings[0].detail.find("hotels.book sg_ok/b applied 2 times"), std::string::npos)
      << r.findings[0].detail;
}

TEST(ChaosChecker, LostSaga) {
  CheckData d = Clean();
  d.acked.push_back({"sg_gone", "ik-gone"});
  CheckResult r = Check(d, {});
  ExpectOnly(r, "lost_sagas", 1);
  EXPECT_EQ(r.findings[0].saga_id, "sg_gone");
}

TEST(ChaosChecker, OneIntentKeyAnsweredWithTwoSagas) {
  CheckData d = Clean();
  AddSaga(&d, Saga("sg_twin", "succeeded", "succeeded"));
  d.effects.push_back(Effect("flights", "reserve", "sg_twin/a"));
  d.effects.push_back(Effect("hotels", "book", "sg_twin/b"));
  d.acked.push_back({"sg_twin", "ik-sg_ok"});
  // Two findings: ik-sg_ok names two sagas, and the journal has sg_twin
  // under its own intent key.
  ExpectOnly(Check(d, {}), "intent_key_split", 2);
}

TEST(ChaosChecker, ASagaAcknowledgedForAnotherIntentKey) {
  CheckData d = Clean();
  d.acked.push_back({"sg_rb", "ik-someone-else"});
  CheckResult r = Check(d, {});
  ExpectOnly(r, "intent_key_split", 1);
  EXPECT_NE(r.findings[0].detail.find("the journal has it under ik-sg_rb"), std::string::npos)
      << r.findings[0].detail;
}

TEST(ChaosChecker, OrphanEffectAndOrphanUndo) {
  CheckData d = Clean();
  d.effects.push_back(Effect("cars", "rent", "sg_nobody/c"));
  d.effects.push_back(Effect("cars", "return", "sg_nobody/c:compensate"));
  ExpectOnly(Check(d, {}), "orphan_effects", 2);
}

TEST(ChaosChecker, MissingCompensation) {
  CheckData d = Clean();
  // The journal says step b of sg_rb was compensated; the ledger has no undo.
  d.effects.erase(d.effects.begin() + 5);
  CheckResult r = Check(d, {});
  ExpectOnly(r, "missing_compensations", 1);
  EXPECT_EQ(r.findings[0].saga_id, "sg_rb");
}

TEST(ChaosChecker, EffectLeftBehindByARolledBackOrFailedSaga) {
  CheckData d = Clean();
  // A failed saga whose step the journal holds as failed, yet applied.
  d.sagas.push_back(Saga("sg_f", "failed", "failed"));
  d.effects.push_back(Effect("flights", "reserve", "sg_f/a"));
  ExpectOnly(Check(d, {}), "effects_left_behind", 1);
}

TEST(ChaosChecker, SucceededSagaWithoutItsEffect) {
  CheckData d = Clean();
  d.effects.erase(d.effects.begin() + 1);  // sg_ok/b
  ExpectOnly(Check(d, {}), "missing_effects", 1);
}

// A step the journal calls succeeded must have its effect row: the row a
// rollback, the drift job and an audit read. One lost with its COMMIT (a
// batch reported durable that was not) is a finding though the ledger has
// the effect; a read step (no compensation) is not judged.
TEST(ChaosChecker, ASucceededStepWithoutItsJournalEffectRowIsFound) {
  CheckData d = Clean();
  ASSERT_EQ(d.journal_effects[1].idempotency_key, "sg_ok/b");
  d.journal_effects.erase(d.journal_effects.begin() + 1);
  CheckResult r = Check(d, {});
  ExpectOnly(r, "missing_effect_rows", 1);
  EXPECT_EQ(r.findings[0].saga_id, "sg_ok");
  EXPECT_NE(r.findings[0].detail.find("sg_ok/b"), std::string::npos) << r.findings[0].detail;
  // A compensation's row under the same key does not stand in for it.
  storage::EffectRecord undo;
  undo.saga_id = "sg_ok";
  undo.kind = "compensation";
  undo.idempotency_key = "sg_ok/b";
  d.journal_effects.push_back(undo);
  ExpectOnly(Check(d, {}), "missing_effect_rows", 1);
  // A read (no compensation) has no row to judge.
  d = Clean();
  d.sagas[0].spec["steps"][1].erase("compensate");
  d.effects.erase(d.effects.begin() + 1);
  d.journal_effects.erase(d.journal_effects.begin() + 1);
  EXPECT_TRUE(Check(d, {}).ok());
}

TEST(ChaosChecker, SagaNeitherTerminalNorParked) {
  CheckData d = Clean();
  d.sagas.push_back(Saga("sg_run", "running", "planned"));
  d.sagas.push_back(Saga("sg_comp", "compensating", "planned"));
  ExpectOnly(Check(d, {}), "not_terminal_or_parked", 2);
}

TEST(ChaosChecker, ParkedWithoutReason) {
  CheckData d = Clean();
  d.sagas.push_back(Saga("sg_p", "needs_attention", "planned"));
  ExpectOnly(Check(d, {}), "parked_without_reason", 1);
}

TEST(ChaosChecker, ParkedSagaLeftAfterThePersonIsUnsettled) {
  CheckData d = Clean();
  SagaRecord p = Saga("sg_p", "needs_attention", "planned");
  p.summary.reason = "step b: outcome unknown";
  d.sagas.push_back(p);
  d.sagas.push_back(Saga("sg_w", "awaiting_approval", "planned"));
  EXPECT_TRUE(Check(d, {false}).ok()) << "before the person's pass, waiting is allowed";
  ExpectOnly(Check(d, {true}), "parked_unsettled", 2);
}

TEST(ChaosChecker, ALateWriteUnderALostLeaseIsFound) {
  CheckData d = Clean();
  // w0 claimed sg_ok and wrote; w1 took it over after w0 stopped past its
  // lease; w1 writes (fine); w0, resumed, writes too: its write passed the
  // fence while w1 held the lease.
  d.journal_writes = {{1, "sg_ok", "submitted", "chaos-w0-0", "chaos-w0-0"},
                      {2, "sg_ok", "succeeded", "chaos-w1-1", "chaos-w1-1"},
                      {3, "sg_ok", "succeeded", "chaos-w0-0", "chaos-w1-1"},
                      // Not a leasing process (an operator's cancel): never a finding.
                      {4, "sg_ok", "cancel_requested", "", "chaos-w1-1"}};
  CheckResult r = Check(d, {});
  ExpectOnly(r, "late_writes", 1);
  EXPECT_EQ(r.findings[0].saga_id, "sg_ok");
  EXPECT_NE(r.findings[0].detail.find("journal entry 3 (succeeded) written by chaos-w0-0 while "
                                      "chaos-w1-1 held the saga's lease"),
            std::string::npos)
      << r.findings[0].detail;
  d.journal_writes.erase(d.journal_writes.begin() + 2);
  EXPECT_TRUE(Check(d, {}).ok());
}

TEST(ChaosChecker, TheAuditFileIsReadAndABadLineNamed) {
  test::TempDir dir("chaos_audit");
  const std::string path = dir.File("audit.tsv");
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("7\tsg_a\tsubmitted\tchaos-w0-0\tchaos-w0-0\n8\tsg_a\tsucceeded\t\tchaos-w1-2\n", f);
    std::fclose(f);
  }
  auto writes = ReadJournalAudit(path);
  ASSERT_TRUE(writes.ok()) << writes.status().ToString();
  ASSERT_EQ(writes->size(), 2u);
  EXPECT_EQ((*writes)[0].seq, 7);
  EXPECT_EQ((*writes)[0].writer, "chaos-w0-0");
  EXPECT_EQ((*writes)[1].writer, "");
  EXPECT_EQ((*writes)[1].lease_owner, "chaos-w1-2");
  {
    FILE* f = std::fopen(path.c_str(), "a");
    std::fputs("x\tsg_a\n", f);
    std::fclose(f);
  }
  auto bad = ReadJournalAudit(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("audit.tsv:3"), std::string::npos)
      << bad.status().message();
  EXPECT_EQ(ReadJournalAudit(dir.File("none.tsv")).status().code(), Code::kNotFound);
}

// trip.json books flight, hotel and car at once: when the car fails, the
// flight and the hotel may complete after it did. Each such branch must be
// undone in the ledger like any other step.
// A slow provider's job still pending after its saga ended (a rollback
// that did not wait for the branch at its provider) is a finding; a job
// that was confirmed or declined, or one whose saga still waits, is not.
TEST(ChaosChecker, AJobStillPendingAtItsProviderAfterTheSagaEndedIsUnsettled) {
  CheckData d = Clean();
  auto job = [](const std::string& key, const std::string& outcome) {
    travel::LedgerJob j;
    j.provider = "transfers";
    j.operation = "book";
    j.idempotency_key = key;
    j.job_id = "JOB-" + key;
    j.outcome = outcome;
    return j;
  };
  d.jobs = {job("sg_ok/a", "done"), job("sg_rb/b", "declined")};
  EXPECT_TRUE(Check(d, {}).ok());
  SagaRecord waiting = Saga("sg_wait", "awaiting_completion", "processing");
  d.sagas.push_back(waiting);
  d.jobs.push_back(job("sg_wait/a", "pending"));
  ExpectOnly(Check(d, {}), "not_terminal_or_parked", 1);  // not this check's: it still waits
  d.sagas.pop_back();
  d.jobs.pop_back();
  d.jobs.push_back(job("sg_rb/a", "pending"));
  CheckResult r = Check(d, {});
  ExpectOnly(r, "unsettled_jobs", 1);
  EXPECT_EQ(r.findings[0].saga_id, "sg_rb");
  EXPECT_NE(r.findings[0].detail.find("JOB-sg_rb/a"), std::string::npos) << r.findings[0].detail;
}

TEST(ChaosChecker, ABranchThatCompletedAfterASiblingFailedMustBeUndone) {
  CheckData d = Clean();
  SagaRecord s = Saga("sg_par", "compensated", "compensated");
  s.spec = Json::parse(R"({"steps": [
      {"id": "a", "tool": "flights.reserve", "compensate": {"tool": "flights.cancel"}},
      {"id": "b", "tool": "hotels.book", "after": [], "compensate": {"tool": "hotels.cancel"}},
      {"id": "c", "tool": "cars.rent", "after": [], "compensate": {"tool": "cars.return"}}]})");
  StepRecord car = s.steps[1];
  car.index = 2;
  car.step_id = "c";
  car.tool = "cars.rent";
  car.state = "failed";
  car.step_key = "sg_par/c";
  s.steps.push_back(car);
  AddSaga(&d, s);
  // The hotel answered after the car failed; the journal calls it
  // compensated, the ledger has the booking and no cancel.
  d.effects.push_back(Effect("flights", "reserve", "sg_par/a"));
  d.effects.push_back(Effect("flights", "cancel", "sg_par/a:compensate"));
  d.effects.push_back(Effect("hotels", "book", "sg_par/b"));
  ExpectOnly(Check(d, {}), "missing_compensations", 1);
  // The same branch left succeeded in the journal of the rolled-back saga.
  d.sagas.back().steps[1].state = "succeeded";
  CheckResult r = Check(d, {});
  ExpectOnly(r, "effects_left_behind", 1);
  EXPECT_NE(r.findings[0].detail.find("step b (succeeded)"), std::string::npos)
      << r.findings[0].detail;
  // Undone: clean.
  d.effects.push_back(Effect("hotels", "cancel", "sg_par/b:compensate"));
  EXPECT_TRUE(Check(d, {}).ok());
}

TEST(ChaosSchedule, ThePlanIsAPureFunctionOfTheSeed) {
  Settings s;
  s.seed = 42;
  s.sagas = 30;
  s.postgres = true;
  s.pg_restarts = 3;
  Plan a = MakePlan(s);
  Plan b = MakePlan(s);
  EXPECT_EQ(a.Text(), b.Text());
  EXPECT_EQ(a.Digest(), b.Digest());
  s.seed = 43;
  EXPECT_NE(MakePlan(s).Digest(), a.Digest());
  int restarts = 0;
  for (const auto& saga : a.sagas) {
    for (const auto& c : saga.commands) {
      for (const auto& e : c.during) restarts += e.what == "pg_restart" ? 1 : 0;
      if (c.kill_at >= 0) {
        EXPECT_LE(c.kill_at, 1.2);
      }
    }
  }
  EXPECT_EQ(restarts, 3);
}

// The new kinds are in the plan, and in its text (so a replay names them):
// the HTTP path with server and provider kills, the agent loop on an open
// saga with a repeated call id, kills timed into the parallel branches.
TEST(ChaosSchedule, ThePlanOfOneSeedHasTheNewKindsTwiceTheSame) {
  for (bool pg : {false, true}) {
    Settings s;
    s.seed = 20261201;
    s.sagas = 120;
    s.postgres = pg;
    Plan a = MakePlan(s);
    Plan b = MakePlan(s);
    ASSERT_EQ(a.Text(), b.Text());
    std::map<std::string, int> seen;
    for (const auto& saga : a.sagas) {
      seen[saga.scenario] += 1;
      std::map<std::string, int> calls;
      for (const auto& c : saga.commands) {
        seen[c.verb] += 1;
        for (const auto& e : c.during) seen[e.what] += 1;
        if (c.kill_in_branches) seen["kill_in_branches"] += 1;
        if (c.verb == "open_call" && ++calls[c.call_id] == 2) seen["repeated_call_id"] += 1;
      }
    }
    for (const char* kind :
         {"trip_approval", "trip_direct", "open_agent", "trip_server", "trip_async", "http_submit",
          "http_approve", "open_begin", "open_call", "open_commit", "open_rollback", "kill_server",
          "kill_provider", "kill_in_branches", "repeated_call_id"}) {
      EXPECT_GT(seen[kind], 0) << kind << (pg ? " (postgres)" : " (sqlite)");
    }
    EXPECT_NE(a.Text().find(" fault=transfers.book="), std::string::npos);
    EXPECT_NE(a.Text().find(" http_submit "), std::string::npos);
    EXPECT_NE(a.Text().find("/branches"), std::string::npos);
    EXPECT_NE(a.Text().find("during=kill_server@"), std::string::npos);
    EXPECT_NE(a.Text().find(" call=call-1:"), std::string::npos);
  }
}

// ---- idem-chaos check on real files ----------------------------------------

int Shell(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const std::string kBin = IDEM_BINARY_DIR;
const std::string kSrc = IDEM_SOURCE_DIR;

TEST(ChaosCheckCommand, FindsADuplicateAndAnOrphanInARealLedger) {
  test::TempDir dir("chaos_check");
  const std::string db = dir.File("journal.db");
  const std::string ledger = dir.File("ledger.sqlite");
  const std::string tb =
      kBin + "/examples/travel_booking/travel-booking --db " + db + " --ledger " + ledger;
  std::string out;
  ASSERT_EQ(Shell(tb + " run " + kSrc + "/chaos/specs/trip_direct.json --input @" + kSrc +
                      "/examples/travel_booking/input.json --intent-key k1",
                  &out),
            0)
      << out;
  // "saga ID (new, intent key k1)" after the live timeline.
  const size_t at = out.find("\nsaga ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string id = out.substr(at + 6, out.find(" (", at) - at - 6);
  const std::string check =
      kBin + "/chaos/idem-chaos check --store " + db + " --ledger " + ledger + " --after-resolve";
  ASSERT_EQ(Shell(check, &out), 0) << out;
  EXPECT_NE(out.find("| duplicate_effects        | 0"), std::string::npos) << out;

  // The world goes wrong behind idem's back: the hotel books the saga's key
  // a second time, and a car is rented under a key no saga has.
  {
    ToolRegistry registry;
    travel::ProviderOptions options;
    options.ledger_path = ledger;
    ASSERT_TRUE(travel::RegisterTravelTools(registry, options).ok());
    ToolCall hotel;
    hotel.tool = "hotels.book";
    hotel.key = id + "/book_hotel";
    hotel.args = {{"traveller", "Ana"},
                  {"city", "Tokyo"},
                  {"check_in", "2026-12-01"},
                  {"check_out", "2026-12-08"},
                  {"currency", "EUR"}};
    ASSERT_TRUE(registry.Find("hotels.book")->Invoke(hotel).kind == OutcomeKind::kSucceeded);
    ToolCall car;
    car.tool = "cars.rent";
    car.key = "sg_nobody/rent_car";
    car.args = {
        {"traveller", "Ana"}, {"city", "Tokyo"}, {"from", "2026-12-01"}, {"until", "2026-12-08"}};
    ASSERT_TRUE(registry.Find("cars.rent")->Invoke(car).kind == OutcomeKind::kSucceeded);
  }
  EXPECT_EQ(Shell(check, &out), 1) << out;
  EXPECT_NE(out.find("| duplicate_effects        | 1"), std::string::npos) << out;
  EXPECT_NE(out.find("| orphan_effects           | 1"), std::string::npos) << out;
  EXPECT_NE(out.find("hotels.book " + id + "/book_hotel applied 2 times"), std::string::npos)
      << out;
}

TEST(ChaosCheckCommand, BadInputIsAClearError) {
  std::string out;
  EXPECT_EQ(
      Shell(kBin + "/chaos/idem-chaos check --store /nonexistent/dir/j.db --ledger /nope.sqlite",
            &out),
      2)
      << out;
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  test::TempDir dir("chaos_check_bad");
  EXPECT_EQ(Shell(kBin + "/chaos/idem-chaos check --store " + dir.File("j.db") + " --ledger " +
                      dir.File("missing.sqlite"),
                  &out),
            2)
      << out;
  EXPECT_NE(out.find("missing.sqlite"), std::string::npos) << out;
}

}  // namespace
}  // namespace idem::chaos
