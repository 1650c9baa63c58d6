// Guards (saga/guard.h): a read before a step's write. The provider keeps
// its ledger in a file, so that a child process killed at a failpoint and
// the recovering parent see the same effects.

#include "saga/guard.h"

#include <csignal>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "common/failpoint.h"
#include <sys/wait.h>
#include <unistd.h>

namespace idem {
namespace {

// A flight provider with a durable ledger: `ledger` holds one line per
// booking ("<key> <order> <booking id>"), `calls` one line per call
// ("<tool> <key>"). Bookings dedupe on the key.
struct FileProvider {
  std::string ledger, calls;
  std::mutex mu;
  int guard_failures = 0;  // the next N guard reads fail (retryable)
  bool guard_unknown = false;

  std::vector<std::vector<std::string>> Lines(const std::string& path) {
    std::vector<std::vector<std::string>> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::vector<std::string> w;
      for (std::string x; words >> x;) w.push_back(x);
      if (!w.empty()) out.push_back(w);
    }
    return out;
  }
  void Append(const std::string& path, const std::string& line) {
    std::ofstream(path, std::ios::app) << line << "\n" << std::flush;
  }
  int Count(const std::string& tool) {
    int n = 0;
    for (auto& w : Lines(calls)) n += w[0] == tool;
    return n;
  }
  int Bookings() { return static_cast<int>(Lines(ledger).size()); }
};

void Register(FileProvider* p, ToolRegistry* tools) {
  ToolInfo book{"flights.book", EffectClass::kWrite, true, true, false};
  auto invoke = [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->Append(p->calls, "flights.book " + call.key);
    std::string order = call.args.value("order", "");
    for (auto& w : p->Lines(p->ledger)) {
      if (w[0] == call.key) {
        auto out = ToolOutcome::Succeeded({{"booking_id", w[2]}, {"order", w[1]}}, w[2]);
        out.replayed = true;
        return out;
      }
    }
    std::string id = "bk-" + std::to_string(p->Bookings() + 1);
    p->Append(p->ledger, call.key + " " + order + " " + id);
    return ToolOutcome::Succeeded({{"booking_id", id}, {"order", order}}, id);
  };
  auto lookup = [p](const std::string& key) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->Append(p->calls, "flights.book.status " + key);
    LookupOutcome o;
    o.kind = LookupKind::kNotApplied;
    for (auto& w : p->Lines(p->ledger)) {
      if (w[0] == key) {
        o.kind = LookupKind::kApplied;
        o.result = {{"booking_id", w[2]}, {"order", w[1]}};
        o.external_ref = w[2];
      }
    }
    return o;
  };
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(book, invoke, lookup)));

  ToolInfo find{"flights.find_booking", EffectClass::kRead, false, false, false};
  auto find_fn = [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->Append(p->calls, "flights.find_booking " + call.key);
    if (p->guard_unknown) return ToolOutcome::Unknown("timed out");
    if (p->guard_failures > 0) {
      --p->guard_failures;
      return ToolOutcome::Failed("503 busy", true);
    }
    std::string order = call.args.value("order", "");
    for (auto& w : p->Lines(p->ledger)) {
      if (w[1] == order) {
        return ToolOutcome::Succeeded(
            {{"found", true}, {"booking", {{"booking_id", w[2]}, {"order", w[1]}}}});
      }
    }
    return ToolOutcome::Succeeded({{"found", false}, {"booking", nullptr}});
  };
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(find, find_fn)));

  ToolInfo cancel{"flights.cancel", EffectClass::kIdempotent, true, false, false};
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(cancel, [p](const ToolCall& call) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->Append(p->calls, "flights.cancel " + call.key);
    return ToolOutcome::Succeeded(Json::object());
  })));
}

class GuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    provider_.ledger = dir_.File("ledger.txt");
    provider_.calls = dir_.File("calls.txt");
    Register(&provider_, &tools_);
    OpenStore();
  }
  void TearDown() override { failpoint::DisarmAll(); }

  void OpenStore() {
    store_.reset();
    ASSERT_OK_AND_ASSIGN(store_, storage::OpenStore(dir_.File("journal.db")));
  }

  Engine MakeEngine() {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = false;
    return Engine(store_.get(), &tools_, o);
  }

  // book (guarded by find_booking on the order) then a read.
  SagaSpec Spec(Json guard = Json()) {
    if (guard.is_null()) {
      guard = {{"tool", "flights.find_booking"},
               {"args", {{"order", "${input.order}"}}},
               {"exists_when", "/found"},
               {"result", "/booking"},
               {"retry", {{"max_attempts", 3}, {"initial_backoff_ms", 10}}}};
    }
    Json doc = {{"name", "guarded"},
                {"steps",
                 {{{"id", "book"},
                   {"tool", "flights.book"},
                   {"args", {{"order", "${input.order}"}}},
                   {"guard", guard},
                   {"compensate",
                    {{"tool", "flights.cancel"},
                     {"args", {{"booking_id", "${steps.book.result.booking_id}"}}}}}},
                  {{"id", "confirm"},
                   {"tool", "flights.find_booking"},
                   {"args", {{"order", "${steps.book.result.order}"}}}}}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return *spec;
  }

  // Drives saga `saga_id` in a child process on its own store, with
  // `failpoints` armed; true when the child died of SIGKILL.
  bool DriveInChildUntilKilled(const std::string& saga_id, const std::string& failpoints) {
    store_.reset();
    pid_t pid = fork();
    if (pid == 0) {
      if (!failpoint::Arm(failpoints).ok()) _exit(90);
      auto store = storage::OpenStore(dir_.File("journal.db"));
      if (!store.ok()) _exit(91);
      EngineOptions o;
      o.clock = &clock_;
      o.use_leases = false;
      Engine e(store->get(), &tools_, o);
      (void)e.Run(saga_id);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    OpenStore();
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }

  std::vector<storage::JournalEntry> Journal(const std::string& saga_id, const std::string& step,
                                             const std::string& event) {
    std::vector<storage::JournalEntry> out;
    auto j = store_->ReadJournal(saga_id);
    EXPECT_OK(j);
    for (auto& e : *j) {
      if (e.step_id == step && e.event == event) out.push_back(e);
    }
    return out;
  }

  test::TempDir dir_{"idem_guard"};
  FileProvider provider_;
  ToolRegistry tools_;
  ManualClock clock_;
  std::unique_ptr<storage::Store> store_;
};

TEST_F(GuardTest, AbsentMeansOneCallUnderTheNormalProtocol) {
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto sub, e.Submit(Spec(), {{"order", "o-42"}}, "intent-a"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.Count("flights.book"), 1);
  EXPECT_EQ(provider_.Bookings(), 1);
  auto checked = Journal(sub.saga_id, "book", "guard_checked");
  ASSERT_EQ(checked.size(), 1u);
  EXPECT_EQ(checked[0].data["answer"], "absent");
  EXPECT_EQ(checked[0].data["tool"], "flights.find_booking");
  // The guard's answer is journaled before the write's `submitted`.
  auto j = *store_->ReadJournal(sub.saga_id);
  int guard_at = -1, submitted_at = -1;
  for (size_t i = 0; i < j.size(); ++i) {
    if (j[i].step_id == "book" && j[i].event == "guard_checked") guard_at = static_cast<int>(i);
    if (j[i].step_id == "book" && j[i].event == "submitted") submitted_at = static_cast<int>(i);
  }
  EXPECT_GE(guard_at, 0);
  EXPECT_LT(guard_at, submitted_at);
}

TEST_F(GuardTest, ExistsMeansNoCallAndTheGuardsResult) {
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), {{"order", "o-42"}}, "intent-a"));
  ASSERT_OK_AND_ASSIGN(auto rec_a, e.Run(a.saga_id));
  ASSERT_EQ(rec_a.summary.state, "succeeded");
  // A second intent for the same order: its own saga, its own key.
  ASSERT_OK_AND_ASSIGN(auto b, e.Submit(Spec(), {{"order", "o-42"}}, "intent-b"));
  ASSERT_NE(a.saga_id, b.saga_id);
  ASSERT_OK_AND_ASSIGN(auto rec_b, e.Run(b.saga_id));
  EXPECT_EQ(rec_b.summary.state, "succeeded");
  EXPECT_EQ(provider_.Count("flights.book"), 1) << "the guarded saga made no call";
  EXPECT_EQ(provider_.Bookings(), 1) << "one effect across the two sagas";
  EXPECT_EQ(rec_b.steps[0].state, "succeeded");
  EXPECT_EQ(rec_b.steps[0].result, rec_a.steps[0].result);
  EXPECT_EQ(rec_b.steps[0].result["booking_id"], "bk-1");
  EXPECT_EQ(rec_b.steps[0].attempt, 0) << "never submitted";
  auto ok = Journal(b.saga_id, "book", "succeeded");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].data["satisfied_by"], "guard");
  EXPECT_EQ(ok[0].data["guard"]["answer"], "exists");
  EXPECT_EQ(ok[0].data["guard"]["tool"], "flights.find_booking");
  EXPECT_TRUE(Journal(b.saga_id, "book", "submitted").empty());
  // Later steps read the guard's result as the step's.
  EXPECT_EQ(rec_b.steps[1].args["order"], "o-42");
}

TEST_F(GuardTest, NoAnswerIsRetriedThenParksWithoutAWrite) {
  provider_.guard_failures = 100;
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto sub, e.Submit(Spec(), {{"order", "o-7"}}, "intent-a"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_NE(rec.summary.reason.find("guard_unanswered"), std::string::npos) << rec.summary.reason;
  EXPECT_EQ(rec.steps[0].state, "needs_attention");
  EXPECT_EQ(provider_.Count("flights.find_booking"), 3) << "the guard's retry policy";
  EXPECT_EQ(provider_.Count("flights.book"), 0) << "no blind write";
  EXPECT_EQ(provider_.Bookings(), 0);
  auto parked = Journal(sub.saga_id, "book", "needs_attention");
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].data["code"], "guard_unanswered");
}

TEST_F(GuardTest, AnUnknownReadIsNoAnswer) {
  provider_.guard_unknown = true;
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto sub, e.Submit(Spec(), {{"order", "o-7"}}, "intent-a"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "needs_attention");
  EXPECT_EQ(provider_.Count("flights.book"), 0);
}

TEST_F(GuardTest, ATransientFailureIsRetriedThenTheWriteRuns) {
  provider_.guard_failures = 2;
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto sub, e.Submit(Spec(), {{"order", "o-8"}}, "intent-a"));
  ASSERT_OK_AND_ASSIGN(auto rec, e.Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.Count("flights.find_booking"), 3 + 1);  // 3 for the guard, 1 for confirm
  EXPECT_EQ(provider_.Count("flights.book"), 1);
  EXPECT_EQ(Journal(sub.saga_id, "book", "guard_checked").at(0).data["attempts"], 3);
}

TEST_F(GuardTest, StatusLookupGuardAsksTheWriteToolUnderTheStepKey) {
  // A business key shared by two sagas: the second's own status lookup finds it.
  Json doc = {{"name", "guarded"},
              {"steps",
               {{{"id", "book"},
                 {"tool", "flights.book"},
                 {"key", "book:${input.order}"},
                 {"args", {{"order", "${input.order}"}}},
                 {"guard", {{"status_lookup", true}}},
                 {"compensate", nullptr},
                 {"reason", "test"}}}}};
  ASSERT_OK_AND_ASSIGN(auto spec, ParseSpec(doc, tools_));
  Engine e = MakeEngine();
  ASSERT_OK_AND_ASSIGN(auto a, e.Submit(spec, {{"order", "o-9"}}, "intent-a"));
  ASSERT_OK(e.Run(a.saga_id));
  ASSERT_OK_AND_ASSIGN(auto b, e.Submit(spec, {{"order", "o-9"}}, "intent-b"));
  ASSERT_OK_AND_ASSIGN(auto rec_b, e.Run(b.saga_id));
  EXPECT_EQ(rec_b.summary.state, "succeeded");
  EXPECT_EQ(provider_.Count("flights.book"), 1);
  EXPECT_EQ(provider_.Count("flights.book.status"), 2);
  EXPECT_EQ(rec_b.steps[0].external_ref, "bk-1");
  EXPECT_EQ(Journal(b.saga_id, "book", "succeeded").at(0).data["satisfied_by"], "guard");
}

TEST_F(GuardTest, CrashAfterAnAbsentAnswerReRunsTheGuardAndWritesOnce) {
  std::string saga_id;
  {
    Engine e = MakeEngine();
    ASSERT_OK_AND_ASSIGN(auto sub, e.Submit(Spec(), {{"order", "o-5"}}, "intent-a"));
    saga_id = sub.saga_id;
  }
  bool killed = DriveInChildUntilKilled(saga_id, "guard.after_answer=kill");
  ASSERT_TRUE(killed);
  EXPECT_EQ(provider_.Count("flights.find_booking"), 1);
  EXPECT_EQ(provider_.Count("flights.book"), 0);
  EXPECT_TRUE(Journal(saga_id, "book", "guard_checked").empty()) << "the answer was not journaled";
  Engine e = MakeEngine();
  ASSERT_OK(e.Recover());
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(provider_.Count("flights.find_booking"), 2 + 1) << "the guard ran again, then confirm";
  EXPECT_EQ(provider_.Count("flights.book"), 1);
  EXPECT_EQ(provider_.Bookings(), 1);
}

TEST_F(GuardTest, CrashAfterAnExistsAnswerReRunsTheGuardWithoutAWrite) {
  std::string saga_id;
  {
    Engine e = MakeEngine();
    ASSERT_OK_AND_ASSIGN(auto a, e.Submit(Spec(), {{"order", "o-6"}}, "intent-a"));
    ASSERT_OK(e.Run(a.saga_id));
    ASSERT_OK_AND_ASSIGN(auto b, e.Submit(Spec(), {{"order", "o-6"}}, "intent-b"));
    saga_id = b.saga_id;
  }
  const int reads_before = provider_.Count("flights.find_booking");
  ASSERT_TRUE(DriveInChildUntilKilled(saga_id, "guard.after_answer=kill"));
  ASSERT_OK_AND_ASSIGN(auto mid, store_->LoadSaga(saga_id));
  EXPECT_EQ(mid.steps[0].state, "planned");
  Engine e = MakeEngine();
  ASSERT_OK(e.Recover());
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(rec.steps[0].result["booking_id"], "bk-1");
  EXPECT_EQ(provider_.Count("flights.find_booking"), reads_before + 2 + 1);
  EXPECT_EQ(provider_.Count("flights.book"), 1) << "only the first saga's write";
  EXPECT_EQ(provider_.Bookings(), 1);
}

TEST(GuardSpecTest, TheGuardMustBeAReadWithAPointer) {
  ToolRegistry tools;
  FileProvider p;
  Register(&p, &tools);
  auto parse = [&](Json guard) {
    Json doc = {{"name", "g"},
                {"steps",
                 {{{"id", "book"},
                   {"tool", "flights.book"},
                   {"guard", guard},
                   {"compensate", nullptr},
                   {"reason", "test"}}}}};
    return ParseSpec(doc, tools);
  };
  EXPECT_OK(parse({{"tool", "flights.find_booking"}, {"exists_when", "/found"}}));
  EXPECT_THAT(parse({{"tool", "flights.cancel"}, {"exists_when", "/found"}}),
              test::StatusIs(Code::kInvalidArgument,
                             "steps[0].guard.tool: idempotent tool \"flights.cancel\" cannot be a "
                             "guard: a guard must be a read"));
  EXPECT_THAT(parse({{"tool", "flights.find_booking"}, {"exists_when", "found"}}),
              test::StatusIs(Code::kInvalidArgument, "steps[0].guard.exists_when: not a JSON"));
  EXPECT_THAT(parse({{"tool", "flights.find_booking"}}),
              test::StatusIs(Code::kInvalidArgument, "steps[0].guard.exists_when: required"));
  EXPECT_THAT(parse({{"status_lookup", true}, {"tool", "flights.find_booking"}}),
              test::StatusIs(Code::kInvalidArgument, "steps[0].guard: needs either"));
  EXPECT_THAT(
      parse({{"tool", "flights.find_booking"},
             {"exists_when", "/found"},
             {"args", {{"x", "${steps.book.result.id}"}}}}),
      test::StatusIs(Code::kInvalidArgument, "steps[0].guard.args.x: reference to step \"book\""));
  EXPECT_THAT(parse({{"tool", "flights.find_booking"},
                     {"exists_when", "/found"},
                     {"retry", {{"max_attempts", 11}}}}),
              test::StatusIs(Code::kInvalidArgument,
                             "steps[0].guard.retry.max_attempts: 11 exceeds the cap of 10"));
}

}  // namespace
}  // namespace idem
