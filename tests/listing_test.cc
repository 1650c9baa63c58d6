// Store::ListSagas's filters and Store::ReadGauges's counts, answered by the
// database (migration 14's indexes), on SQLite and on PostgreSQL: the owner
// filter, spec, key and time filters, paging with an offset, state counts
// with details only for the states asked for, the per-state counts the
// writes keep (migration 15) through every move. Correctness, not timing
// (docs/bench.md measures the cost at a million sagas).

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "storage/pg_store.h"
#include "storage/sqlite_store.h"
#include "storage/store.h"
#include "tests/test_util.h"

namespace idem::storage {
namespace {

// A saga of one step, created at `created_ms`, then moved to `state`.
void Add(Store& store, const std::string& id, const std::string& intent_key,
         const std::string& spec, int64_t created_ms, const std::string& state) {
  NewSaga s;
  s.saga_id = id;
  s.intent_key = intent_key;
  s.spec_name = spec;
  s.spec = Json{{"name", spec}};
  s.input = Json::object();
  s.fingerprint = Fingerprint(Json{{"id", id}});
  s.state = "pending";
  s.created_ms = created_ms;
  NewStep step;
  step.index = 0;
  step.step_id = "a";
  step.tool = "t";
  step.step_key = id + "/a";
  step.state = "planned";
  s.steps.push_back(step);
  ASSERT_OK(store.CreateIntent(s));
  if (state != "pending") {
    WriteBatch w;
    w.saga_id = id;
    w.saga_state = state;
    ASSERT_OK(store.Commit(w));
  }
}

std::vector<std::string> Ids(const Result<std::vector<SagaSummary>>& r) {
  std::vector<std::string> out;
  if (!r.ok()) return {"error: " + r.status().ToString()};
  for (const SagaSummary& s : *r) out.push_back(s.saga_id);
  return out;
}

template <typename Factory>
class ListingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = factory_.Open();
    ASSERT_OK(s);
    store_ = std::move(s).value();
    // alice: a1..a5 (a4 and a5 tie on time: the id breaks it); bob: b1, b2;
    // a key without an owner; an owner that is a prefix of another's.
    Add(*store_, "a1", "alice:trip-1", "travel", 100, "succeeded");
    Add(*store_, "a2", "alice:trip-2", "travel", 200, "failed");
    Add(*store_, "a3", "alice:pay-3", "payments", 300, "succeeded");
    Add(*store_, "a4", "alice:trip-4", "travel", 400, "running");
    Add(*store_, "a5", "alice:trip-5", "travel", 400, "succeeded");
    Add(*store_, "b1", "bob:trip-1", "travel", 150, "succeeded");
    Add(*store_, "b2", "bob:pay-2", "payments", 450, "needs_attention");
    Add(*store_, "n1", "no-owner-trip", "travel", 250, "succeeded");
    Add(*store_, "x1", "alicia:trip-9", "travel", 350, "running");
  }

  Result<std::vector<SagaSummary>> List(SagaFilter f) { return store_->ListSagas(f); }

  Factory factory_;
  std::unique_ptr<Store> store_;
};

using Factories = ::testing::Types<test::SqliteTestStore, test::PgTestStore>;
TYPED_TEST_SUITE(ListingTest, Factories);

TYPED_TEST(ListingTest, TheOwnerFilterMatchesTheKeysPrefixExactlyNewestFirst) {
  SagaFilter f;
  f.owner = "alice";
  EXPECT_EQ((std::vector<std::string>{"a4", "a5", "a3", "a2", "a1"}), Ids(this->List(f)));
  f.owner = "bob";
  EXPECT_EQ((std::vector<std::string>{"b2", "b1"}), Ids(this->List(f)));
  f.owner = "ali";  // a prefix of an owner is not that owner
  EXPECT_TRUE(Ids(this->List(f)).empty());
  f.owner = "";  // a key without ':' has no owner
  EXPECT_EQ((std::vector<std::string>{"n1"}), Ids(this->List(f)));
  f.owner = std::string("alice\0x", 7);  // a NUL byte matches nothing
  EXPECT_TRUE(Ids(this->List(f)).empty());
}

TYPED_TEST(ListingTest, FiltersCombineInTheQuery) {
  SagaFilter f;
  f.owner = "alice";
  f.states = {"succeeded"};
  EXPECT_EQ((std::vector<std::string>{"a5", "a3", "a1"}), Ids(this->List(f)));
  f.spec_name = "travel";
  EXPECT_EQ((std::vector<std::string>{"a5", "a1"}), Ids(this->List(f)));

  SagaFilter key;
  key.key_contains = "trip";  // the client's part of the key only
  EXPECT_EQ((std::vector<std::string>{"a4", "a5", "x1", "n1", "a2", "b1", "a1"}),
            Ids(this->List(key)));
  key.key_contains = "alice";  // the owner's part is not searched
  EXPECT_TRUE(Ids(this->List(key)).empty());

  SagaFilter time;
  time.created_from_ms = 200;  // both bounds inclusive
  time.created_to_ms = 350;
  EXPECT_EQ((std::vector<std::string>{"x1", "a3", "n1", "a2"}), Ids(this->List(time)));
  time.owner = "alice";
  time.states = {"failed", "succeeded"};
  EXPECT_EQ((std::vector<std::string>{"a3", "a2"}), Ids(this->List(time)));
}

TYPED_TEST(ListingTest, PagesWithAnOffsetCoverEveryMatchOnce) {
  SagaFilter f;
  f.owner = "alice";
  f.limit = 2;
  std::vector<std::string> seen;
  for (int page = 0; page < 4; ++page) {
    f.offset = page * 2;
    auto ids = Ids(this->List(f));
    EXPECT_LE(ids.size(), 2u);
    seen.insert(seen.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ((std::vector<std::string>{"a4", "a5", "a3", "a2", "a1"}), seen);

  SagaFilter all;
  all.offset = 8;  // the ninth and last saga
  EXPECT_EQ((std::vector<std::string>{"a1"}), Ids(this->List(all)));
  all.offset = 9;
  EXPECT_TRUE(Ids(this->List(all)).empty());
  all.offset = -1;
  EXPECT_EQ(Code::kInvalidArgument, this->List(all).status().code());
}

TYPED_TEST(ListingTest, GaugesCountEveryStateAndDetailOnlyTheStatesAskedFor) {
  GaugeQuery q;
  q.age_ms = 1;  // every saga here was created long ago
  q.detail_states = {"running", "needs_attention"};
  auto g = this->store_->ReadGauges(q);
  ASSERT_OK(g);
  std::map<std::string, int64_t> counts;
  for (const auto& [state, sg] : g->by_state) counts[state] = sg.sagas;
  const std::map<std::string, int64_t> want = {
      {"succeeded", 5}, {"failed", 1}, {"running", 2}, {"needs_attention", 1}};
  EXPECT_EQ(want, counts);
  EXPECT_EQ(2, g->by_state["running"].created_before);
  EXPECT_EQ(1, g->by_state["needs_attention"].created_before);
  EXPECT_GT(g->by_state["needs_attention"].oldest_updated_ms, 0);
  // A state not asked for has its count only.
  EXPECT_EQ(0, g->by_state["succeeded"].created_before);
  EXPECT_EQ(0, g->by_state["succeeded"].oldest_updated_ms);

  // No detail states: every state's details, as before.
  q.detail_states.clear();
  auto all = this->store_->ReadGauges(q);
  ASSERT_OK(all);
  EXPECT_EQ(5, all->by_state["succeeded"].sagas);
  EXPECT_EQ(5, all->by_state["succeeded"].created_before);
  EXPECT_EQ(2, all->by_state["running"].created_before);
}

// Sagas per state as ReadGauges answers `q`.
std::map<std::string, int64_t> Counts(Store& store, const GaugeQuery& q) {
  auto g = store.ReadGauges(q);
  EXPECT_OK(g);
  std::map<std::string, int64_t> out;
  if (!g.ok()) return out;
  for (const auto& [state, sg] : g->by_state) out[state] = sg.sagas;
  return out;
}

// With detail states asked for: the other states' counts are the ones the
// writes keep (migration 15).
std::map<std::string, int64_t> KeptCounts(Store& store) {
  GaugeQuery q;
  q.detail_states = {"running"};
  return Counts(store, q);
}

// No detail states: every state counted from the sagas' rows.
std::map<std::string, int64_t> RowCounts(Store& store) { return Counts(store, GaugeQuery{}); }

void Move(Store& store, const std::string& id, const std::string& state) {
  WriteBatch w;
  w.saga_id = id;
  w.saga_state = state;
  ASSERT_OK(store.Commit(w));
}

// A detail state with a quote, a backslash, a comma or braces is a name
// like any other (PostgreSQL gets it inside a text[] literal): it matches
// no saga and leaves the others' counts alone.
TYPED_TEST(ListingTest, ADetailStateWithQuotesAndBracesMatchesOnlyItself) {
  GaugeQuery q;
  q.detail_states = {"running", "a\"b\\c,{d}", "NULL"};
  auto g = this->store_->ReadGauges(q);
  ASSERT_OK(g);
  std::map<std::string, int64_t> counts;
  for (const auto& [state, sg] : g->by_state) counts[state] = sg.sagas;
  const std::map<std::string, int64_t> want = {
      {"succeeded", 5}, {"failed", 1}, {"running", 2}, {"needs_attention", 1}};
  EXPECT_EQ(want, counts);
  EXPECT_GT(g->by_state["running"].oldest_updated_ms, 0);
}

TYPED_TEST(ListingTest, TheKeptCountsFollowEveryMoveOfEveryState) {
  Store& store = *this->store_;
  const std::map<std::string, int64_t> before = {
      {"succeeded", 5}, {"failed", 1}, {"running", 2}, {"needs_attention", 1}};
  EXPECT_EQ(before, KeptCounts(store));
  // There and back again, a write that keeps the state, a state emptied.
  Move(store, "a4", "awaiting_approval");
  Move(store, "a4", "awaiting_approval");
  Move(store, "x1", "paused");
  Move(store, "b2", "running");
  EXPECT_EQ(RowCounts(store), KeptCounts(store));
  Move(store, "a4", "running");
  Move(store, "x1", "running");
  Move(store, "b2", "compensated");
  const std::map<std::string, int64_t> after = {
      {"succeeded", 5}, {"failed", 1}, {"running", 2}, {"compensated", 1}};
  EXPECT_EQ(after, KeptCounts(store));  // needs_attention emptied: no row
  EXPECT_EQ(after, RowCounts(store));
  Add(store, "c1", "carol:trip-1", "travel", 500, "succeeded");
  EXPECT_EQ(6, KeptCounts(store)["succeeded"]);
}

// Many writers moving sagas between two states in opposite directions at
// once: every write commits (no lock waits on a counter, no deadlock), and
// the counts are exact afterwards, read twice (PostgreSQL folds the moves
// into the counts on a read; the second read sums the folded counts).
TYPED_TEST(ListingTest, ConcurrentMovesKeepTheCountsExact) {
  Store& store = *this->store_;
  constexpr int kThreads = 6;
  constexpr int kSagasPerThread = 4;
  constexpr int kRounds = 25;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kSagasPerThread; ++i) {
      const std::string id = "m" + std::to_string(t) + "_" + std::to_string(i);
      Add(store, id, "mover:" + id, "travel", 600, t % 2 == 0 ? "running" : "awaiting_approval");
    }
  }
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const bool from_running = t % 2 == 0;
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kSagasPerThread; ++i) {
          WriteBatch w;
          w.saga_id = "m" + std::to_string(t) + "_" + std::to_string(i);
          w.saga_state = (r % 2 == 0) == from_running ? "awaiting_approval" : "running";
          if (!store.Commit(w).ok()) ++failures[t];
        }
        if (t == 0 && r % 5 == 0) (void)KeptCounts(store);  // reads (and folds) meanwhile
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(0, failures[t]) << "thread " << t;
  // An odd number of rounds: every saga ended in the other state.
  const std::map<std::string, int64_t> want = {{"succeeded", 5},
                                               {"failed", 1},
                                               {"running", 2 + 12},
                                               {"awaiting_approval", 12},
                                               {"needs_attention", 1}};
  EXPECT_EQ(want, RowCounts(store));
  EXPECT_EQ(want, KeptCounts(store));
  EXPECT_EQ(want, KeptCounts(store));
}

}  // namespace
}  // namespace idem::storage
