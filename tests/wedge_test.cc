// Nothing wedges (issue 11, defect 1): every condition a drive cannot get
// past parks the saga needs_attention with the reason journaled (saga/park.h)
// instead of an error that each recovery and sweep repeats. Against a real
// SQLite journal: a template without a value in a forward step and in a
// compensation, an unregistered forward and compensation tool, a frozen
// spec edited in the file until it no longer validates, and a store that
// keeps refusing a write (a trigger in the file). Each test asserts the
// parked state, the journaled reason and code, and that recovering again
// (and a worker's sweeps) makes no new attempt. Resolve refuses a result
// that would leave a template without a value, and a person settles a
// parked compensation with `undone`.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "saga/views.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"

namespace idem {
namespace {

using test::StatusIs;
using test::TempDir;

// A trip of three steps: book (keyed, undone by cancel with the booking's
// id), car (no keys, no status: an unknown outcome parks it; undone by
// return with the rental's id), pay (keyed; fails for good when told to).
// `pay_args` lets a test make the forward step reference the car's result.
Json TripSpec(const Json& pay_args = Json::object()) {
  return {
      {"name", "trip"},
      {"steps",
       {{{"id", "book"},
         {"tool", "res.book"},
         {"args", Json::object()},
         {"compensate", {{"tool", "res.cancel"}, {"args", {{"id", "${steps.book.result.id}"}}}}}},
        {{"id", "car"},
         {"tool", "car.rent"},
         {"args", Json::object()},
         {"compensate",
          {{"tool", "car.return"}, {"args", {{"rental_id", "${steps.car.result.rental_id}"}}}}}},
        {{"id", "pay"},
         {"tool", "pay.charge"},
         {"args", pay_args},
         {"compensate", nullptr},
         {"reason", "the test's payment fails or is the last step"}}}}};
}

// Runs `sql` on the journal file behind the store's back (an edit by hand,
// or a trigger); returns the rows it changed.
int EditFile(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr);
  char* err = nullptr;
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  int changed = rc == SQLITE_OK ? sqlite3_changes(db) : -1;
  if (rc != SQLITE_OK) ADD_FAILURE() << sql << ": " << (err ? err : sqlite3_errmsg(db));
  sqlite3_free(err);
  sqlite3_close(db);
  return changed;
}

class WedgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, storage::OpenStore(dir_.File("journal.db")));
    Register(&tools_, /*with_car_return=*/true, /*with_pay=*/true);
  }

  // The tools, counted per name. The car answers `car_result_` (or unknown
  // when car_unknown_), the payment fails for good when pay_fails_.
  void Register(ToolRegistry* reg, bool with_car_return, bool with_pay) {
    Add(reg, "res.book", true, [](const ToolCall&) {
      return ToolOutcome::Succeeded({{"id", "B1"}});
    });
    Add(reg, "res.cancel", true,
        [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); });
    Add(reg, "car.rent", false, [this](const ToolCall&) {
      return car_unknown_ ? ToolOutcome::Unknown("timed out") : ToolOutcome::Succeeded(car_result_);
    });
    if (with_car_return) {
      Add(reg, "car.return", true,
          [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); });
    }
    if (with_pay) {
      Add(reg, "pay.charge", true, [this](const ToolCall&) {
        return pay_fails_ ? ToolOutcome::Failed("card declined", /*retryable=*/false)
                          : ToolOutcome::Succeeded({{"charge", "C1"}});
      });
    }
  }

  void Add(ToolRegistry* reg, const std::string& name, bool keys,
           std::function<ToolOutcome(const ToolCall&)> fn) {
    ToolInfo info;
    info.name = name;
    info.effect = EffectClass::kWrite;
    info.honours_keys = keys;
    auto counted = [this, name, fn](const ToolCall& c) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_[name];
      }
      return fn(c);
    };
    ASSERT_OK(reg->Register(std::make_unique<FunctionTool>(info, counted)));
  }

  int Calls(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[name];
  }
  int TotalCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [name, c] : calls_) n += c;
    return n;
  }

  EngineOptions Options() {
    EngineOptions o;
    o.clock = &clock_;
    o.owner = "wedge-test";
    return o;
  }

  std::string Submit(const Json& spec_doc) {
    auto spec = ParseSpec(spec_doc, tools_);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    if (!spec.ok()) return "";
    Engine engine(store_.get(), &tools_, Options());
    auto sub = engine.Submit(*spec, Json::object(), NewId("intent_"));
    EXPECT_TRUE(sub.ok()) << sub.status().ToString();
    return sub.ok() ? sub->saga_id : "";
  }

  size_t JournalSize(const std::string& saga_id) {
    auto j = store_->ReadJournal(saga_id);
    EXPECT_TRUE(j.ok());
    return j.ok() ? j->size() : 0;
  }

  // The last journal entry named `event` (of `step`, "" for the saga's).
  Json LastEntry(const std::string& saga_id, const std::string& event, const std::string& step) {
    auto j = store_->ReadJournal(saga_id);
    EXPECT_TRUE(j.ok());
    Json found;
    for (const auto& e : *j) {
      if (e.event == event && e.step_id == step) found = e.data;
    }
    return found;
  }

  // The saga is parked, its reason holds `code` and `what`, the park's
  // journal entry says so, and another recovery (and a worker's sweeps)
  // makes no attempt: no call, no journal entry.
  void ExpectParkedForGood(const std::string& saga_id, const std::string& code,
                           const std::string& what) {
    ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(saga_id));
    EXPECT_EQ(rec.summary.state, "needs_attention");
    EXPECT_NE(rec.summary.reason.find(code + ": "), std::string::npos) << rec.summary.reason;
    EXPECT_NE(rec.summary.reason.find(what), std::string::npos) << rec.summary.reason;
    Json parked = LastEntry(saga_id, "saga_needs_attention", "");
    EXPECT_EQ(parked.value("code", ""), code) << parked.dump();
    EXPECT_EQ(parked.value("reason", ""), rec.summary.reason);
    EXPECT_FALSE(NeedsDrive(rec, clock_.NowMs())) << "the sweeper would drive it again";

    const size_t entries = JournalSize(saga_id);
    const int calls = TotalCalls();
    Engine engine(store_.get(), &tools_, Options());
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(auto report, engine.Recover());
      EXPECT_TRUE(report.sagas.empty()) << "recover picked the parked saga up again";
      EXPECT_EQ(report.resumed, 0);
    }
    // A worker sweeping for a while does not claim it either.
    std::atomic<bool> stop{false};
    EngineOptions wo = Options();
    wo.stop = &stop;
    Engine worker(store_.get(), &tools_, wo);
    WorkerOptions w;
    w.poll_ms = 5;
    std::atomic<int> drives{0};
    w.on_done = [&](const std::string&, const Status&) { ++drives; };
    std::thread t([&] { (void)worker.Work(w); });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    stop = true;
    t.join();
    EXPECT_EQ(drives.load(), 0);
    EXPECT_EQ(JournalSize(saga_id), entries) << "a parked saga got new journal entries";
    EXPECT_EQ(TotalCalls(), calls) << "a parked saga got new tool calls";
  }

  TempDir dir_{"idem_wedge"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  ManualClock clock_;
  std::mutex mu_;
  std::map<std::string, int> calls_;
  Json car_result_ = {{"rental_id", "R1"}};
  bool car_unknown_ = false;
  bool pay_fails_ = false;
};

// ---- templates without a value

TEST_F(WedgeTest, ForwardTemplateWithoutValueParksTheStep) {
  car_result_ = {{"car", "compact"}};  // no rental_id
  std::string id = Submit(TripSpec({{"rental", "${steps.car.result.rental_id}"}}));
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(rec.steps[2].state, "needs_attention");
  EXPECT_EQ(rec.steps[2].error,
            "missing_value: steps[2].args.rental: \"${steps.car.result.rental_id}\" has no value");
  Json step_park = LastEntry(id, "needs_attention", "pay");
  EXPECT_EQ(step_park.value("code", ""), "missing_value");
  EXPECT_EQ(Calls("pay.charge"), 0) << "never called with a hole in its arguments";
  // The views show the reason and its code.
  Json view = StepView(rec.steps[2]);
  EXPECT_EQ(view.value("park_code", ""), "missing_value") << view.dump();
  ExpectParkedForGood(id, "missing_value", "${steps.car.result.rental_id}");
}

TEST_F(WedgeTest, CompensationTemplateWithoutValueParksAndAPersonSettlesIt) {
  car_result_ = {{"car", "compact"}};  // no rental_id: its return cannot be called
  pay_fails_ = true;
  std::string id = Submit(TripSpec());
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
  EXPECT_EQ(rec.summary.state, "needs_attention") << rec.summary.reason;
  EXPECT_EQ(rec.steps[1].state, "compensation_failed");
  EXPECT_EQ(rec.steps[0].state, "succeeded") << "the earlier undo waits for a person";
  EXPECT_EQ(rec.summary.reason,
            "compensation of step car cannot run: missing_value: compensation of car: "
            "steps[1].compensate.args.rental_id: \"${steps.car.result.rental_id}\" has no value");
  Json failed = LastEntry(id, "compensation_failed", "car");
  EXPECT_EQ(failed.value("code", ""), "missing_value");
  EXPECT_EQ(Calls("car.return"), 0);
  EXPECT_EQ(Calls("res.cancel"), 0);
  ExpectParkedForGood(id, "missing_value", "steps[1].compensate.args.rental_id");

  // A person returned the car by hand: the rollback goes on to the booking.
  Resolution r;
  r.step_id = "car";
  r.decision = Decision::kUndone;
  r.who = "ops";
  ASSERT_OK_AND_ASSIGN(auto done, engine.Resolve(id, r));
  EXPECT_EQ(done.summary.state, "compensated");
  EXPECT_EQ(done.steps[0].state, "compensated");
  EXPECT_EQ(done.steps[1].state, "compensated");
  EXPECT_EQ(Calls("res.cancel"), 1);
  EXPECT_EQ(Calls("car.return"), 0);
}

TEST_F(WedgeTest, RetryUndoOfACompensationStillWithoutItsValueParksAgain) {
  car_result_ = {{"car", "compact"}};
  pay_fails_ = true;
  std::string id = Submit(TripSpec());
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK(engine.Run(id));
  Resolution r;
  r.step_id = "car";
  r.decision = Decision::kRetryUndo;
  r.who = "ops";
  ASSERT_OK_AND_ASSIGN(auto again, engine.Resolve(id, r));
  EXPECT_EQ(again.summary.state, "needs_attention");
  EXPECT_EQ(again.steps[1].state, "compensation_failed");
  EXPECT_EQ(Calls("car.return"), 0);
  ExpectParkedForGood(id, "missing_value", "rental_id");
}

// ---- tools that are not registered

TEST_F(WedgeTest, UnregisteredCompensationToolParksTheSaga) {
  std::string id = Submit(TripSpec());
  ToolRegistry without;  // a process started without the car's return tool
  Register(&without, /*with_car_return=*/false, /*with_pay=*/true);
  Engine engine(store_.get(), &without, Options());
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(TotalCalls(), 0) << "nothing runs on a plan this process cannot carry out";
  EXPECT_EQ(rec.steps[0].state, "needs_attention") << "the step it would have taken up";
  EXPECT_EQ(LastEntry(id, "needs_attention", "book").value("code", ""), "unknown_tool");
  ExpectParkedForGood(id, "unknown_tool", "\"car.return\"");

  // Retried in a process that has the tool again, the saga runs to its end.
  Engine full(store_.get(), &tools_, Options());
  Resolution r;
  r.step_id = "book";
  r.decision = Decision::kRetry;
  r.who = "ops";
  ASSERT_OK_AND_ASSIGN(auto done, full.Resolve(id, r));
  EXPECT_EQ(done.summary.state, "succeeded") << done.summary.reason;
  EXPECT_EQ(Calls("res.book"), 1);
}

TEST_F(WedgeTest, UnregisteredForwardToolParksARollingBackSaga) {
  // The car's outcome is lost: the saga parks; a person says the car was
  // never rented, in a process that lacks the payment tool.
  car_unknown_ = true;
  std::string id = Submit(TripSpec());
  {
    Engine engine(store_.get(), &tools_, Options());
    ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(id));
    ASSERT_EQ(rec.summary.state, "needs_attention");
  }
  ToolRegistry without;
  Register(&without, /*with_car_return=*/true, /*with_pay=*/false);
  Engine engine(store_.get(), &without, Options());
  Resolution r;
  r.step_id = "car";
  r.decision = Decision::kNotApplied;
  r.who = "ops";
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Resolve(id, r));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(Calls("res.cancel"), 0);
  ExpectParkedForGood(id, "unknown_tool", "\"pay.charge\"");
}

// ---- a frozen spec that no longer validates

TEST_F(WedgeTest, FrozenSpecThatNoLongerValidatesParks) {
  std::string id = Submit(TripSpec());
  // Edited in the file: still JSON, no longer a valid spec.
  ASSERT_EQ(EditFile(dir_.File("journal.db"),
                     R"(UPDATE sagas SET spec = '{"name": "trip", "steps": [{"id": "book", )"
                     R"("tool": 7}]}' WHERE saga_id = ')" +
                         id + "'"),
            1);
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto report, engine.Recover());
  ASSERT_EQ(report.sagas.size(), 1u);
  EXPECT_EQ(report.sagas[0].outcome, RecoveredSaga::Outcome::kParked);
  EXPECT_EQ(report.parked, 1);
  EXPECT_EQ(report.resumed, 1) << "it moved: to needs_attention";
  EXPECT_TRUE(report.errors.empty());
  EXPECT_NE(report.sagas[0].reason.find("invalid_spec: the frozen spec no longer validates"),
            std::string::npos)
      << report.sagas[0].reason;
  EXPECT_EQ(TotalCalls(), 0);
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(id));
  EXPECT_EQ(rec.steps[0].state, "needs_attention");
  EXPECT_EQ(rec.steps[0].error, rec.summary.reason);
  ExpectParkedForGood(id, "invalid_spec", "frozen spec");
}

// ---- a store that keeps refusing a write

TEST_F(WedgeTest, StoreThatKeepsRefusingAWriteParks) {
  EditFile(dir_.File("journal.db"),
           "CREATE TRIGGER no_effects BEFORE INSERT ON effects "
           "BEGIN SELECT RAISE(ABORT, 'effects are read-only today'); END");
  std::string id = Submit(TripSpec());
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto report, engine.Recover());
  ASSERT_EQ(report.sagas.size(), 1u);
  EXPECT_EQ(report.sagas[0].outcome, RecoveredSaga::Outcome::kParked) << report.sagas[0].reason;
  EXPECT_EQ(Calls("res.book"), 1);
  EXPECT_EQ(Calls("car.rent"), 0) << "nothing runs past a write the store refused";
  // The store turns the trigger's refusal into its own message.
  ExpectParkedForGood(id, "store_error", "the store refused the drive's write");
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(id));
  EXPECT_EQ(rec.steps[0].state, "submitted") << "what is durable: the refused batch is not";
}

// ---- resolve never leaves a template without a value

TEST_F(WedgeTest, ResolveRefusesAResultWithoutTheValuesTemplatesNeed) {
  car_unknown_ = true;
  std::string id = Submit(TripSpec({{"plate", "${steps.car.result.plate}"}}));
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK(engine.Run(id));
  const size_t entries = JournalSize(id);
  Resolution r;
  r.step_id = "car";
  r.decision = Decision::kApplied;
  r.who = "ops";
  // The compensation's value is there; the later step's is not.
  r.result = {{"rental_id", "R9"}};
  EXPECT_THAT(engine.Resolve(id, r),
              StatusIs(Code::kInvalidArgument,
                       "resolve car as applied: step pay references "
                       "${steps.car.result.plate}; pass --result with a JSON object that has "
                       "plate"));
  r.result = Json(5);
  EXPECT_THAT(engine.Resolve(id, r),
              StatusIs(Code::kInvalidArgument, "--result must be a JSON object"));
  EXPECT_EQ(JournalSize(id), entries) << "a refused decision writes nothing";
  ASSERT_OK_AND_ASSIGN(auto still, store_->LoadSaga(id));
  EXPECT_EQ(still.steps[1].state, "needs_attention");

  r.result = {{"rental_id", "R9"}, {"plate", "AB-12"}};
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Resolve(id, r));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[2].args, Json({{"plate", "AB-12"}}));
}

TEST_F(WedgeTest, ResolveChecksTheStepsOwnCompensation) {
  car_unknown_ = true;
  std::string id = Submit(TripSpec());
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK(engine.Run(id));
  Resolution r;
  r.step_id = "car";
  r.decision = Decision::kApplied;
  r.who = "ops";
  EXPECT_THAT(engine.Resolve(id, r),
              StatusIs(Code::kInvalidArgument,
                       "resolve car as applied: compensation of car references "
                       "${steps.car.result.rental_id}; pass --result with a JSON object that has "
                       "rental_id"));
}

// ---- the recovery report

TEST_F(WedgeTest, RecoveryReportSaysPerSagaWhatCameOfIt) {
  std::string fine = Submit(TripSpec());
  car_result_ = {{"car", "compact"}};
  std::string stuck = Submit(TripSpec({{"rental", "${steps.car.result.rental_id}"}}));
  Engine engine(store_.get(), &tools_, Options());
  ASSERT_OK_AND_ASSIGN(auto report, engine.Recover(1));
  ASSERT_EQ(report.sagas.size(), 2u);
  std::map<std::string, RecoveredSaga> by_id;
  for (const auto& s : report.sagas) by_id[s.saga_id] = s;
  // `fine` needs no value of the car's result; `stuck` does.
  int parked = 0;
  for (const auto& [sid, s] : by_id) {
    if (s.outcome == RecoveredSaga::Outcome::kParked) {
      ++parked;
      EXPECT_EQ(s.state, "needs_attention");
      EXPECT_NE(s.reason.find("missing_value"), std::string::npos) << s.reason;
    } else {
      EXPECT_EQ(s.outcome, RecoveredSaga::Outcome::kMoved) << RecoveryOutcomeName(s.outcome);
      EXPECT_EQ(s.state, "succeeded");
    }
  }
  EXPECT_EQ(parked, 1);
  EXPECT_EQ(report.parked, 1);
  EXPECT_EQ(report.resumed, 2);
  EXPECT_EQ(by_id[stuck].outcome, RecoveredSaga::Outcome::kParked);
  EXPECT_EQ(by_id[fine].outcome, RecoveredSaga::Outcome::kMoved);
}

}  // namespace
}  // namespace idem
