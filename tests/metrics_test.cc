// Metrics from every process that drives sagas (observability/metrics.h):
// counters move by exactly the number of events, on real runs of the engine
// on a SQLite file; gauges are the store's truth, the same for two engines
// on one store (SQLite and PostgreSQL); a scrape storm reads the store once
// per cache period; `idem worker --metrics-listen` answers /metrics over
// loopback after it drove sagas; nothing secret is in the exposition.

#include "observability/metrics.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <sqlite3.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"
#include "tools/tool.h"

#include "common/clock.h"
#include "common/json_util.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace idem {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBinary = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";
constexpr const char* kTripSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip.json";
constexpr const char* kTripInput = IDEM_SOURCE_DIR "/examples/travel_booking/input.json";

/// The value of the sample `series` (name and labels, as written) on the
/// page; -1 when the page has no such line.
double Sample(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return -1;
}

/// The gauge lines of a page that come from the store (the age of the
/// oldest parked saga aside: it grows between two reads).
std::string GaugeLines(const std::string& page) {
  std::istringstream in(page);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    for (const std::string g :
         {"idem_store_up", "idem_sagas", "idem_sagas_needing_attention", "idem_approvals_pending",
          "idem_leases_expired", "idem_sagas_past_reconciliation_window"}) {
      if (line.rfind(g + " ", 0) == 0 || line.rfind(g + "{", 0) == 0) {
        out += line + "\n";
        break;
      }
    }
  }
  return out;
}

/// Tools whose behaviour each test sets: `keyed` honours keys, `looked`
/// answers status lookups, `blind` has neither. Each Invoke pops the next
/// scripted outcome (default: succeeded).
class Scripted {
 public:
  std::vector<ToolOutcome> outcomes;
  LookupOutcome lookup;
  std::atomic<int> calls{0};

  ToolOutcome Next() {
    ++calls;
    if (outcomes.empty()) return ToolOutcome::Succeeded(Json{{"ok", true}}, "ref-1");
    ToolOutcome o = outcomes.front();
    outcomes.erase(outcomes.begin());
    return o;
  }
};

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, storage::OpenStore(dir_.File("journal.db")));
    Register("keyed.do", true, false);
    Register("looked.do", false, true);
    Register("blind.do", false, false);
  }

  void Register(const std::string& name, bool keys, bool status) {
    ToolInfo info;
    info.name = name;
    info.effect = EffectClass::kWrite;
    info.honours_keys = keys;
    Scripted* s = &scripts_[name];
    FunctionTool::LookupFn lookup;
    if (status) lookup = [s](const std::string&) { return s->lookup; };
    ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(
        info, [s](const ToolCall&) { return s->Next(); }, lookup)));
  }

  SagaSpec Spec(const std::string& tool) {
    Json doc = {{"name", "one"},
                {"steps",
                 {{{"id", "only"},
                   {"tool", tool},
                   {"args", Json::object()},
                   {"compensate", nullptr},
                   {"reason", "test"}}}}};
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return spec.ok() ? *spec : SagaSpec();
  }

  EngineOptions Options(observability::Metrics* metrics) {
    EngineOptions eo;
    eo.use_leases = false;
    eo.lookup_backoff = RetryPolicy{5, 1, 1};
    observability::ReportTo(metrics, store_.get(), &eo);
    return eo;
  }

  /// Submits and runs a one-step saga of `tool`; returns its final state.
  std::string RunOne(Engine* engine, const std::string& tool, const std::string& key) {
    auto sub = engine->Submit(Spec(tool), Json::object(), key);
    EXPECT_OK(sub);
    if (!sub.ok()) return "";
    auto rec = engine->Run(sub->saga_id);
    EXPECT_OK(rec);
    return rec.ok() ? rec->summary.state : "";
  }

  test::TempDir dir_{"idem_metrics"};
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  std::map<std::string, Scripted> scripts_;
};

// ---- counters

TEST_F(MetricsTest, ALostFirstCallCountsOneUnknownResolvedBySameKeyRetry) {
  observability::Metrics metrics;
  Engine engine(store_.get(), &tools_, Options(&metrics));
  const std::string before = metrics.Render(store_.get());
  EXPECT_EQ(0, Sample(before, "idem_unknown_resolved_total{how=\"same_key_retry\"}"));
  EXPECT_EQ(0, Sample(before, "idem_unknown_outcomes_total"));

  scripts_["keyed.do"].outcomes = {ToolOutcome::Unknown("connection reset after send")};
  EXPECT_EQ("succeeded", RunOne(&engine, "keyed.do", "lost-1"));
  EXPECT_EQ(2, scripts_["keyed.do"].calls.load());

  const std::string page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_unknown_outcomes_total")) << page;
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"same_key_retry\"}")) << page;
  EXPECT_EQ(0, Sample(page, "idem_unknown_resolved_total{how=\"status_lookup\"}"));
  EXPECT_EQ(1, Sample(page, "idem_steps_started_total"));
  EXPECT_EQ(1, Sample(page, "idem_step_outcomes_total{outcome=\"succeeded\"}"));
  EXPECT_EQ(1, Sample(page, "idem_step_outcomes_total{outcome=\"unknown\"}"));
  EXPECT_EQ(1, Sample(page, "idem_retries_total"));
  EXPECT_EQ(1, Sample(page, "idem_sagas_finished_total{outcome=\"succeeded\"}"));
  EXPECT_EQ(2, Sample(page, "idem_journal_entries_total{event=\"submitted\"}"));
  EXPECT_EQ(1, Sample(page, "idem_journal_entries_total{event=\"saga_created\"}"));
  EXPECT_EQ(1, Sample(page, "idem_saga_time_to_terminal_seconds_count"));
}

TEST_F(MetricsTest, StatusLookupsCountAppliedAndNotAppliedApart) {
  observability::Metrics metrics;
  Engine engine(store_.get(), &tools_, Options(&metrics));
  Scripted& looked = scripts_["looked.do"];

  // The lookup finds the key applied: no second call.
  looked.outcomes = {ToolOutcome::Unknown("timeout")};
  looked.lookup = LookupOutcome{LookupKind::kApplied, Json{{"ok", true}}, "ref-9", ""};
  EXPECT_EQ("succeeded", RunOne(&engine, "looked.do", "found"));
  EXPECT_EQ(1, looked.calls.load());
  std::string page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"status_lookup\"}")) << page;
  EXPECT_EQ(0, Sample(page, "idem_unknown_resolved_total{how=\"not_applied\"}"));

  // The lookup says not applied: resent under the same key.
  looked.outcomes = {ToolOutcome::Unknown("timeout")};
  looked.lookup = LookupOutcome{LookupKind::kNotApplied, Json(), "", ""};
  EXPECT_EQ("succeeded", RunOne(&engine, "looked.do", "not-found"));
  EXPECT_EQ(3, looked.calls.load());
  page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"status_lookup\"}")) << page;
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"not_applied\"}")) << page;
  EXPECT_EQ(0, Sample(page, "idem_unknown_resolved_total{how=\"same_key_retry\"}")) << page;
  EXPECT_EQ(2, Sample(page, "idem_unknown_outcomes_total"));
}

TEST_F(MetricsTest, AnOperatorsDecisionCountsInTheProcessThatMadeIt) {
  // One process parks the step (no keys, no status: a person must check)...
  observability::Metrics first;
  std::string saga_id;
  {
    Engine engine(store_.get(), &tools_, Options(&first));
    scripts_["blind.do"].outcomes = {ToolOutcome::Unknown("timeout")};
    auto sub = engine.Submit(Spec("blind.do"), Json::object(), "parked");
    ASSERT_OK(sub);
    saga_id = sub->saga_id;
    ASSERT_OK_AND_ASSIGN(auto rec, engine.Run(saga_id));
    EXPECT_EQ("needs_attention", rec.summary.state);
  }
  std::string page = first.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"needs_attention\"}")) << page;
  EXPECT_EQ(1, Sample(page, "idem_sagas_finished_total{outcome=\"needs_attention\"}")) << page;
  EXPECT_EQ(1, Sample(page, "idem_sagas_needing_attention"));

  // ...another (the CLI's `resolve`) settles it: counted there.
  observability::Metrics second;
  Engine engine(store_.get(), &tools_, Options(&second));
  Resolution r;
  r.step_id = "only";
  r.decision = Decision::kApplied;
  r.who = "ops";
  r.result = Json{{"ok", true}};
  ASSERT_OK_AND_ASSIGN(auto rec, engine.Resolve(saga_id, r));
  EXPECT_EQ("succeeded", rec.summary.state);
  page = second.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_unknown_resolved_total{how=\"operator\"}")) << page;
  EXPECT_EQ(0, Sample(page, "idem_sagas_needing_attention")) << "the gauge is the store's";
}

TEST_F(MetricsTest, ARepeatedSubmitCountsOneDuplicateAbsorbed) {
  observability::Metrics metrics;
  Engine engine(store_.get(), &tools_, Options(&metrics));
  const SagaSpec spec = Spec("keyed.do");
  ASSERT_OK_AND_ASSIGN(auto first, engine.Submit(spec, Json::object(), "intent-1"));
  EXPECT_TRUE(first.created);
  EXPECT_EQ(0, Sample(metrics.Render(store_.get()),
                      "idem_duplicates_absorbed_total{how=\"existing_intent\"}"));
  ASSERT_OK_AND_ASSIGN(auto again, engine.Submit(spec, Json::object(), "intent-1"));
  EXPECT_FALSE(again.created);
  EXPECT_EQ(first.saga_id, again.saga_id);
  std::string page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_duplicates_absorbed_total{how=\"existing_intent\"}")) << page;
  EXPECT_EQ(1, Sample(page, "idem_journal_entries_total{event=\"saga_created\"}"));
  ASSERT_OK(engine.Submit(spec, Json::object(), "intent-1"));
  ASSERT_OK(engine.Submit(spec, Json::object(), "intent-2"));  // a new intent
  page = metrics.Render(store_.get());
  EXPECT_EQ(2, Sample(page, "idem_duplicates_absorbed_total{how=\"existing_intent\"}")) << page;
}

// A drive whose lease another process takes while its tool call runs: the
// renewer's refused renewal is counted once as lost (the drive stops), and
// no renewal counts as an error.
TEST_F(MetricsTest, ALeaseTakenWhileTheToolRunsCountsOneLostRenewal) {
  std::atomic<bool> called{false};
  std::atomic<bool> release{false};
  ToolInfo info;
  info.name = "held.do";
  info.effect = EffectClass::kWrite;
  info.honours_keys = true;
  ASSERT_OK(tools_.Register(std::make_unique<FunctionTool>(info, [&](const ToolCall&) {
    called = true;
    for (int i = 0; i < 500 && !release; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ToolOutcome::Succeeded(Json{{"ok", true}}, "ref-held");
  })));
  observability::Metrics metrics;
  EngineOptions eo = Options(&metrics);
  eo.use_leases = true;
  eo.lease_ms = 150;  // renewed every 50 ms
  Engine engine(store_.get(), &tools_, eo);
  ASSERT_OK_AND_ASSIGN(auto sub, engine.Submit(Spec("held.do"), Json::object(), "intent-held"));
  std::thread drive([&] { (void)engine.Run(sub.saga_id); });
  for (int i = 0; i < 500 && !called; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(called);
  // Another process claims the saga: a new owner and epoch, as a claim
  // after expiry writes them.
  sqlite3* raw = nullptr;
  ASSERT_EQ(SQLITE_OK, sqlite3_open(dir_.File("journal.db").c_str(), &raw));
  sqlite3_busy_timeout(raw, 5000);
  const std::string steal =
      "UPDATE sagas SET lease_owner = 'thief', lease_epoch = lease_epoch + 1,"
      " lease_expires_ms = lease_expires_ms + 600000 WHERE saga_id = '" +
      sub.saga_id + "'";
  char* err = nullptr;
  EXPECT_EQ(SQLITE_OK, sqlite3_exec(raw, steal.c_str(), nullptr, nullptr, &err)) << err;
  sqlite3_free(err);
  sqlite3_close(raw);
  double lost = 0;
  for (int i = 0; i < 300 && lost < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lost = Sample(metrics.Render(store_.get()), "idem_lease_renewals_failed_total{why=\"lost\"}");
  }
  release = true;
  drive.join();
  std::string page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_lease_renewals_failed_total{why=\"lost\"}")) << page;
  EXPECT_EQ(0, Sample(page, "idem_lease_renewals_failed_total{why=\"error\"}")) << page;
  // The drive's outcome write was fenced: the saga is the thief's, not done.
  ASSERT_OK_AND_ASSIGN(auto rec, store_->LoadSaga(sub.saga_id));
  EXPECT_NE("succeeded", rec.summary.state);
}

TEST_F(MetricsTest, AProviderReplayIsJournaledAndCounted) {
  observability::Metrics metrics;
  Engine engine(store_.get(), &tools_, Options(&metrics));
  ToolOutcome replayed = ToolOutcome::Succeeded(Json{{"ok", true}}, "ref-1");
  replayed.replayed = true;
  scripts_["keyed.do"].outcomes = {replayed};
  auto sub = engine.Submit(Spec("keyed.do"), Json::object(), "replay");
  ASSERT_OK(sub);
  ASSERT_OK(engine.Run(sub->saga_id));
  EXPECT_EQ("succeeded", RunOne(&engine, "keyed.do", "fresh"));
  const std::string page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_duplicates_absorbed_total{how=\"provider_replay\"}")) << page;
  ASSERT_OK_AND_ASSIGN(auto journal, store_->ReadJournal(sub->saga_id));
  bool marked = false;
  for (const auto& e : journal) {
    if (e.event == "succeeded") marked = e.data.value("replayed", false);
  }
  EXPECT_TRUE(marked) << "the journal says the provider answered a replay";
}

// ---- gauges

TEST_F(MetricsTest, GaugesAreTheStoresTruthForTwoEnginesOnOneStore) {
  observability::MetricsOptions mo;
  mo.gauge_cache_ms = 0;
  observability::Metrics a(mo), b(mo);
  // A second store object on the same file: another process's view.
  ASSERT_OK_AND_ASSIGN(auto other, storage::OpenStore(dir_.File("journal.db")));
  Engine ea(store_.get(), &tools_, Options(&a));
  EngineOptions ob;
  ob.use_leases = false;
  observability::ReportTo(&b, other.get(), &ob);
  Engine eb(other.get(), &tools_, ob);

  EXPECT_EQ("succeeded", RunOne(&ea, "keyed.do", "a1"));
  scripts_["blind.do"].outcomes = {ToolOutcome::Unknown("timeout")};
  EXPECT_EQ("needs_attention", RunOne(&eb, "blind.do", "b1"));
  ASSERT_OK(eb.Submit(Spec("keyed.do"), Json::object(), "b2"));  // pending

  const std::string pa = a.Render(store_.get());
  const std::string pb = b.Render(other.get());
  EXPECT_EQ(GaugeLines(pa), GaugeLines(pb));
  EXPECT_NEAR(Sample(pa, "idem_oldest_needs_attention_seconds"),
              Sample(pb, "idem_oldest_needs_attention_seconds"), 5.0);
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"succeeded\"}")) << pa;
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"needs_attention\"}"));
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"pending\"}"));
  EXPECT_EQ(0, Sample(pa, "idem_sagas{state=\"compensating\"}"));
  EXPECT_EQ(1, Sample(pa, "idem_sagas_needing_attention"));
  EXPECT_GE(Sample(pa, "idem_oldest_needs_attention_seconds"), 0);
  EXPECT_EQ(0, Sample(pa, "idem_approvals_pending"));
  EXPECT_EQ(0, Sample(pa, "idem_leases_expired"));
  EXPECT_EQ(0, Sample(pa, "idem_sagas_past_reconciliation_window"));
  // The counters stay each process's own.
  EXPECT_EQ(1, Sample(pa, "idem_sagas_finished_total{outcome=\"succeeded\"}"));
  EXPECT_EQ(0, Sample(pb, "idem_sagas_finished_total{outcome=\"succeeded\"}"));
  EXPECT_EQ(1, Sample(pb, "idem_sagas_finished_total{outcome=\"needs_attention\"}"));

  // The gauges agree with what the store lists.
  storage::SagaFilter all;
  ASSERT_OK_AND_ASSIGN(auto list, store_->ListSagas(all));
  EXPECT_EQ(list.size(), 3u);
}

TEST_F(MetricsTest, AScrapeStormReadsTheStoreOncePerCachePeriod) {
  ManualClock clock;
  observability::MetricsOptions mo;
  mo.clock = &clock;
  mo.gauge_cache_ms = 1'000;
  observability::Metrics metrics(mo);
  Engine engine(store_.get(), &tools_, Options(&metrics));
  std::string page;
  for (int i = 0; i < 50; ++i) page = metrics.Render(store_.get());
  EXPECT_EQ(1, Sample(page, "idem_metrics_store_reads_total")) << page;
  EXPECT_EQ(0, Sample(page, "idem_sagas{state=\"succeeded\"}"));
  EXPECT_EQ("succeeded", RunOne(&engine, "keyed.do", "k"));
  page = metrics.Render(store_.get());
  EXPECT_EQ(0, Sample(page, "idem_sagas{state=\"succeeded\"}")) << "cached";
  EXPECT_EQ(1, Sample(page, "idem_sagas_finished_total{outcome=\"succeeded\"}"))
      << "counters are never cached";
  clock.AdvanceMs(1'000);
  page = metrics.Render(store_.get());
  EXPECT_EQ(2, Sample(page, "idem_metrics_store_reads_total"));
  EXPECT_EQ(1, Sample(page, "idem_sagas{state=\"succeeded\"}"));
}

TEST_F(MetricsTest, SagasPastTheirWindowAndParkedAgeComeFromTheStore) {
  ManualClock clock(1'000'000);
  observability::MetricsOptions mo;
  mo.gauge_cache_ms = 0;
  mo.reconciliation_window_ms = 60'000;
  observability::Metrics metrics(mo);
  // The engine's clock stamps the sagas long before the store's clock (now).
  EngineOptions eo = Options(&metrics);
  eo.clock = &clock;
  Engine engine(store_.get(), &tools_, eo);
  scripts_["blind.do"].outcomes = {ToolOutcome::Unknown("timeout")};
  EXPECT_EQ("needs_attention", RunOne(&engine, "blind.do", "old-parked"));
  EXPECT_EQ("succeeded", RunOne(&engine, "keyed.do", "old-done"));
  ASSERT_OK(engine.Submit(Spec("keyed.do"), Json::object(), "old-pending"));
  const std::string page = metrics.Render(store_.get());
  EXPECT_EQ(2, Sample(page, "idem_sagas_past_reconciliation_window")) << page;
  const double age = Sample(page, "idem_oldest_needs_attention_seconds");
  const double want = static_cast<double>(SystemClock::Get()->NowMs() - clock.NowMs()) / 1000.0;
  EXPECT_NEAR(want, age, 60.0) << page;
}

TEST_F(MetricsTest, PostgresGaugesAgreeAcrossTwoEngines) {
  test::PgTestStore pg;
  auto s1 = pg.Open();
  ASSERT_OK(s1) << "needs the ctest fixture `postgres`";
  auto s2 = pg.Open();
  ASSERT_OK(s2);
  std::unique_ptr<storage::Store> one = std::move(s1).value(), two = std::move(s2).value();
  observability::MetricsOptions mo;
  mo.gauge_cache_ms = 0;
  observability::Metrics a(mo), b(mo);
  EngineOptions oa, ob;
  oa.owner = "engine-a";
  ob.owner = "engine-b";
  oa.lease_ms = ob.lease_ms = 1'000;
  observability::ReportTo(&a, one.get(), &oa);
  observability::ReportTo(&b, two.get(), &ob);
  Engine ea(one.get(), &tools_, oa);
  Engine eb(two.get(), &tools_, ob);
  EXPECT_EQ("succeeded", RunOne(&ea, "keyed.do", "p1"));
  scripts_["blind.do"].outcomes = {ToolOutcome::Unknown("timeout")};
  EXPECT_EQ("needs_attention", RunOne(&eb, "blind.do", "p2"));
  ASSERT_OK_AND_ASSIGN(auto pending, eb.Submit(Spec("keyed.do"), Json::object(), "p3"));
  // A driver that died holding a lease: claimed, never given back.
  ASSERT_OK(two->ClaimSaga(pending.saga_id, "dead-worker", 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));

  const std::string pa = a.Render(one.get());
  const std::string pb = b.Render(two.get());
  EXPECT_EQ(GaugeLines(pa), GaugeLines(pb));
  EXPECT_NEAR(Sample(pa, "idem_oldest_needs_attention_seconds"),
              Sample(pb, "idem_oldest_needs_attention_seconds"), 5.0);
  EXPECT_EQ(1, Sample(pa, "idem_store_up")) << pa;
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"succeeded\"}")) << pa;
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"needs_attention\"}"));
  EXPECT_EQ(1, Sample(pa, "idem_sagas{state=\"pending\"}"));
  EXPECT_EQ(1, Sample(pa, "idem_leases_expired")) << pa;
  EXPECT_EQ(1, Sample(pb, "idem_sagas_finished_total{outcome=\"needs_attention\"}"));
  EXPECT_EQ(0, Sample(pa, "idem_sagas_finished_total{outcome=\"needs_attention\"}"));
}

// ---- `idem worker --metrics-listen`: a real process, a real GET

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Proc {
  pid_t pid = -1;
  fs::path out, err;
  int code = -1;
  void Wait() {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string Describe() const {
    return "exit " + std::to_string(code) + "\n--- stdout\n" + Slurp(out) + "--- stderr\n" +
           Slurp(err);
  }
};

Proc Start(const test::TempDir& dir, const std::string& name,
           const std::vector<std::string>& args) {
  Proc p;
  p.out = dir.File(name + ".out");
  p.err = dir.File(name + ".err");
  p.pid = test::SpawnProcess(kBinary, args, p.out.string(), p.err.string());
  return p;
}

Proc RunProc(const test::TempDir& dir, const std::string& name,
             const std::vector<std::string>& args) {
  Proc p = Start(dir, name, args);
  p.Wait();
  return p;
}

/// Waits until the process's stdout holds `text` (10 s at most).
bool WaitFor(const Proc& p, const std::string& text, std::string* out) {
  for (int i = 0; i < 500; ++i) {
    *out = Slurp(p.out);
    if (out->find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(WorkerMetricsTest, AWorkerServesItsCountersAndTheStoresGaugesOnLoopback) {
  test::TempDir dir("idem_worker_metrics");
  const std::string db = dir.File("trip.db");
  const std::string input = std::string("@") + kTripInput;
  for (const char* key : {"trip-1", "trip-2", "trip-1"}) {
    Proc submit = RunProc(dir, std::string("submit-") + key,
                          {"submit", kTripSpec, "--input", input, "--intent-key", key, "--db", db});
    ASSERT_EQ(0, submit.code) << submit.Describe();
  }
  Proc worker = Start(dir, "worker",
                      {"worker", "--db", db, "--poll-ms", "20", "--metrics-listen", "127.0.0.1:0"});
  std::string out;
  ASSERT_TRUE(WaitFor(worker, "metrics on http://127.0.0.1:", &out)) << worker.Describe();
  const int port = std::atoi(out.c_str() + out.find("127.0.0.1:") + 10);
  ASSERT_GT(port, 0) << out;
  // Both trips run to the payment's human approval.
  for (int i = 0; i < 500; ++i) {
    out = Slurp(worker.out);
    size_t n = 0;
    for (size_t at = out.find(": awaiting_approval"); at != std::string::npos;
         at = out.find(": awaiting_approval", at + 1)) {
      ++n;
    }
    if (n >= 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health) << "no answer on /healthz";
  EXPECT_EQ(200, health->status);
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res) << "no answer on /metrics";
  EXPECT_EQ(200, res->status);
  EXPECT_NE(std::string::npos, res->get_header_value("Content-Type").find("text/plain"));
  const std::string& page = res->body;
  EXPECT_EQ(1, Sample(page, "idem_store_up")) << page;
  EXPECT_EQ(2, Sample(page, "idem_sagas{state=\"awaiting_approval\"}")) << out << page;
  EXPECT_EQ(2, Sample(page, "idem_approvals_pending")) << page;
  // The trip books a flight, a hotel and a car before the payment: each
  // trip's steps started in this worker, none failed.
  EXPECT_GE(Sample(page, "idem_steps_started_total"), 6) << page;
  EXPECT_EQ(0, Sample(page, "idem_step_outcomes_total{outcome=\"failed\"}"));
  EXPECT_GE(Sample(page, "idem_journal_entries_total{event=\"previewed\"}"), 2) << page;
  EXPECT_EQ(404, client.Get("/v1/sagas")->status);
  EXPECT_EQ(405, client.Post("/metrics", "", "text/plain")->status);

  // Nothing secret or per-saga: no commit token, no saga id, no key.
  EXPECT_EQ(std::string::npos, page.find("idem1.")) << page;
  EXPECT_EQ(std::string::npos, page.find("sg_")) << page;
  EXPECT_EQ(std::string::npos, page.find("trip-1"));

  ::kill(worker.pid, SIGTERM);
  worker.Wait();
  EXPECT_EQ(0, worker.code) << worker.Describe();
}

TEST(WorkerMetricsTest, ABadMetricsAddressIsAUsageErrorNamingTheFlag) {
  test::TempDir dir("idem_worker_metrics");
  Proc worker = RunProc(
      dir, "worker", {"worker", "--db", dir.File("x.db"), "--metrics-listen", "127.0.0.1:99999"});
  EXPECT_NE(0, worker.code);
  EXPECT_NE(std::string::npos, Slurp(worker.err).find("--metrics-listen")) << worker.Describe();
}

}  // namespace
}  // namespace idem
