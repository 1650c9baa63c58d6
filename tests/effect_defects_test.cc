// The effect protocol through the engine, over every capability mix and
// every answer, against a real SQLite journal and providers that keep a
// ledger: a compensation found after a crash or a takeover is never sent a
// second time where its earlier attempt may have landed, and a guard's read
// that answers anything but "exists" or "absent" never lets the write go.

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "saga/step_key.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

// A provider's ledger: effects applied per key (a keyed provider applies a
// key once; an idempotent operation sets a state, so a repeat adds
// nothing), and what its status lookup answers.
struct Ledger {
  std::mutex mu;
  std::map<std::string, int> applied;
  std::map<std::string, int> calls;
  /// The lookup's forced answer ("" answers the truth: applied or not).
  std::string lookup_answer;
  /// A request still in the network: it lands right after the first lookup
  /// has answered (a frozen worker's call, after a takeover).
  std::string lands_after_lookup;
  int lookups = 0;
};

std::unique_ptr<Tool> LedgerTool(Ledger* l, const std::string& name, EffectClass effect, bool keys,
                                 bool status) {
  ToolInfo info;
  info.name = name;
  info.effect = effect;
  info.honours_keys = keys;
  const bool counts_repeats = !keys && effect != EffectClass::kIdempotent;
  auto invoke = [l, counts_repeats](const ToolCall& c) {
    std::lock_guard<std::mutex> lock(l->mu);
    ++l->calls[c.key];
    if (counts_repeats || l->applied[c.key] == 0) ++l->applied[c.key];
    return ToolOutcome::Succeeded({{"ref", c.key}}, c.key);
  };
  FunctionTool::LookupFn lookup;
  if (status) {
    lookup = [l, counts_repeats](const std::string& key) {
      std::lock_guard<std::mutex> lock(l->mu);
      ++l->lookups;
      LookupOutcome o;
      if (l->lookup_answer == "error") {
        o.kind = LookupKind::kError;
        o.error = "503 from the status endpoint";
      } else if (l->lookup_answer == "pending") {
        o.kind = LookupKind::kPending;
      } else if (l->applied[key] > 0) {
        o.kind = LookupKind::kApplied;
        o.result = {{"ref", key}};
      } else {
        o.kind = LookupKind::kNotApplied;
      }
      if (!l->lands_after_lookup.empty() && l->lands_after_lookup == key) {
        l->lands_after_lookup.clear();
        if (counts_repeats || l->applied[key] == 0) ++l->applied[key];
      }
      return o;
    };
  }
  return std::make_unique<FunctionTool>(info, invoke, lookup);
}

// One test's journal (a real SQLite file), registry, providers and clock.
struct World {
  explicit World(const char* name) : dir(name) {}

  Status Open() {
    auto s = storage::OpenStore(dir.File("journal.db"));
    if (!s.ok()) return s.status();
    store = std::move(s).value();
    return Status::Ok();
  }
  EngineOptions Options() {
    EngineOptions o;
    o.clock = &clock;
    return o;
  }
  /// A one-step saga of `tool`, undone by `undo`.
  Result<SagaSpec> OneStep(const std::string& tool, const std::string& undo) {
    Json doc = {{"name", "one"},
                {"steps",
                 {{{"id", "only"},
                   {"tool", tool},
                   {"args", Json::object()},
                   {"compensate", {{"tool", undo}, {"args", Json::object()}}}}}}};
    return ParseSpec(doc, tools);
  }
  /// Leaves saga `id` as a crash in its rollback would: its one step
  /// `compensating` (the undo's `compensation_submitted` durable, its
  /// outcome not), the action's effect applied. Returns the step.
  Result<storage::StepRecord> LeaveCompensating(const std::string& id) {
    auto rec = store->LoadSaga(id);
    if (!rec.ok()) return rec.status();
    storage::StepRecord st = rec->steps[0];
    ledger.applied[st.step_key] = 1;
    st.state = "compensating";
    st.attempt = 1;
    st.comp_attempt = 1;
    st.result = {{"ref", st.step_key}};
    storage::WriteBatch b;
    b.saga_id = id;
    b.saga_state = "compensating";
    b.saga_reason = "rolled back by a test";
    b.steps = {st};
    IDEM_RETURN_IF_ERROR(store->Commit(b));
    return st;
  }

  test::TempDir dir;
  std::unique_ptr<storage::Store> store;
  ToolRegistry tools;
  Ledger ledger;
  ManualClock clock;
};

// ---- compensations found after a crash or a takeover

struct UndoCase {
  bool keys;
  bool idempotent;
  bool status;
  std::string lookup;  // "", "error", "pending"
  bool takeover;
  std::string earlier;  // the earlier undo attempt: "landed", "lost", "in_flight"
};

std::string Name(const UndoCase& c) {
  return std::string(c.keys ? "keys" : "nokeys") + "_" + (c.idempotent ? "idem" : "write") + "_" +
         (c.status ? "lookup" : "nolookup") + "_" + (c.lookup.empty() ? "truthful" : c.lookup) +
         "_" + (c.takeover ? "takeover" : "crash") + "_" + c.earlier;
}

void PrintTo(const UndoCase& c, std::ostream* os) { *os << Name(c); }

class CompensationFoundUncertainTest : public ::testing::TestWithParam<UndoCase> {};

// The saga rolls back; its one step is found `compensating` (the undo's
// `compensation_submitted` durable, its outcome not), and the earlier undo
// attempt had landed, was lost before the provider, or is still in the
// network (only a takeover leaves a sender alive). Whatever the tool can do
// and whatever its lookup answers, the provider holds at most one undo, and
// a saga that ends compensated holds exactly one.
TEST_P(CompensationFoundUncertainTest, TheUndoIsNeverSentWhereItMayHaveLanded) {
  const UndoCase c = GetParam();
  World w("idem_undo_matrix");
  ASSERT_OK(w.Open());
  ASSERT_OK(w.tools.Register(LedgerTool(&w.ledger, "room.book", EffectClass::kWrite, true, true)));
  ASSERT_OK(w.tools.Register(
      LedgerTool(&w.ledger, "room.refund",
                 c.idempotent ? EffectClass::kIdempotent : EffectClass::kWrite, c.keys, c.status)));
  ASSERT_OK_AND_ASSIGN(SagaSpec spec, w.OneStep("room.book", "room.refund"));
  EngineOptions o = w.Options();
  o.use_leases = c.takeover;  // with leases, a drive takes over from whoever held it
  o.owner = "worker-2";
  Engine engine(w.store.get(), &w.tools, o);
  ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(spec, Json::object(), "undo-" + Name(c)));
  ASSERT_OK_AND_ASSIGN(auto st, w.LeaveCompensating(sub.saga_id));
  const std::string undo_key = st.step_key + ":compensate";
  Ledger& ledger = w.ledger;
  if (c.earlier == "landed") ledger.applied[undo_key] = 1;
  if (c.earlier == "in_flight") ledger.lands_after_lookup = undo_key;
  ledger.lookup_answer = c.lookup;

  ASSERT_OK_AND_ASSIGN(auto out, engine.Run(sub.saga_id));
  if (c.earlier == "in_flight" && !c.status) {
    // Nothing asked the provider: the frozen request lands now (a keyed
    // provider absorbs it, an idempotent undo changes nothing).
    if ((!c.keys && !c.idempotent) || ledger.applied[undo_key] == 0) ++ledger.applied[undo_key];
    ledger.lands_after_lookup.clear();
  }
  const int undos = ledger.applied[undo_key];
  EXPECT_LE(undos, 1) << out.summary.state << ": " << out.summary.reason;
  if (out.summary.state == "compensated") {
    EXPECT_EQ(undos, 1) << "a compensated saga must hold its undo";
  } else {
    EXPECT_EQ(out.summary.state, "needs_attention") << out.summary.reason;
    EXPECT_FALSE(out.summary.reason.empty());
  }
}

std::vector<UndoCase> UndoCases() {
  std::vector<UndoCase> out;
  for (int caps = 0; caps < 8; ++caps) {
    for (const char* lookup : {"", "error", "pending"}) {
      for (bool takeover : {false, true}) {
        for (const char* earlier : {"landed", "lost", "in_flight"}) {
          const bool status = caps & 4;
          if (!status && lookup[0] != '\0') continue;                      // no lookup to answer
          if (!takeover && std::string(earlier) == "in_flight") continue;  // its sender died
          out.push_back({static_cast<bool>(caps & 1), static_cast<bool>(caps & 2), status, lookup,
                         takeover, earlier});
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryCapabilityAndAnswer, CompensationFoundUncertainTest,
                         ::testing::ValuesIn(UndoCases()),
                         [](const ::testing::TestParamInfo<UndoCase>& i) { return Name(i.param); });

// The defect as it was met: a refund whose tool has a status lookup but
// neither keys nor idempotence, found after a crash with the refund landed,
// and a lookup that fails. The refund must not be sent again.
TEST(CompensationDefectTest, ALookupErrorAfterACrashParksTheUndoInsteadOfResendingIt) {
  World w("idem_undo_defect");
  ASSERT_OK(w.Open());
  ASSERT_OK(
      w.tools.Register(LedgerTool(&w.ledger, "card.charge", EffectClass::kWrite, true, true)));
  ASSERT_OK(
      w.tools.Register(LedgerTool(&w.ledger, "card.refund", EffectClass::kWrite, false, true)));
  ASSERT_OK_AND_ASSIGN(SagaSpec spec, w.OneStep("card.charge", "card.refund"));
  Engine engine(w.store.get(), &w.tools, w.Options());
  ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(spec, Json::object(), "pay-1"));
  ASSERT_OK_AND_ASSIGN(auto st, w.LeaveCompensating(sub.saga_id));
  const std::string refund_key = st.step_key + ":compensate";
  Ledger& ledger = w.ledger;
  ledger.applied[refund_key] = 1;  // the refund landed before the crash
  ledger.lookup_answer = "error";

  ASSERT_OK_AND_ASSIGN(auto out, engine.Run(sub.saga_id));
  EXPECT_EQ(ledger.applied[refund_key], 1) << "refunded twice";
  EXPECT_EQ(ledger.calls[refund_key], 0);
  EXPECT_EQ(out.summary.state, "needs_attention");
  EXPECT_NE(out.steps[0].error.find("status lookup of card.refund kept failing"), std::string::npos)
      << out.steps[0].error;
}

// The first attempt's `compensated` of a tool that only a lookup can
// re-learn is durable on its own, before anything else is written: when the
// journal observer hears of it (observers hear of entries once durable), the
// store holds nothing after it. A keyed undo may ride with the next write.
TEST(CompensationDefectTest, TheRecordOfAnUndoOnlyALookupCanRelearnIsDurableAtOnce) {
  for (bool keyed : {false, true}) {
    World w("idem_undo_durable");
    ASSERT_OK(w.Open());
    ASSERT_OK(
        w.tools.Register(LedgerTool(&w.ledger, "card.charge", EffectClass::kWrite, true, true)));
    ASSERT_OK(
        w.tools.Register(LedgerTool(&w.ledger, "card.refund", EffectClass::kWrite, keyed, true)));
    ToolInfo ship;
    ship.name = "ship.send";
    ship.honours_keys = true;
    ASSERT_OK(w.tools.Register(std::make_unique<FunctionTool>(
        ship, [](const ToolCall&) { return ToolOutcome::Failed("409 address refused", false); })));
    Json doc = {{"name", "pay"},
                {"steps",
                 {{{"id", "charge"},
                   {"tool", "card.charge"},
                   {"args", Json::object()},
                   {"compensate", {{"tool", "card.refund"}, {"args", Json::object()}}}},
                  {{"id", "ship"},
                   {"tool", "ship.send"},
                   {"args", Json::object()},
                   {"compensate", nullptr},
                   {"reason", "refused before it ships"}}}}};
    ASSERT_OK_AND_ASSIGN(SagaSpec spec, ParseSpec(doc, w.tools));
    EngineOptions o = w.Options();
    std::string after_compensated;  // the last durable event when `compensated` was heard of
    o.observer = [&](const storage::JournalEntry& e) {
      if (e.event != "compensated") return;
      auto journal = w.store->ReadJournal(e.saga_id);
      if (journal.ok() && !journal->empty()) after_compensated = journal->back().event;
    };
    Engine engine(w.store.get(), &w.tools, o);
    ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(spec, Json::object(), "pay-2"));
    ASSERT_OK_AND_ASSIGN(auto out, engine.Run(sub.saga_id));
    ASSERT_EQ(out.summary.state, "compensated");
    if (keyed) {
      EXPECT_EQ(after_compensated, "saga_compensated") << "a keyed undo rides with the next write";
    } else {
      EXPECT_EQ(after_compensated, "compensated") << "written with the next write, not at once";
    }
    EXPECT_EQ(w.ledger.applied[StepKey(sub.saga_id, "charge") + ":compensate"], 1);
  }
}

// ---- a guard's read, every answer

// Runs a one-step saga whose write is guarded by a read that answers `read`.
// The write tool has neither keys nor a lookup: a wrong "absent" would be a
// second booking.
Result<storage::SagaRecord> RunGuarded(World* w, const ToolOutcome& read, const std::string& key) {
  IDEM_RETURN_IF_ERROR(w->Open());
  IDEM_RETURN_IF_ERROR(
      w->tools.Register(LedgerTool(&w->ledger, "room.book", EffectClass::kWrite, false, false)));
  ToolInfo find;
  find.name = "room.find";
  find.effect = EffectClass::kRead;
  IDEM_RETURN_IF_ERROR(w->tools.Register(
      std::make_unique<FunctionTool>(find, [read](const ToolCall&) { return read; })));
  Json doc = {{"name", "stay"},
              {"steps",
               {{{"id", "room"},
                 {"tool", "room.book"},
                 {"args", Json::object()},
                 {"guard",
                  {{"tool", "room.find"},
                   {"args", Json::object()},
                   {"exists_when", "/found"},
                   {"result", "/booking"}}},
                 {"compensate", nullptr},
                 {"reason", "a test"}}}}};
  auto spec = ParseSpec(doc, w->tools);
  if (!spec.ok()) return spec.status();
  Engine engine(w->store.get(), &w->tools, w->Options());
  auto sub = engine.Submit(*spec, Json::object(), key);
  if (!sub.ok()) return sub.status();
  return engine.Run(sub->saga_id);
}

struct GuardCase {
  std::string name;
  ToolOutcome read;  // what the guard's read answers
  bool writes;       // the guarded write is made
  bool parks;
};

void PrintTo(const GuardCase& c, std::ostream* os) { *os << c.name; }

class GuardAnswerTest : public ::testing::TestWithParam<GuardCase> {};

TEST_P(GuardAnswerTest, TheWriteGoesOnOnlyOnAJudgedAbsent) {
  const GuardCase c = GetParam();
  World w("idem_guard_answers");
  ASSERT_OK_AND_ASSIGN(auto out, RunGuarded(&w, c.read, "guard-" + c.name));
  EXPECT_EQ(w.ledger.calls[StepKey(out.summary.saga_id, "room")], c.writes ? 1 : 0);
  if (c.parks) {
    EXPECT_EQ(out.summary.state, "needs_attention");
    EXPECT_NE(out.steps[0].error.find("guard_unanswered"), std::string::npos) << out.steps[0].error;
    // The reason says what came back, so a person knows where to look.
    const std::string& why = out.steps[0].error;
    EXPECT_NE(why.substr(why.size() - 2), ": ") << why;
  } else {
    EXPECT_EQ(out.summary.state, "succeeded");
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryAnswer, GuardAnswerTest,
    ::testing::Values(
        GuardCase{"exists", ToolOutcome::Succeeded({{"found", true}, {"booking", "B-1"}}), false,
                  false},
        GuardCase{"absent", ToolOutcome::Succeeded({{"found", false}}), true, false},
        GuardCase{"unreadable", ToolOutcome::Succeeded({{"found", true}}), false, true},
        GuardCase{"accepted", ToolOutcome::Accepted("job-1"), false, true},
        GuardCase{"unknown", ToolOutcome::Unknown("timed out"), false, true},
        GuardCase{"retryable", ToolOutcome::Failed("503", true), false, true},
        GuardCase{"refused", ToolOutcome::Failed("400", false), false, true}),
    [](const ::testing::TestParamInfo<GuardCase>& i) { return i.param.name; });

// The defect as it was met: the answer switch had no `accepted`, so such a
// read parked with an empty reason (or, read as absent, made the write).
TEST(GuardDefectTest, AnAcceptedReadParksWithTheReasonAndNoWrite) {
  World w("idem_guard_accepted");
  ASSERT_OK_AND_ASSIGN(auto out, RunGuarded(&w, ToolOutcome::Accepted("search-7"), "accepted"));
  EXPECT_EQ(w.ledger.calls[StepKey(out.summary.saga_id, "room")], 0);
  EXPECT_EQ(out.summary.state, "needs_attention");
  EXPECT_NE(out.steps[0].error.find("the read answered accepted"), std::string::npos)
      << out.steps[0].error;
}

}  // namespace
}  // namespace idem
