#pragma once
// The Store conformance suite: typed tests written against storage::Store
// only, run on every backend (the googletest sample6 pattern).
//
// To run it on a backend, write a Factory and instantiate the suite in one
// .cc file of a test binary (include this header in exactly one .cc per
// binary: it defines the test bodies):
//
//   struct PostgresFactory {
//     PostgresFactory();   // prepares a fresh, empty database for one test
//     ~PostgresFactory();  // and removes it
//     // A new Store on that database. Called once per test, and again after
//     // the previous Store was destroyed to check what survives a reopen.
//     idem::Result<std::unique_ptr<idem::storage::Store>> Open();
//   };
//   using Backends = ::testing::Types<PostgresFactory>;
//   INSTANTIATE_TYPED_TEST_SUITE_P(Postgres, StoreConformanceTest, Backends);

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "storage/control_store.h"
#include "storage/prune.h"
#include "storage/server_state.h"
#include "storage/store.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "common/json_util.h"
#include "common/status.h"

// The suite's assertions are the shared ones (tests/test_util.h).
#define STORE_ASSERT_OK(expr) ASSERT_OK(expr)
#define STORE_EXPECT_OK(expr) EXPECT_OK(expr)

namespace idem::storage::conformance {

/// A saga with `steps` planned steps and one "saga_created" journal entry.
/// Step keys are derived from the saga id, so they are unique per saga.
inline NewSaga MakeSaga(const std::string& saga_id, const std::string& intent_key, int steps = 2,
                        int64_t created_ms = 1000) {
  NewSaga s;
  s.saga_id = saga_id;
  s.intent_key = intent_key;
  s.spec_name = "travel";
  s.spec = Json{{"name", "travel"}, {"steps", Json::array({"flight", "hotel"})}};
  s.input = Json{{"city", "Lisbon"}, {"nights", 3}};
  s.fingerprint = Fingerprint(Json{{"spec", s.spec}, {"input", s.input}});
  s.state = "pending";
  s.created_ms = created_ms;
  for (int i = 0; i < steps; ++i) {
    NewStep step;
    step.index = i;
    step.step_id = "step" + std::to_string(i);
    step.tool = "tool" + std::to_string(i);
    step.step_key = saga_id + "/step" + std::to_string(i);
    step.state = "planned";
    s.steps.push_back(step);
  }
  JournalEntry created;
  created.saga_id = saga_id;
  created.event = "saga_created";
  created.data = Json{{"intent_key", intent_key}};
  created.at_ms = created_ms;
  s.journal.push_back(created);
  return s;
}

inline JournalEntry MakeEntry(const std::string& saga_id, const std::string& step_id,
                              const std::string& event, int64_t at_ms, Json data = Json()) {
  JournalEntry e;
  e.saga_id = saga_id;
  e.step_id = step_id;
  e.event = event;
  e.data = std::move(data);
  e.at_ms = at_ms;
  return e;
}

inline EffectRecord MakeEffect(const std::string& saga_id, const std::string& step_id,
                               const std::string& key, int64_t at_ms) {
  EffectRecord f;
  f.saga_id = saga_id;
  f.step_id = step_id;
  f.kind = "action";
  f.tool = "flights.book";
  f.idempotency_key = key;
  f.result = Json{{"booking", key}, {"price", 120.5}};
  f.external_ref = "ext-" + key;
  f.at_ms = at_ms;
  return f;
}

inline void ExpectStepEq(const StepRecord& want, const StepRecord& got) {
  SCOPED_TRACE("step index " + std::to_string(want.index));
  EXPECT_EQ(want.saga_id, got.saga_id);
  EXPECT_EQ(want.index, got.index);
  EXPECT_EQ(want.step_id, got.step_id);
  EXPECT_EQ(want.tool, got.tool);
  EXPECT_EQ(want.state, got.state);
  EXPECT_EQ(want.attempt, got.attempt);
  EXPECT_EQ(want.step_key, got.step_key);
  EXPECT_EQ(want.args, got.args);
  EXPECT_EQ(want.args_fingerprint, got.args_fingerprint);
  EXPECT_EQ(want.result, got.result);
  EXPECT_EQ(want.external_ref, got.external_ref);
  EXPECT_EQ(want.error, got.error);
  EXPECT_EQ(want.comp_attempt, got.comp_attempt);
  EXPECT_EQ(want.comp_result, got.comp_result);
  EXPECT_EQ(want.updated_ms, got.updated_ms);
  EXPECT_EQ(want.phase, got.phase);
}

inline void ExpectEffectEq(const EffectRecord& want, const EffectRecord& got) {
  SCOPED_TRACE("effect " + want.idempotency_key);
  EXPECT_EQ(want.saga_id, got.saga_id);
  EXPECT_EQ(want.step_id, got.step_id);
  EXPECT_EQ(want.kind, got.kind);
  EXPECT_EQ(want.tool, got.tool);
  EXPECT_EQ(want.idempotency_key, got.idempotency_key);
  EXPECT_EQ(want.result, got.result);
  EXPECT_EQ(want.external_ref, got.external_ref);
  EXPECT_EQ(want.at_ms, got.at_ms);
}

/// The fixture: a fresh database per test (owned by the Factory) and a Store
/// on it.
template <class Factory>
class StoreConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Reopen()); }

  void TearDown() override { store_.reset(); }

  /// Closes the store and opens a new one on the same database.
  void Reopen() {
    store_.reset();
    Result<std::unique_ptr<Store>> opened = factory_.Open();
    ASSERT_OK(opened);
    store_ = std::move(opened).value();
    ASSERT_NE(store_, nullptr);
  }

  Store& store() { return *store_; }

  /// The store's server state (storage/server_state.h); every backend has it.
  KeyRecordStore& keys() {
    EXPECT_NE(store_->KeyRecords(), nullptr);
    return *store_->KeyRecords();
  }
  SpecStore& specs() {
    EXPECT_NE(store_->Specs(), nullptr);
    return *store_->Specs();
  }

  size_t JournalSize(const std::string& saga_id) {
    Result<std::vector<JournalEntry>> j = store_->ReadJournal(saga_id);
    EXPECT_OK(j);
    return j.ok() ? j->size() : 0;
  }

  /// The first step of a freshly created saga, as LoadSaga returns it.
  StepRecord FirstStep(const std::string& saga_id) {
    Result<SagaRecord> rec = store_->LoadSaga(saga_id);
    EXPECT_OK(rec);
    if (!rec.ok() || rec->steps.empty()) return StepRecord();
    return rec->steps.front();
  }

  Factory factory_;
  std::unique_ptr<Store> store_;
};

TYPED_TEST_SUITE_P(StoreConformanceTest);

TYPED_TEST_P(StoreConformanceTest, CreateIntentCreatesSaga) {
  Result<CreateOutcome> out = this->store().CreateIntent(MakeSaga("saga-1", "intent-1"));
  STORE_ASSERT_OK(out);
  EXPECT_EQ("saga-1", out->saga_id);
  EXPECT_TRUE(out->created);
  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("pending", rec->summary.state);
  EXPECT_EQ(2u, rec->steps.size());
  EXPECT_EQ(1u, this->JournalSize("saga-1"));
}

TYPED_TEST_P(StoreConformanceTest, SameKeySameFingerprintReturnsExistingAndWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  // A retried submission: the engine made a new saga id, same intent and content.
  NewSaga again = MakeSaga("saga-2", "intent-1", 3, 5000);
  Result<CreateOutcome> out = this->store().CreateIntent(again);
  STORE_ASSERT_OK(out);
  EXPECT_EQ("saga-1", out->saga_id);
  EXPECT_FALSE(out->created);

  EXPECT_EQ(1u, this->JournalSize("saga-1"));
  EXPECT_EQ(Code::kNotFound, this->store().LoadSaga("saga-2").status().code());
  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ(2u, rec->steps.size());
  EXPECT_EQ(1000, rec->summary.created_ms);
  Result<std::vector<SagaSummary>> all = this->store().ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  EXPECT_EQ(1u, all->size());
}

TYPED_TEST_P(StoreConformanceTest, SameKeyOtherFingerprintConflictsAndWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  NewSaga other = MakeSaga("saga-2", "intent-1");
  other.input = Json{{"city", "Porto"}};
  other.fingerprint = Fingerprint(Json{{"spec", other.spec}, {"input", other.input}});
  Result<CreateOutcome> out = this->store().CreateIntent(other);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(Code::kConflict, out.status().code()) << out.status().ToString();
  EXPECT_NE(std::string::npos, out.status().message().find("intent-1")) << out.status().message();

  EXPECT_EQ(1u, this->JournalSize("saga-1"));
  EXPECT_EQ(Code::kNotFound, this->store().LoadSaga("saga-2").status().code());
  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ(Json({{"city", "Lisbon"}, {"nights", 3}}), rec->input);
}

TYPED_TEST_P(StoreConformanceTest, StepKeyInUseConflictsAndWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  NewSaga clash = MakeSaga("saga-2", "intent-2");
  clash.steps[1].step_key = "saga-1/step0";
  Result<CreateOutcome> out = this->store().CreateIntent(clash);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(Code::kConflict, out.status().code()) << out.status().ToString();
  EXPECT_EQ(Code::kNotFound, this->store().LoadSaga("saga-2").status().code());

  // The intent was not recorded either: a corrected submission goes through.
  clash.steps[1].step_key = "saga-2/step1";
  Result<CreateOutcome> retry = this->store().CreateIntent(clash);
  STORE_ASSERT_OK(retry);
  EXPECT_TRUE(retry->created);
  EXPECT_EQ(1u, this->JournalSize("saga-2"));
}

TYPED_TEST_P(StoreConformanceTest, LoadSagaRoundTripsEveryField) {
  NewSaga s = MakeSaga("saga-rt", "intent-rt", 0, 1234);
  // JSON of every kind, including what a naive encoder would mangle.
  s.spec = Json::parse(R"({"z": 1, "a": [1, 2.5, -3, true, null, "x"], "nested": {"k": {}},
                           "big": 9007199254740993, "neg": -9007199254740993,
                           "unicode": "Zürich ✈ 東京", "quote": "a\"b\\c\n\t", "empty": ""})");
  s.input = Json::array({Json::object(), Json::array(), 0, 0.1, "null"});
  s.fingerprint = Fingerprint(Json{{"spec", s.spec}, {"input", s.input}});
  s.spec_name = "round-trip";
  s.state = "running";
  // Planned out of order: LoadSaga returns them by index.
  for (int index : {2, 0, 3, 1}) {
    NewStep step;
    step.index = index;
    step.step_id = "s" + std::to_string(index);
    step.tool = "tool.t" + std::to_string(index);
    step.step_key = "saga-rt/s" + std::to_string(index);
    step.state = index == 0 ? "ready" : "planned";
    s.steps.push_back(step);
  }
  STORE_ASSERT_OK(this->store().CreateIntent(s));

  Result<SagaRecord> rec = this->store().LoadSaga("saga-rt");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("saga-rt", rec->summary.saga_id);
  EXPECT_EQ("intent-rt", rec->summary.intent_key);
  EXPECT_EQ("round-trip", rec->summary.spec_name);
  EXPECT_EQ("running", rec->summary.state);
  EXPECT_EQ("", rec->summary.reason);
  EXPECT_EQ(1234, rec->summary.created_ms);
  EXPECT_EQ(1234, rec->summary.updated_ms);
  EXPECT_EQ(s.fingerprint, rec->fingerprint);
  EXPECT_EQ(s.spec, rec->spec);
  EXPECT_EQ(CanonicalJson(s.spec), CanonicalJson(rec->spec));
  EXPECT_EQ(s.input, rec->input);
  EXPECT_EQ(CanonicalJson(s.input), CanonicalJson(rec->input));
  ASSERT_EQ(4u, rec->steps.size());
  for (int i = 0; i < 4; ++i) {
    StepRecord want;
    want.saga_id = "saga-rt";
    want.index = i;
    want.step_id = "s" + std::to_string(i);
    want.tool = "tool.t" + std::to_string(i);
    want.state = i == 0 ? "ready" : "planned";
    want.attempt = 0;
    want.step_key = "saga-rt/s" + std::to_string(i);
    want.updated_ms = 1234;
    ExpectStepEq(want, rec->steps[i]);
    EXPECT_TRUE(rec->steps[i].args.is_null());
    EXPECT_TRUE(rec->steps[i].result.is_null());
    EXPECT_TRUE(rec->steps[i].comp_result.is_null());
  }

  // Every StepRecord field, written back whole, comes back the same.
  StepRecord full = rec->steps[2];
  full.state = "compensated";
  full.attempt = 3;
  full.args = Json{{"from", "LIS"}, {"seats", Json::array({"1A", "1B"})}, {"price", 99.99}};
  full.args_fingerprint = Fingerprint(full.args);
  full.result = Json{{"pnr", "XY12"}, {"ok", true}};
  full.external_ref = "pnr:XY12";
  full.error = "timeout after 30s";
  full.comp_attempt = 2;
  full.comp_result = Json("cancelled");
  full.updated_ms = 4321;
  // And a JSON null stays null next to a JSON value that is not null.
  StepRecord nulls = rec->steps[3];
  nulls.args = Json::object();
  nulls.result = Json(false);
  nulls.comp_result = Json(0);
  WriteBatch batch;
  batch.saga_id = "saga-rt";
  batch.steps = {full, nulls};
  STORE_ASSERT_OK(this->store().Commit(batch));

  Result<SagaRecord> again = this->store().LoadSaga("saga-rt");
  STORE_ASSERT_OK(again);
  ASSERT_EQ(4u, again->steps.size());
  ExpectStepEq(rec->steps[0], again->steps[0]);
  ExpectStepEq(rec->steps[1], again->steps[1]);
  ExpectStepEq(full, again->steps[2]);
  ExpectStepEq(nulls, again->steps[3]);
  EXPECT_TRUE(again->steps[3].args.is_object());
  EXPECT_TRUE(again->steps[3].result.is_boolean());
  EXPECT_TRUE(again->steps[3].comp_result.is_number());
  // No saga_state in the batch: the saga keeps its state and timestamps.
  EXPECT_EQ("running", again->summary.state);
  EXPECT_EQ(1234, again->summary.updated_ms);
}

TYPED_TEST_P(StoreConformanceTest, MissingSagaIsNotFound) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  Result<SagaRecord> rec = this->store().LoadSaga("no-such-saga");
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(Code::kNotFound, rec.status().code());
  EXPECT_NE(std::string::npos, rec.status().message().find("no-such-saga"));
  EXPECT_EQ(Code::kNotFound, this->store().ReadJournal("no-such-saga").status().code());
  EXPECT_EQ(Code::kNotFound, this->store().ListEffects("no-such-saga").status().code());
}

TYPED_TEST_P(StoreConformanceTest, CommitWritesStateStepsJournalAndEffects) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  StepRecord step = this->FirstStep("saga-1");
  step.state = "succeeded";
  step.attempt = 1;
  step.args = Json{{"to", "LIS"}};
  step.result = Json{{"pnr", "AB1"}};
  step.external_ref = "AB1";
  step.updated_ms = 2500;

  WriteBatch batch;
  batch.saga_id = "saga-1";
  batch.saga_state = "running";
  batch.saga_reason = "first step done";
  batch.steps = {step};
  batch.journal = {MakeEntry("saga-1", "step0", "submitted", 2000),
                   MakeEntry("saga-1", "step0", "succeeded", 3000, Json{{"pnr", "AB1"}})};
  batch.effects = {MakeEffect("saga-1", "step0", "saga-1/step0", 2900)};
  STORE_ASSERT_OK(this->store().Commit(batch));

  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("running", rec->summary.state);
  EXPECT_EQ("first step done", rec->summary.reason);
  EXPECT_EQ(3000, rec->summary.updated_ms);  // the latest journal entry
  EXPECT_EQ(1000, rec->summary.created_ms);
  ASSERT_EQ(2u, rec->steps.size());
  ExpectStepEq(step, rec->steps[0]);
  EXPECT_EQ("planned", rec->steps[1].state);

  Result<std::vector<JournalEntry>> journal = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  ASSERT_EQ(3u, journal->size());
  EXPECT_EQ("saga_created", (*journal)[0].event);
  EXPECT_EQ("submitted", (*journal)[1].event);
  EXPECT_EQ("step0", (*journal)[1].step_id);
  EXPECT_TRUE((*journal)[1].data.is_null());
  EXPECT_EQ(2000, (*journal)[1].at_ms);
  EXPECT_EQ("succeeded", (*journal)[2].event);
  EXPECT_EQ(Json({{"pnr", "AB1"}}), (*journal)[2].data);
  EXPECT_EQ("saga-1", (*journal)[2].saga_id);

  Result<std::vector<EffectRecord>> effects = this->store().ListEffects("saga-1");
  STORE_ASSERT_OK(effects);
  ASSERT_EQ(1u, effects->size());
  ExpectEffectEq(batch.effects[0], (*effects)[0]);

  // The other saga is untouched.
  Result<SagaRecord> other = this->store().LoadSaga("saga-2");
  STORE_ASSERT_OK(other);
  EXPECT_EQ("pending", other->summary.state);
  EXPECT_EQ("planned", other->steps[0].state);
  EXPECT_EQ(1u, this->JournalSize("saga-2"));
  Result<std::vector<EffectRecord>> none = this->store().ListEffects("saga-2");
  STORE_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TYPED_TEST_P(StoreConformanceTest, CommitWithStateAndNoJournalStampsUpdatedTime) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  WriteBatch batch;
  batch.saga_id = "saga-1";
  batch.saga_state = "failed";
  batch.saga_reason = "operator cancelled";
  STORE_ASSERT_OK(this->store().Commit(batch));
  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("failed", rec->summary.state);
  EXPECT_EQ("operator cancelled", rec->summary.reason);
  EXPECT_GT(rec->summary.updated_ms, 1000);  // the current time
}

TYPED_TEST_P(StoreConformanceTest, CommitWithDuplicateEffectKeyWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  WriteBatch first;
  first.saga_id = "saga-1";
  first.journal = {MakeEntry("saga-1", "step0", "succeeded", 2000)};
  first.effects = {MakeEffect("saga-1", "step0", "key-A", 2000)};
  STORE_ASSERT_OK(this->store().Commit(first));

  Result<SagaRecord> before = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(before);
  const size_t journal_before = this->JournalSize("saga-1");

  auto expect_conflict_and_nothing_written = [&](const WriteBatch& batch, const char* what) {
    SCOPED_TRACE(what);
    Status s = this->store().Commit(batch);
    EXPECT_EQ(Code::kConflict, s.code()) << s.ToString();
    Result<SagaRecord> after = this->store().LoadSaga("saga-1");
    ASSERT_OK(after);
    EXPECT_EQ(before->summary.state, after->summary.state);
    EXPECT_EQ(before->summary.reason, after->summary.reason);
    EXPECT_EQ(before->summary.updated_ms, after->summary.updated_ms);
    ASSERT_EQ(before->steps.size(), after->steps.size());
    for (size_t i = 0; i < before->steps.size(); ++i) {
      ExpectStepEq(before->steps[i], after->steps[i]);
    }
    EXPECT_EQ(journal_before, this->JournalSize("saga-1"));
    Result<std::vector<EffectRecord>> effects = this->store().ListEffects("saga-1");
    ASSERT_OK(effects);
    ASSERT_EQ(1u, effects->size());
    EXPECT_EQ("key-A", (*effects)[0].idempotency_key);
    EXPECT_EQ(1u, this->JournalSize("saga-2"));
  };

  StepRecord step = before->steps[1];
  step.state = "succeeded";
  step.attempt = 7;
  step.result = Json{{"x", 1}};

  WriteBatch replay;
  replay.saga_id = "saga-1";
  replay.saga_state = "succeeded";
  replay.saga_reason = "should not stick";
  replay.steps = {step};
  replay.journal = {MakeEntry("saga-1", "step1", "succeeded", 9000)};
  replay.effects = {MakeEffect("saga-1", "step1", "key-B", 9000),
                    MakeEffect("saga-1", "step1", "key-A", 9000)};
  expect_conflict_and_nothing_written(replay, "key recorded by an earlier commit");

  WriteBatch twice = replay;
  twice.effects = {MakeEffect("saga-1", "step1", "key-C", 9000),
                   MakeEffect("saga-1", "step1", "key-C", 9000)};
  expect_conflict_and_nothing_written(twice, "key twice in one batch");

  // Effect keys are unique across sagas, not per saga.
  WriteBatch elsewhere;
  elsewhere.saga_id = "saga-2";
  elsewhere.saga_state = "running";
  elsewhere.journal = {MakeEntry("saga-2", "step0", "succeeded", 9000)};
  elsewhere.effects = {MakeEffect("saga-2", "step0", "key-A", 9000)};
  Status s = this->store().Commit(elsewhere);
  EXPECT_EQ(Code::kConflict, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("key-A")) << s.message();
  Result<SagaRecord> two = this->store().LoadSaga("saga-2");
  STORE_ASSERT_OK(two);
  EXPECT_EQ("pending", two->summary.state);
  EXPECT_EQ(1u, this->JournalSize("saga-2"));

  // The store is still usable after the rolled-back batches.
  replay.effects = {MakeEffect("saga-1", "step1", "key-B", 9000)};
  STORE_ASSERT_OK(this->store().Commit(replay));
  EXPECT_EQ(journal_before + 1, this->JournalSize("saga-1"));
}

TYPED_TEST_P(StoreConformanceTest, CommitToMissingSagaIsNotFound) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  WriteBatch batch;
  batch.saga_id = "ghost";
  batch.saga_state = "running";
  batch.journal = {MakeEntry("ghost", "", "started", 2000)};
  batch.effects = {MakeEffect("ghost", "step0", "ghost-key", 2000)};
  Status s = this->store().Commit(batch);
  EXPECT_EQ(Code::kNotFound, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("ghost")) << s.message();
  // The effect key was not taken by the failed batch.
  WriteBatch real;
  real.saga_id = "saga-1";
  real.effects = {MakeEffect("saga-1", "step0", "ghost-key", 2000)};
  STORE_EXPECT_OK(this->store().Commit(real));
}

TYPED_TEST_P(StoreConformanceTest, JournalSeqIncreasesInCommitOrder) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  // Interleaved commits to two sagas, with timestamps that do not follow
  // commit order: the journal is ordered by commit, not by at_ms.
  for (int i = 0; i < 10; ++i) {
    for (const char* saga : {"saga-1", "saga-2"}) {
      WriteBatch b;
      b.saga_id = saga;
      b.journal = {MakeEntry(saga, "", "e" + std::to_string(i) + "a", 5000 - i),
                   MakeEntry(saga, "step0", "e" + std::to_string(i) + "b", 100 + i)};
      STORE_ASSERT_OK(this->store().Commit(b));
    }
  }
  std::set<int64_t> all_seqs;
  for (const char* saga : {"saga-1", "saga-2"}) {
    Result<std::vector<JournalEntry>> j = this->store().ReadJournal(saga);
    STORE_ASSERT_OK(j);
    ASSERT_EQ(21u, j->size());
    EXPECT_EQ("saga_created", (*j)[0].event);
    for (size_t k = 0; k < j->size(); ++k) {
      all_seqs.insert((*j)[k].seq);
      EXPECT_EQ(saga, (*j)[k].saga_id);
      if (k == 0) continue;
      EXPECT_LT((*j)[k - 1].seq, (*j)[k].seq);
      int i = static_cast<int>((k - 1) / 2);
      EXPECT_EQ("e" + std::to_string(i) + ((k - 1) % 2 == 0 ? "a" : "b"), (*j)[k].event);
    }
    EXPECT_GT((*j)[0].seq, 0);
  }
  EXPECT_EQ(42u, all_seqs.size());  // unique across sagas
}

TYPED_TEST_P(StoreConformanceTest, ListSagasNewestFirstFilteredAndLimited) {
  // created_ms: a=100 b=300 c=200 d=300 (b and d tie: saga id breaks it).
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("a", "ia", 1, 100)));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("b", "ib", 1, 300)));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("c", "ic", 1, 200)));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("d", "id", 1, 300)));
  for (const auto& [id, state] : std::vector<std::pair<std::string, std::string>>{
           {"a", "failed"}, {"b", "running"}, {"c", "succeeded"}, {"d", "failed"}}) {
    WriteBatch w;
    w.saga_id = id;
    w.saga_state = state;
    w.saga_reason = state == "failed" ? "card declined" : "";
    STORE_ASSERT_OK(this->store().Commit(w));
  }
  auto ids = [](const std::vector<SagaSummary>& v) {
    std::vector<std::string> out;
    for (const SagaSummary& s : v) out.push_back(s.saga_id);
    return out;
  };

  Result<std::vector<SagaSummary>> all = this->store().ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  EXPECT_EQ((std::vector<std::string>{"b", "d", "c", "a"}), ids(*all));
  EXPECT_EQ("ib", (*all)[0].intent_key);
  EXPECT_EQ("travel", (*all)[0].spec_name);
  EXPECT_EQ("running", (*all)[0].state);
  EXPECT_EQ(300, (*all)[0].created_ms);
  EXPECT_EQ("card declined", (*all)[1].reason);

  SagaFilter failed;
  failed.states = {"failed"};
  Result<std::vector<SagaSummary>> f = this->store().ListSagas(failed);
  STORE_ASSERT_OK(f);
  EXPECT_EQ((std::vector<std::string>{"d", "a"}), ids(*f));

  SagaFilter two_states;
  two_states.states = {"succeeded", "running"};
  Result<std::vector<SagaSummary>> t = this->store().ListSagas(two_states);
  STORE_ASSERT_OK(t);
  EXPECT_EQ((std::vector<std::string>{"b", "c"}), ids(*t));

  SagaFilter limited;
  limited.limit = 3;
  Result<std::vector<SagaSummary>> l = this->store().ListSagas(limited);
  STORE_ASSERT_OK(l);
  EXPECT_EQ((std::vector<std::string>{"b", "d", "c"}), ids(*l));

  SagaFilter limited_failed;
  limited_failed.states = {"failed"};
  limited_failed.limit = 1;
  Result<std::vector<SagaSummary>> lf = this->store().ListSagas(limited_failed);
  STORE_ASSERT_OK(lf);
  EXPECT_EQ((std::vector<std::string>{"d"}), ids(*lf));

  SagaFilter zero;
  zero.limit = 0;
  EXPECT_EQ(Code::kInvalidArgument, this->store().ListSagas(zero).status().code());

  SagaFilter nothing;
  nothing.states = {"no-such-state"};
  Result<std::vector<SagaSummary>> n = this->store().ListSagas(nothing);
  STORE_ASSERT_OK(n);
  EXPECT_TRUE(n->empty());
}

TYPED_TEST_P(StoreConformanceTest, ListEffectsInCommitOrder) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  // Keys chosen so that neither key order nor at_ms order is commit order.
  std::vector<EffectRecord> want = {MakeEffect("saga-1", "step0", "zz", 300),
                                    MakeEffect("saga-1", "step1", "mm", 100)};
  want.push_back(MakeEffect("saga-1", "step1", "aa", 200));
  want.back().kind = "compensation";
  want.back().tool = "flights.cancel";
  want.back().result = Json();
  want.back().external_ref = "";

  WriteBatch b1;
  b1.saga_id = "saga-1";
  b1.effects = {want[0], want[1]};
  STORE_ASSERT_OK(this->store().Commit(b1));
  WriteBatch other;
  other.saga_id = "saga-2";
  other.effects = {MakeEffect("saga-2", "step0", "saga-2-effect", 150)};
  STORE_ASSERT_OK(this->store().Commit(other));
  WriteBatch b2;
  b2.saga_id = "saga-1";
  b2.effects = {want[2]};
  STORE_ASSERT_OK(this->store().Commit(b2));

  Result<std::vector<EffectRecord>> got = this->store().ListEffects("saga-1");
  STORE_ASSERT_OK(got);
  ASSERT_EQ(3u, got->size());
  for (size_t i = 0; i < want.size(); ++i) ExpectEffectEq(want[i], (*got)[i]);
  EXPECT_TRUE((*got)[2].result.is_null());

  Result<std::vector<EffectRecord>> two = this->store().ListEffects("saga-2");
  STORE_ASSERT_OK(two);
  ASSERT_EQ(1u, two->size());
  EXPECT_EQ("saga-2-effect", (*two)[0].idempotency_key);
}

TYPED_TEST_P(StoreConformanceTest, SchemaVersionSurvivesReopen) {
  const int version = this->store().SchemaVersion();
  EXPECT_GE(version, 1);
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  ASSERT_NO_FATAL_FAILURE(this->Reopen());
  EXPECT_EQ(version, this->store().SchemaVersion());
  STORE_EXPECT_OK(this->store().LoadSaga("saga-1"));
}

TYPED_TEST_P(StoreConformanceTest, DataSurvivesReopen) {
  NewSaga s = MakeSaga("saga-1", "intent-1", 3, 1000);
  STORE_ASSERT_OK(this->store().CreateIntent(s));
  StepRecord step = this->FirstStep("saga-1");
  step.state = "succeeded";
  step.attempt = 2;
  step.args = Json{{"a", 1}};
  step.result = Json{{"r", Json::array({1, 2})}};
  step.updated_ms = 1500;
  WriteBatch b;
  b.saga_id = "saga-1";
  b.saga_state = "running";
  b.saga_reason = "r";
  b.steps = {step};
  b.journal = {MakeEntry("saga-1", "step0", "succeeded", 1500, Json{{"ok", true}})};
  b.effects = {MakeEffect("saga-1", "step0", "k1", 1500)};
  STORE_ASSERT_OK(this->store().Commit(b));

  Result<SagaRecord> before = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(before);
  Result<std::vector<JournalEntry>> journal_before = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal_before);

  ASSERT_NO_FATAL_FAILURE(this->Reopen());

  Result<SagaRecord> after = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(after);
  EXPECT_EQ(before->summary.state, after->summary.state);
  EXPECT_EQ(before->summary.reason, after->summary.reason);
  EXPECT_EQ(before->summary.updated_ms, after->summary.updated_ms);
  EXPECT_EQ(before->spec, after->spec);
  EXPECT_EQ(before->input, after->input);
  ASSERT_EQ(3u, after->steps.size());
  for (size_t i = 0; i < 3; ++i) ExpectStepEq(before->steps[i], after->steps[i]);
  Result<std::vector<JournalEntry>> journal_after = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal_after);
  ASSERT_EQ(journal_before->size(), journal_after->size());
  for (size_t i = 0; i < journal_after->size(); ++i) {
    EXPECT_EQ((*journal_before)[i].seq, (*journal_after)[i].seq);
    EXPECT_EQ((*journal_before)[i].event, (*journal_after)[i].event);
    EXPECT_EQ((*journal_before)[i].data, (*journal_after)[i].data);
  }
  Result<std::vector<EffectRecord>> effects = this->store().ListEffects("saga-1");
  STORE_ASSERT_OK(effects);
  ASSERT_EQ(1u, effects->size());
  ExpectEffectEq(b.effects[0], (*effects)[0]);

  // The reopened store keeps its promises: idempotent intents, unique effects,
  // journal seqs that keep increasing.
  Result<CreateOutcome> again = this->store().CreateIntent(s);
  STORE_ASSERT_OK(again);
  EXPECT_FALSE(again->created);
  WriteBatch dup;
  dup.saga_id = "saga-1";
  dup.effects = {MakeEffect("saga-1", "step0", "k1", 1600)};
  EXPECT_EQ(Code::kConflict, this->store().Commit(dup).code());
  WriteBatch more;
  more.saga_id = "saga-1";
  more.journal = {MakeEntry("saga-1", "", "resumed", 1700)};
  STORE_ASSERT_OK(this->store().Commit(more));
  Result<std::vector<JournalEntry>> j = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(j);
  ASSERT_EQ(journal_before->size() + 1, j->size());
  EXPECT_LT(journal_before->back().seq, j->back().seq);
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentCommitsAllLand) {
  constexpr int kThreads = 8;
  constexpr int kCommits = 25;
  for (int t = 0; t < kThreads; ++t) {
    std::string id = "saga-" + std::to_string(t);
    STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga(id, "intent-" + std::to_string(t))));
  }
  Store* store = this->store_.get();
  std::atomic<int> failures{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([store, t, &failures, &errors] {
      const std::string id = "saga-" + std::to_string(t);
      for (int i = 1; i <= kCommits; ++i) {
        // Read-modify-write of the saga's own step row: a lost update would
        // show as an attempt count below kCommits.
        Result<SagaRecord> rec = store->LoadSaga(id);
        if (!rec.ok()) {
          errors[t] = rec.status().ToString();
          failures.fetch_add(1);
          return;
        }
        StepRecord step = rec->steps[0];
        step.attempt += 1;
        step.state = "running";
        step.updated_ms = 10'000 + i;
        WriteBatch b;
        b.saga_id = id;
        b.saga_state = i == kCommits ? "succeeded" : "running";
        b.steps = {step};
        b.journal = {MakeEntry(id, "step0", "attempt", 10'000 + i, Json{{"i", i}})};
        b.effects = {MakeEffect(id, "step0", id + "/effect" + std::to_string(i), 10'000 + i)};
        Status s = store->Commit(b);
        if (!s.ok()) {
          errors[t] = s.ToString();
          failures.fetch_add(1);
          return;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(0, failures.load()) << [&] {
    std::string all;
    for (const std::string& e : errors) all += e + "\n";
    return all;
  }();

  for (int t = 0; t < kThreads; ++t) {
    const std::string id = "saga-" + std::to_string(t);
    SCOPED_TRACE(id);
    Result<SagaRecord> rec = this->store().LoadSaga(id);
    STORE_ASSERT_OK(rec);
    EXPECT_EQ("succeeded", rec->summary.state);
    EXPECT_EQ(10'000 + kCommits, rec->summary.updated_ms);
    EXPECT_EQ(kCommits, rec->steps[0].attempt);
    EXPECT_EQ("planned", rec->steps[1].state);
    Result<std::vector<JournalEntry>> j = this->store().ReadJournal(id);
    STORE_ASSERT_OK(j);
    ASSERT_EQ(static_cast<size_t>(kCommits + 1), j->size());
    for (int i = 1; i <= kCommits; ++i) EXPECT_EQ(Json({{"i", i}}), (*j)[i].data);
    Result<std::vector<EffectRecord>> f = this->store().ListEffects(id);
    STORE_ASSERT_OK(f);
    ASSERT_EQ(static_cast<size_t>(kCommits), f->size());
    for (int i = 1; i <= kCommits; ++i) {
      EXPECT_EQ(id + "/effect" + std::to_string(i), (*f)[i - 1].idempotency_key);
    }
  }
  SagaFilter done;
  done.states = {"succeeded"};
  Result<std::vector<SagaSummary>> list = this->store().ListSagas(done);
  STORE_ASSERT_OK(list);
  EXPECT_EQ(static_cast<size_t>(kThreads), list->size());
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentCreatesOfOneIntentMakeOneSaga) {
  constexpr int kThreads = 8;
  Store* store = this->store_.get();
  std::vector<Result<CreateOutcome>> outcomes(kThreads, Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([store, t, &outcomes] {
      NewSaga s = MakeSaga("saga-" + std::to_string(t), "the-intent");
      // Step keys from a shared prefix: only one saga's steps may exist.
      for (NewStep& step : s.steps) step.step_key = "the-intent/" + step.step_id;
      outcomes[t] = store->CreateIntent(s);
    });
  }
  for (std::thread& th : threads) th.join();
  int created = 0;
  std::string winner;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(outcomes[t].ok()) << outcomes[t].status().ToString();
    if (outcomes[t]->created) {
      ++created;
      winner = outcomes[t]->saga_id;
    }
  }
  ASSERT_EQ(1, created);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(winner, outcomes[t]->saga_id);
  Result<std::vector<SagaSummary>> all = this->store().ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  ASSERT_EQ(1u, all->size());
  EXPECT_EQ(winner, (*all)[0].saga_id);
  EXPECT_EQ(1u, this->JournalSize(winner));
}

/// A batch that creates saga `saga_id` (WriteBatch::create) as a drive's
/// first write does: the saga running, step 0 submitted, `saga_started` and
/// `submitted` journaled; leased to `owner` when it is not empty.
inline WriteBatch CreatingBatch(const std::string& saga_id, const std::string& intent_key,
                                const std::string& owner = "") {
  WriteBatch b;
  b.saga_id = saga_id;
  b.create = MakeSaga(saga_id, intent_key);
  if (!owner.empty()) {
    b.create->lease_owner = owner;
    b.create->lease_ms = 60'000;
    b.fence_epoch = 1;
  }
  b.saga_state = "running";
  StepRecord st;
  st.saga_id = saga_id;
  st.index = 0;
  st.step_id = "step0";
  st.tool = "tool0";
  st.state = "submitted";
  st.attempt = 1;
  st.step_key = saga_id + "/step0";
  st.args = Json{{"city", "Lisbon"}};
  st.args_fingerprint = "sha256:args";
  st.updated_ms = 1500;
  b.steps.push_back(st);
  b.journal = {MakeEntry(saga_id, "", "saga_started", 1500),
               MakeEntry(saga_id, "step0", "submitted", 1500, Json{{"attempt", 1}})};
  return b;
}

TYPED_TEST_P(StoreConformanceTest, ABatchCreatesItsSagaWithItsFirstWriteInOneTransaction) {
  const WriteBatch b = CreatingBatch("saga-1", "intent-1", "w1");
  STORE_ASSERT_OK(this->store().Commit(b));
  Result<SagaRecord> rec = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("running", rec->summary.state);
  EXPECT_EQ("intent-1", rec->summary.intent_key);
  EXPECT_EQ(1000, rec->summary.created_ms);
  EXPECT_EQ(1500, rec->summary.updated_ms);
  EXPECT_EQ(b.create->input, rec->input);
  EXPECT_EQ(b.create->fingerprint, rec->fingerprint);
  ASSERT_EQ(2u, rec->steps.size());
  ExpectStepEq(b.steps[0], rec->steps[0]);  // the batch's row, not the planned one
  EXPECT_EQ("planned", rec->steps[1].state);
  EXPECT_EQ("saga-1/step1", rec->steps[1].step_key);
  Result<std::vector<JournalEntry>> j = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(j);
  std::vector<std::string> events;
  for (const JournalEntry& e : *j) events.push_back(e.step_id + ":" + e.event);
  EXPECT_EQ((std::vector<std::string>{":saga_created", ":saga_started", "step0:submitted"}),
            events);
  // The intent is what CreateIntent and FindIntent answer from now on.
  Result<std::optional<CreateOutcome>> found = this->store().FindIntent(*b.create);
  STORE_ASSERT_OK(found);
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ("saga-1", (*found)->saga_id);
  EXPECT_FALSE((*found)->created);
  Result<CreateOutcome> again = this->store().CreateIntent(MakeSaga("saga-2", "intent-1"));
  STORE_ASSERT_OK(again);
  EXPECT_EQ("saga-1", again->saga_id);
  EXPECT_FALSE(again->created);
  // Created leased to w1 at epoch 1: another claimer is refused, w1's
  // fenced writes land, and a claim after the release bumps the epoch.
  EXPECT_EQ(Code::kAborted, this->store().ClaimSaga("saga-1", "w2", 60'000).status().code());
  WriteBatch next;
  next.saga_id = "saga-1";
  next.fence_epoch = 1;
  next.release_lease = true;
  next.journal = {MakeEntry("saga-1", "step0", "succeeded", 1600)};
  STORE_ASSERT_OK(this->store().Commit(next));
  Result<Lease> theirs = this->store().ClaimSaga("saga-1", "w2", 60'000);
  STORE_ASSERT_OK(theirs);
  EXPECT_EQ(2, theirs->epoch);
}

TYPED_TEST_P(StoreConformanceTest, ABatchThatCreatesASubmittedIntentKeyWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  // The same key, whatever the content: refused whole, nothing of saga-2.
  for (bool other_content : {false, true}) {
    SCOPED_TRACE(other_content ? "other content" : "same content");
    WriteBatch b = CreatingBatch("saga-2", "intent-1", "w1");
    if (other_content) b.create->fingerprint = "sha256:other";
    b.effects = {MakeEffect("saga-2", "step0", "saga-2/step0", 1500)};
    EXPECT_EQ(Code::kConflict, this->store().Commit(b).code());
    EXPECT_EQ(Code::kNotFound, this->store().LoadSaga("saga-2").status().code());
    EXPECT_EQ(Code::kNotFound, this->store().ReadJournal("saga-2").status().code());
    EXPECT_EQ(Code::kNotFound, this->store().ListEffects("saga-2").status().code());
  }
  Result<std::vector<SagaSummary>> all = this->store().ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  ASSERT_EQ(1u, all->size());
  EXPECT_EQ("saga-1", (*all)[0].saga_id);
  Result<SagaRecord> first = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(first);
  EXPECT_EQ("pending", first->summary.state);
  // FindIntent answers like CreateIntent, by a read.
  Result<std::optional<CreateOutcome>> same = this->store().FindIntent(MakeSaga("x", "intent-1"));
  STORE_ASSERT_OK(same);
  ASSERT_TRUE(same->has_value());
  EXPECT_EQ("saga-1", (*same)->saga_id);
  NewSaga other = MakeSaga("x", "intent-1");
  other.fingerprint = "sha256:other";
  EXPECT_EQ(Code::kConflict, this->store().FindIntent(other).status().code());
  Result<std::optional<CreateOutcome>> none = this->store().FindIntent(MakeSaga("y", "new-key"));
  STORE_ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
}

TYPED_TEST_P(StoreConformanceTest, ABatchThatCreatesItsSagaIsCheckedBeforeAnythingIsWritten) {
  // Its create names another saga.
  WriteBatch other = CreatingBatch("saga-1", "intent-1");
  other.create->saga_id = "saga-9";
  EXPECT_EQ(Code::kInvalidArgument, this->store().Commit(other).code());
  // Leased, it is fenced on epoch 1 (the create's); unleased, on none.
  WriteBatch unfenced = CreatingBatch("saga-1", "intent-1", "w1");
  unfenced.fence_epoch = 0;
  EXPECT_EQ(Code::kInvalidArgument, this->store().Commit(unfenced).code());
  WriteBatch fenced = CreatingBatch("saga-1", "intent-1");
  fenced.fence_epoch = 1;
  EXPECT_EQ(Code::kInvalidArgument, this->store().Commit(fenced).code());
  WriteBatch no_ms = CreatingBatch("saga-1", "intent-1", "w1");
  no_ms.create->lease_ms = 0;
  EXPECT_EQ(Code::kInvalidArgument, this->store().Commit(no_ms).code());
  // CreateIntent records no lease.
  NewSaga leased = MakeSaga("saga-1", "intent-1");
  leased.lease_owner = "w1";
  leased.lease_ms = 1000;
  EXPECT_EQ(Code::kInvalidArgument, this->store().CreateIntent(leased).status().code());
  EXPECT_EQ(Code::kNotFound, this->store().LoadSaga("saga-1").status().code());
  // Unleased, and in a group of concurrent batches, it lands like any.
  std::vector<std::thread> threads;
  std::vector<Status> got(6);
  Store* store = this->store_.get();
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([store, t, &got] {
      got[t] = store->Commit(CreatingBatch("s" + std::to_string(t), "k" + std::to_string(t % 3)));
    });
  }
  for (std::thread& th : threads) th.join();
  int landed = 0;
  for (const Status& st : got) {
    if (st.ok()) {
      ++landed;
    } else {
      EXPECT_EQ(Code::kConflict, st.code()) << st.ToString();
    }
  }
  EXPECT_EQ(3, landed);  // one per intent key
  Result<std::vector<SagaSummary>> all = this->store().ListSagas(SagaFilter{});
  STORE_ASSERT_OK(all);
  EXPECT_EQ(3u, all->size());
  for (const SagaSummary& sum : *all) {
    EXPECT_EQ("running", sum.state);
    EXPECT_EQ(3u, this->JournalSize(sum.saga_id));
  }
}

TYPED_TEST_P(StoreConformanceTest, TwoPhaseDataRoundTrips) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  Result<SagaRecord> before = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(before);
  EXPECT_TRUE(before->steps[0].phase.is_null());
  StepRecord step = before->steps[0];
  step.state = "awaiting_approval";
  step.phase = Json{{"preview", {{"summary", "charge EUR 10"}, {"version", "v7"}}},
                    {"token", "idem1.abc.def"},
                    {"nonce", "n-1"},
                    {"expires_ms", 1700000900000LL}};
  WriteBatch b;
  b.saga_id = "saga-1";
  b.steps = {step};
  STORE_ASSERT_OK(this->store().Commit(b));
  Result<SagaRecord> after = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(after);
  ExpectStepEq(step, after->steps[0]);
}

TYPED_TEST_P(StoreConformanceTest, TokenNonceIsConsumedOnceAndASecondUseWritesNothing) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  Result<SagaRecord> before = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(before);
  StepRecord step = before->steps[0];
  step.state = "submitted";
  step.attempt = 1;
  WriteBatch first;
  first.saga_id = "saga-1";
  first.steps = {step};
  first.journal = {MakeEntry("saga-1", step.step_id, "submitted", 2000)};
  first.consume_token = "nonce-1";
  first.consume_token_step = step.step_id;
  STORE_ASSERT_OK(this->store().Commit(first));
  const size_t journal_after_first = this->JournalSize("saga-1");

  StepRecord again = step;
  again.attempt = 2;
  WriteBatch second = first;
  second.steps = {again};
  Status s = this->store().Commit(second);
  EXPECT_EQ(Code::kConflict, s.code()) << s.ToString();
  Result<SagaRecord> after = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(after);
  EXPECT_EQ(1, after->steps[0].attempt);
  EXPECT_EQ(journal_after_first, this->JournalSize("saga-1"));

  WriteBatch other = first;
  other.consume_token = "nonce-2";
  STORE_EXPECT_OK(this->store().Commit(other));
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentConsumersOfOneNonceHaveOneWinner) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  Result<SagaRecord> before = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(before);
  std::atomic<int> wins{0};
  std::atomic<int> conflicts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      WriteBatch b;
      b.saga_id = "saga-1";
      b.journal = {MakeEntry("saga-1", "step0", "submitted", 3000 + t)};
      b.consume_token = "the-nonce";
      b.consume_token_step = "step0";
      for (int attempt = 0; attempt < 50; ++attempt) {
        Status s = this->store().Commit(b);
        if (s.code() == Code::kUnavailable || s.code() == Code::kAborted) continue;
        if (s.ok()) ++wins;
        if (s.code() == Code::kConflict) ++conflicts;
        return;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(1, wins.load());
  EXPECT_EQ(7, conflicts.load());
  EXPECT_EQ(2u, this->JournalSize("saga-1"));  // saga_created + the winner's entry
}

// ---- Leases and fencing -------------------------------------------------------

/// Creates saga `id` (created at `at_ms`) and, unless `state` is "pending",
/// moves it to `state` with a journal entry at `at_ms` (its updated time).
inline void CreateInState(Store& store, const std::string& id, const std::string& state,
                          int64_t at_ms) {
  STORE_ASSERT_OK(store.CreateIntent(MakeSaga(id, "intent-" + id, 1, at_ms)));
  if (state == "pending") return;
  WriteBatch w;
  w.saga_id = id;
  w.saga_state = state;
  w.journal = {MakeEntry(id, "", "moved", at_ms)};
  STORE_ASSERT_OK(store.Commit(w));
}

inline std::vector<std::string> LeaseIds(const std::vector<Lease>& leases) {
  std::vector<std::string> out;
  for (const Lease& l : leases) out.push_back(l.saga_id);
  return out;
}

inline void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TYPED_TEST_P(StoreConformanceTest, ClaimTakesRunnableSagasOldestFirstUpToTheLimit) {
  // updated_ms: b=100 d=200 c=300 e=400 a=500; d is done, f is waiting elsewhere.
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "a", "pending", 500));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "b", "pending", 100));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "c", "running", 300));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "d", "succeeded", 200));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "e", "pending", 400));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "f", "awaiting_approval", 50));
  const std::vector<std::string> runnable = {"pending", "running"};

  const int64_t before_ms = SystemClock::Get()->NowMs();
  Result<std::vector<Lease>> first = this->store().ClaimSagas(runnable, "w1", 60'000, 3);
  STORE_ASSERT_OK(first);
  EXPECT_EQ((std::vector<std::string>{"b", "c", "e"}), LeaseIds(*first));
  for (const Lease& l : *first) {
    SCOPED_TRACE(l.saga_id);
    EXPECT_EQ("w1", l.owner);
    EXPECT_EQ(1, l.epoch);  // CreateIntent left the lease free, at epoch 0
    // The store's clock (the server's, for PostgreSQL) is near this one.
    EXPECT_GT(l.expires_ms, before_ms + 60'000 - 5'000);
    EXPECT_LT(l.expires_ms, before_ms + 60'000 + 5'000);
  }

  // Held leases are not claimed again, by anyone.
  Result<std::vector<Lease>> second = this->store().ClaimSagas(runnable, "w2", 60'000, 10);
  STORE_ASSERT_OK(second);
  EXPECT_EQ((std::vector<std::string>{"a"}), LeaseIds(*second));
  Result<std::vector<Lease>> third = this->store().ClaimSagas(runnable, "w1", 60'000, 10);
  STORE_ASSERT_OK(third);
  EXPECT_TRUE(third->empty());

  // Other states are claimed only when asked for.
  Result<std::vector<Lease>> waiting =
      this->store().ClaimSagas({"awaiting_approval", "no-such-state"}, "w3", 60'000, 10);
  STORE_ASSERT_OK(waiting);
  EXPECT_EQ((std::vector<std::string>{"f"}), LeaseIds(*waiting));

  // Claiming wrote nothing else: states, times and journals are unchanged.
  Result<SagaRecord> b = this->store().LoadSaga("b");
  STORE_ASSERT_OK(b);
  EXPECT_EQ("pending", b->summary.state);
  EXPECT_EQ(100, b->summary.updated_ms);
  EXPECT_EQ(1u, this->JournalSize("b"));
}

TYPED_TEST_P(StoreConformanceTest, ClaimRejectsBadArguments) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "a", "pending", 100));
  EXPECT_EQ(Code::kInvalidArgument, this->store().ClaimSagas({}, "w", 1000, 1).status().code());
  EXPECT_EQ(Code::kInvalidArgument,
            this->store().ClaimSagas({"pending"}, "", 1000, 1).status().code());
  EXPECT_EQ(Code::kInvalidArgument,
            this->store().ClaimSagas({"pending"}, "w", 0, 1).status().code());
  EXPECT_EQ(Code::kInvalidArgument,
            this->store().ClaimSagas({"pending"}, "w", 1000, 0).status().code());
  EXPECT_EQ(Code::kInvalidArgument, this->store().ClaimSaga("a", "", 1000).status().code());
  EXPECT_EQ(Code::kInvalidArgument, this->store().ClaimSaga("a", "w", 0).status().code());
  // Nothing was claimed by the refused calls.
  Result<std::vector<Lease>> got = this->store().ClaimSagas({"pending"}, "w", 1000, 5);
  STORE_ASSERT_OK(got);
  ASSERT_EQ(1u, got->size());
  EXPECT_EQ(1, (*got)[0].epoch);
}

TYPED_TEST_P(StoreConformanceTest, ExpiredLeaseIsTakenOverAndTheOldOwnerIsFenced) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "s", "running", 100));
  Result<std::vector<Lease>> mine = this->store().ClaimSagas({"running"}, "w1", 1, 10);
  STORE_ASSERT_OK(mine);
  ASSERT_EQ(1u, mine->size());
  const Lease old = (*mine)[0];
  EXPECT_EQ(1, old.epoch);
  SleepMs(20);  // the 1 ms lease has expired

  // Expired but not claimed again: only the epoch decides, so the holder may
  // still write (nobody else can have written since).
  WriteBatch late_but_safe;
  late_but_safe.saga_id = "s";
  late_but_safe.journal = {MakeEntry("s", "step0", "w1-still-alone", 150)};
  late_but_safe.fence_epoch = old.epoch;
  STORE_ASSERT_OK(this->store().Commit(late_but_safe));

  Result<std::vector<Lease>> taken = this->store().ClaimSagas({"running"}, "w2", 60'000, 10);
  STORE_ASSERT_OK(taken);
  ASSERT_EQ(1u, taken->size());
  const Lease now = (*taken)[0];
  EXPECT_EQ("s", now.saga_id);
  EXPECT_EQ("w2", now.owner);
  EXPECT_EQ(old.epoch + 1, now.epoch);

  Result<SagaRecord> before = this->store().LoadSaga("s");
  STORE_ASSERT_OK(before);
  const size_t journal_before = this->JournalSize("s");

  // The old owner: every lease call and every fenced write is refused.
  Status renew = this->store().RenewLease(old, 60'000);
  EXPECT_EQ(Code::kAborted, renew.code()) << renew.ToString();
  EXPECT_NE(std::string::npos, renew.message().find("lease lost")) << renew.message();
  Status release = this->store().ReleaseLease(old);
  EXPECT_EQ(Code::kAborted, release.code()) << release.ToString();

  StepRecord step = before->steps[0];
  step.state = "succeeded";
  step.attempt = 9;
  WriteBatch stale;
  stale.saga_id = "s";
  stale.saga_state = "succeeded";
  stale.saga_reason = "stale writer";
  stale.steps = {step};
  stale.journal = {MakeEntry("s", "step0", "w1-late", 900)};
  stale.effects = {MakeEffect("s", "step0", "s/late-effect", 900)};
  stale.consume_token = "late-nonce";
  stale.consume_token_step = "step0";
  stale.fence_epoch = old.epoch;
  Status fenced = this->store().Commit(stale);
  EXPECT_EQ(Code::kAborted, fenced.code()) << fenced.ToString();
  EXPECT_NE(std::string::npos, fenced.message().find("lease lost")) << fenced.message();

  // ... and nothing of it was written.
  Result<SagaRecord> after = this->store().LoadSaga("s");
  STORE_ASSERT_OK(after);
  EXPECT_EQ("running", after->summary.state);
  EXPECT_EQ(before->summary.reason, after->summary.reason);
  EXPECT_EQ(before->summary.updated_ms, after->summary.updated_ms);
  ExpectStepEq(before->steps[0], after->steps[0]);
  EXPECT_EQ(journal_before, this->JournalSize("s"));
  Result<std::vector<EffectRecord>> effects = this->store().ListEffects("s");
  STORE_ASSERT_OK(effects);
  EXPECT_TRUE(effects->empty());

  // The new owner's fenced batch goes through: the effect key and the nonce
  // were not taken by the refused batch.
  WriteBatch current = stale;
  current.saga_reason = "current owner";
  current.fence_epoch = now.epoch;
  STORE_ASSERT_OK(this->store().Commit(current));
  // Unfenced batches (fence_epoch 0) are not checked at all.
  WriteBatch unfenced;
  unfenced.saga_id = "s";
  unfenced.journal = {MakeEntry("s", "", "operator-note", 1000)};
  STORE_ASSERT_OK(this->store().Commit(unfenced));

  Result<SagaRecord> done = this->store().LoadSaga("s");
  STORE_ASSERT_OK(done);
  EXPECT_EQ("succeeded", done->summary.state);
  EXPECT_EQ("current owner", done->summary.reason);
  EXPECT_EQ(9, done->steps[0].attempt);
  EXPECT_EQ(journal_before + 2, this->JournalSize("s"));
  Result<std::vector<EffectRecord>> landed = this->store().ListEffects("s");
  STORE_ASSERT_OK(landed);
  ASSERT_EQ(1u, landed->size());
  EXPECT_EQ("s/late-effect", (*landed)[0].idempotency_key);

  // The new owner's lease calls work; the old one cannot claim it back.
  STORE_EXPECT_OK(this->store().RenewLease(now, 60'000));
  Result<Lease> back = this->store().ClaimSaga("s", "w1", 60'000);
  EXPECT_EQ(Code::kAborted, back.status().code()) << back.status().ToString();
}

TYPED_TEST_P(StoreConformanceTest, RenewedLeaseHoldsAndMissingSagaIsNotFound) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "s", "pending", 100));
  Result<std::vector<Lease>> mine = this->store().ClaimSagas({"pending"}, "w1", 50, 1);
  STORE_ASSERT_OK(mine);
  ASSERT_EQ(1u, mine->size());
  STORE_ASSERT_OK(this->store().RenewLease((*mine)[0], 60'000));
  SleepMs(100);  // past the first expiry, within the renewed one
  Result<std::vector<Lease>> other = this->store().ClaimSagas({"pending"}, "w2", 60'000, 1);
  STORE_ASSERT_OK(other);
  EXPECT_TRUE(other->empty());

  Lease ghost = (*mine)[0];
  ghost.saga_id = "ghost";
  EXPECT_EQ(Code::kNotFound, this->store().RenewLease(ghost, 1000).code());
  EXPECT_EQ(Code::kNotFound, this->store().ReleaseLease(ghost).code());
  EXPECT_EQ(Code::kNotFound, this->store().ClaimSaga("ghost", "w1", 1000).status().code());
  WriteBatch fenced_ghost;
  fenced_ghost.saga_id = "ghost";
  fenced_ghost.fence_epoch = 1;
  EXPECT_EQ(Code::kNotFound, this->store().Commit(fenced_ghost).code());
  // A lease with the right epoch but another owner name is not the lease.
  Lease impostor = (*mine)[0];
  impostor.owner = "w2";
  EXPECT_EQ(Code::kAborted, this->store().RenewLease(impostor, 1000).code());
}

TYPED_TEST_P(StoreConformanceTest, ReleasedLeaseIsClaimableAtOnce) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "s", "pending", 100));
  Result<std::vector<Lease>> mine = this->store().ClaimSagas({"pending"}, "w1", 60'000, 1);
  STORE_ASSERT_OK(mine);
  ASSERT_EQ(1u, mine->size());
  Result<std::vector<Lease>> none = this->store().ClaimSagas({"pending"}, "w2", 60'000, 1);
  STORE_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());

  STORE_ASSERT_OK(this->store().ReleaseLease((*mine)[0]));
  Result<std::vector<Lease>> theirs = this->store().ClaimSagas({"pending"}, "w2", 60'000, 1);
  STORE_ASSERT_OK(theirs);
  ASSERT_EQ(1u, theirs->size());
  EXPECT_EQ("w2", (*theirs)[0].owner);
  EXPECT_EQ(2, (*theirs)[0].epoch);  // release kept the epoch; the claim bumped it
  EXPECT_EQ(Code::kAborted, this->store().ReleaseLease((*mine)[0]).code());
  WriteBatch stale;
  stale.saga_id = "s";
  stale.journal = {MakeEntry("s", "", "stale", 500)};
  stale.fence_epoch = (*mine)[0].epoch;
  EXPECT_EQ(Code::kAborted, this->store().Commit(stale).code());
  EXPECT_EQ(1u, this->JournalSize("s"));
}

TYPED_TEST_P(StoreConformanceTest, CommitCanReleaseItsLease) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "s", "running", 100));
  Result<Lease> mine = this->store().ClaimSaga("s", "w1", 60'000);
  STORE_ASSERT_OK(mine);
  const size_t before = this->JournalSize("s");

  WriteBatch unfenced;
  unfenced.saga_id = "s";
  unfenced.release_lease = true;
  unfenced.journal = {MakeEntry("s", "", "unfenced", 300)};
  EXPECT_EQ(Code::kInvalidArgument, this->store().Commit(unfenced).code());
  EXPECT_EQ(before, this->JournalSize("s"));

  WriteBatch last;
  last.saga_id = "s";
  last.saga_state = "succeeded";
  last.journal = {MakeEntry("s", "", "saga_succeeded", 400)};
  last.fence_epoch = mine->epoch;
  last.release_lease = true;
  STORE_ASSERT_OK(this->store().Commit(last));
  Result<SagaRecord> rec = this->store().LoadSaga("s");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("succeeded", rec->summary.state);
  EXPECT_EQ(before + 1, this->JournalSize("s"));
  // Released with the batch: free for another at once.
  Result<Lease> theirs = this->store().ClaimSaga("s", "w2", 60'000);
  STORE_ASSERT_OK(theirs);
  EXPECT_EQ(mine->epoch + 1, theirs->epoch);

  // A stale holder's releasing batch is fenced out whole: w2 keeps the lease.
  WriteBatch stale = last;
  stale.journal = {MakeEntry("s", "", "stale", 500)};
  EXPECT_EQ(Code::kAborted, this->store().Commit(stale).code());
  EXPECT_EQ(before + 1, this->JournalSize("s"));
  Result<Lease> third = this->store().ClaimSaga("s", "w3", 60'000);
  EXPECT_EQ(Code::kAborted, third.status().code()) << third.status().ToString();
}

TYPED_TEST_P(StoreConformanceTest, ClaimSagaById) {
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "s", "succeeded", 100));  // any state
  Result<Lease> first = this->store().ClaimSaga("s", "w1", 60'000);
  STORE_ASSERT_OK(first);
  EXPECT_EQ("s", first->saga_id);
  EXPECT_EQ("w1", first->owner);
  EXPECT_EQ(1, first->epoch);
  Result<Lease> other = this->store().ClaimSaga("s", "w2", 60'000);
  EXPECT_EQ(Code::kAborted, other.status().code()) << other.status().ToString();
  EXPECT_NE(std::string::npos, other.status().message().find("w1")) << other.status().message();
  Result<std::vector<Lease>> batch = this->store().ClaimSagas({"succeeded"}, "w2", 60'000, 5);
  STORE_ASSERT_OK(batch);
  EXPECT_TRUE(batch->empty());

  // The holder claiming again gets a new epoch, which fences its old writes.
  Result<Lease> again = this->store().ClaimSaga("s", "w1", 1);
  STORE_ASSERT_OK(again);
  EXPECT_EQ(2, again->epoch);
  EXPECT_EQ(Code::kAborted, this->store().RenewLease(*first, 1000).code());
  SleepMs(20);
  Result<Lease> taken = this->store().ClaimSaga("s", "w2", 60'000);
  STORE_ASSERT_OK(taken);
  EXPECT_EQ(3, taken->epoch);
  EXPECT_EQ("w2", taken->owner);
}

TYPED_TEST_P(StoreConformanceTest, GaugesCountSagasByStateLeasesAndWaitingSteps) {
  const GaugeQuery query{/*age_ms=*/3'600'000, /*waiting_state=*/"awaiting_approval"};
  const int64_t before_ms = SystemClock::Get()->NowMs();
  Result<StoreGauges> empty = this->store().ReadGauges(query);
  STORE_ASSERT_OK(empty);
  EXPECT_TRUE(empty->by_state.empty());
  EXPECT_EQ(0, empty->waiting_steps);
  EXPECT_GE(empty->now_ms, before_ms - 5'000);  // the database's clock, near ours

  // old1/old2 were created (and last moved) long ago, fresh just now.
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "old1", "needs_attention", 300));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "old2", "needs_attention", 100));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "fresh", "needs_attention", before_ms));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "run1", "running", before_ms));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "run2", "running", before_ms));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "wait", "awaiting_approval", before_ms));
  ASSERT_NO_FATAL_FAILURE(CreateInState(this->store(), "done", "succeeded", 200));
  // One step waits for a person in a waiting saga; a step in that state in a
  // saga that moved on does not count.
  for (const char* id : {"wait", "run2"}) {
    StepRecord st = this->FirstStep(id);
    st.state = "awaiting_approval";
    WriteBatch w;
    w.saga_id = id;
    w.steps = {st};
    STORE_ASSERT_OK(this->store().Commit(w));
  }
  // Leases: run1's expires (never given back), run2's holds, fresh's is released.
  STORE_ASSERT_OK(this->store().ClaimSaga("run1", "w1", 1));
  STORE_ASSERT_OK(this->store().ClaimSaga("run2", "w1", 600'000));
  Result<Lease> released = this->store().ClaimSaga("fresh", "w1", 600'000);
  STORE_ASSERT_OK(released);
  STORE_ASSERT_OK(this->store().ReleaseLease(*released));
  SleepMs(20);

  Result<StoreGauges> g = this->store().ReadGauges(query);
  STORE_ASSERT_OK(g);
  std::map<std::string, int64_t> counts;
  for (const auto& [state, sg] : g->by_state) counts[state] = sg.sagas;
  const std::map<std::string, int64_t> want = {
      {"needs_attention", 3}, {"running", 2}, {"awaiting_approval", 1}, {"succeeded", 1}};
  EXPECT_EQ(want, counts);
  const StateGauges& na = g->by_state["needs_attention"];
  EXPECT_EQ(100, na.oldest_updated_ms);
  EXPECT_EQ(2, na.created_before);
  EXPECT_EQ(0, na.leases_expired);
  EXPECT_EQ(1, g->by_state["succeeded"].created_before);
  EXPECT_EQ(0, g->by_state["running"].created_before);
  EXPECT_EQ(1, g->by_state["running"].leases_expired);
  EXPECT_EQ(1, g->waiting_steps);
  EXPECT_GE(g->now_ms, empty->now_ms);

  // age_ms 0 counts no saga as old; no waiting state counts no step.
  Result<StoreGauges> plain = this->store().ReadGauges(GaugeQuery{});
  STORE_ASSERT_OK(plain);
  EXPECT_EQ(0, plain->by_state["needs_attention"].created_before);
  EXPECT_EQ(0, plain->waiting_steps);
  EXPECT_EQ(3, plain->by_state["needs_attention"].sagas);
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentClaimersNeverShareASaga) {
  constexpr int kSagas = 200;
  constexpr int kThreads = 8;
  for (int i = 0; i < kSagas; ++i) {
    const std::string id = "saga-" + std::to_string(i);
    STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga(id, "intent-" + id, 1, 1000 + i)));
  }
  Store* store = this->store_.get();
  std::atomic<int> total{0};
  std::vector<std::vector<Lease>> got(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string owner = "worker-" + std::to_string(t);
      // SKIP LOCKED may hand out nothing while others hold rows: keep asking
      // until every saga is taken.
      while (total.load() < kSagas && std::chrono::steady_clock::now() < deadline) {
        Result<std::vector<Lease>> r = store->ClaimSagas({"pending"}, owner, 600'000, 7);
        if (!r.ok()) {
          if (r.status().code() == Code::kUnavailable || r.status().code() == Code::kAborted) {
            continue;
          }
          errors[t] = r.status().ToString();
          return;
        }
        for (const Lease& l : *r) got[t].push_back(l);
        total.fetch_add(static_cast<int>(r->size()));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::set<std::string> seen;
  int claimed = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ("", errors[t]) << "thread " << t;
    for (const Lease& l : got[t]) {
      ++claimed;
      EXPECT_TRUE(seen.insert(l.saga_id).second) << l.saga_id << " claimed twice";
      EXPECT_EQ("worker-" + std::to_string(t), l.owner);
      EXPECT_EQ(1, l.epoch);
    }
  }
  EXPECT_EQ(kSagas, claimed);
  EXPECT_EQ(static_cast<size_t>(kSagas), seen.size());
  Result<std::vector<Lease>> rest = this->store().ClaimSagas({"pending"}, "late", 1000, 10);
  STORE_ASSERT_OK(rest);
  EXPECT_TRUE(rest->empty());
}

// ---- Server state: Idempotency-Key records and specs ---------------------------

inline KeyClaimPolicy PolicyAt(int64_t now_ms) {
  KeyClaimPolicy p;
  p.now_ms = now_ms;
  p.lock_timeout_ms = 60'000;
  p.ttl_ms = 24LL * 3600 * 1000;
  return p;
}

TYPED_TEST_P(StoreConformanceTest, KeyIsClaimedOnceThenInFlightAndOtherPayloadMismatches) {
  Result<KeyClaim> first = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(1000));
  STORE_ASSERT_OK(first);
  EXPECT_EQ(KeyClaim::Kind::kClaimed, first->kind);
  EXPECT_FALSE(first->token.empty());
  // The first request is still running: 409 semantics.
  Result<KeyClaim> again = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(1001));
  STORE_ASSERT_OK(again);
  EXPECT_EQ(KeyClaim::Kind::kInFlight, again->kind);
  EXPECT_TRUE(again->token.empty());
  // Another payload under the key: 422 semantics.
  Result<KeyClaim> other = this->keys().ClaimKey("scope", "k-1", "fp-b", PolicyAt(1002));
  STORE_ASSERT_OK(other);
  EXPECT_EQ(KeyClaim::Kind::kMismatch, other->kind);
  // Another scope is another key.
  Result<KeyClaim> elsewhere = this->keys().ClaimKey("scope-2", "k-1", "fp-b", PolicyAt(1003));
  STORE_ASSERT_OK(elsewhere);
  EXPECT_EQ(KeyClaim::Kind::kClaimed, elsewhere->kind);

  Result<KeyRecord> rec = this->keys().FindKey("scope", "k-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("in_flight", rec->state);
  EXPECT_EQ("fp-a", rec->fingerprint);
  EXPECT_EQ(1000, rec->created_ms);
  EXPECT_EQ(Code::kNotFound, this->keys().FindKey("scope", "absent").status().code());
}

TYPED_TEST_P(StoreConformanceTest, StoredResponseIsReplayedAndSurvivesReopen) {
  Result<KeyClaim> claim = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(1000));
  STORE_ASSERT_OK(claim);
  ASSERT_EQ(KeyClaim::Kind::kClaimed, claim->kind);
  const std::string body = std::string("{\"id\":1}\0\xff\x01", 11);
  STORE_ASSERT_OK(
      this->keys().CompleteKey("scope", "k-1", claim->token, 201, "application/json", body));
  // The record is done: its claim cannot complete or release it again.
  EXPECT_EQ(Code::kAborted,
            this->keys().CompleteKey("scope", "k-1", claim->token, 500, "text/plain", "x").code());
  STORE_EXPECT_OK(this->keys().ReleaseKey("scope", "k-1", claim->token));
  ASSERT_NO_FATAL_FAILURE(this->Reopen());

  Result<KeyClaim> replay = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(2000));
  STORE_ASSERT_OK(replay);
  ASSERT_EQ(KeyClaim::Kind::kReplay, replay->kind);
  EXPECT_EQ("done", replay->stored.state);
  EXPECT_EQ(201, replay->stored.status);
  EXPECT_EQ("application/json", replay->stored.content_type);
  EXPECT_EQ(body, replay->stored.body);
  EXPECT_EQ(1000, replay->stored.created_ms);
  Result<KeyClaim> other = this->keys().ClaimKey("scope", "k-1", "fp-b", PolicyAt(2001));
  STORE_ASSERT_OK(other);
  EXPECT_EQ(KeyClaim::Kind::kMismatch, other->kind);
  Result<KeyRecord> rec = this->keys().FindKey("scope", "k-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ(body, rec->body);
}

TYPED_TEST_P(StoreConformanceTest, ReleasedKeyIsClaimableAgain) {
  Result<KeyClaim> claim = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(1000));
  STORE_ASSERT_OK(claim);
  STORE_ASSERT_OK(this->keys().ReleaseKey("scope", "k-1", claim->token));
  EXPECT_EQ(Code::kNotFound, this->keys().FindKey("scope", "k-1").status().code());
  Result<KeyClaim> again = this->keys().ClaimKey("scope", "k-1", "fp-b", PolicyAt(1001));
  STORE_ASSERT_OK(again);
  EXPECT_EQ(KeyClaim::Kind::kClaimed, again->kind);
  EXPECT_NE(claim->token, again->token);
}

TYPED_TEST_P(StoreConformanceTest, AbandonedClaimIsTakenOverAndTheOldHolderIsFenced) {
  const KeyClaimPolicy at = PolicyAt(1000);
  Result<KeyClaim> old = this->keys().ClaimKey("scope", "k-1", "fp-a", at);
  STORE_ASSERT_OK(old);
  const int64_t late = 1000 + at.lock_timeout_ms;
  Result<KeyClaim> other = this->keys().ClaimKey("scope", "k-1", "fp-b", PolicyAt(late));
  STORE_ASSERT_OK(other);
  EXPECT_EQ(KeyClaim::Kind::kMismatch, other->kind);  // only the same request takes over
  Result<KeyClaim> next = this->keys().ClaimKey("scope", "k-1", "fp-a", PolicyAt(late));
  STORE_ASSERT_OK(next);
  ASSERT_EQ(KeyClaim::Kind::kClaimed, next->kind);
  EXPECT_EQ(Code::kAborted,
            this->keys().CompleteKey("scope", "k-1", old->token, 200, "text/plain", "old").code());
  STORE_ASSERT_OK(this->keys().CompleteKey("scope", "k-1", next->token, 200, "text/plain", "new"));
  Result<KeyRecord> rec = this->keys().FindKey("scope", "k-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("new", rec->body);
  EXPECT_EQ(1000, rec->created_ms);  // a take-over keeps the record's age
}

TYPED_TEST_P(StoreConformanceTest, RenewedClaimOutlivesTheLockTimeoutAndAnUnrenewedOneIsTakenOver) {
  const KeyClaimPolicy at = PolicyAt(1000);
  Result<KeyClaim> kept = this->keys().ClaimKey("scope", "k-kept", "fp-a", at);
  Result<KeyClaim> left = this->keys().ClaimKey("scope", "k-left", "fp-a", at);
  STORE_ASSERT_OK(kept);
  STORE_ASSERT_OK(left);
  // Only k-kept's holder renews, twice, each well inside the lock timeout.
  const int64_t step = at.lock_timeout_ms * 2 / 3;
  for (int64_t t : {1000 + step, 1000 + 2 * step}) {
    Result<std::vector<size_t>> lost =
        this->keys().RenewKeys({{"scope", "k-kept", kept->token}}, t);
    STORE_ASSERT_OK(lost);
    EXPECT_TRUE(lost->empty());
  }
  // Past the lock timeout of the first claim, before that of the last renew.
  const int64_t late = 1000 + 2 * step + at.lock_timeout_ms - 1;
  Result<KeyClaim> retry_kept = this->keys().ClaimKey("scope", "k-kept", "fp-a", PolicyAt(late));
  STORE_ASSERT_OK(retry_kept);
  EXPECT_EQ(KeyClaim::Kind::kInFlight, retry_kept->kind);
  Result<KeyClaim> retry_left = this->keys().ClaimKey("scope", "k-left", "fp-a", PolicyAt(late));
  STORE_ASSERT_OK(retry_left);
  ASSERT_EQ(KeyClaim::Kind::kClaimed, retry_left->kind);

  // The old holder of k-left learns it lost its claim; k-kept is still held,
  // an absent key is lost, and nothing is written for the lost ones.
  Result<std::vector<size_t>> lost = this->keys().RenewKeys({{"scope", "k-left", left->token},
                                                             {"scope", "k-kept", kept->token},
                                                             {"scope", "absent", "clm_none"}},
                                                            late + 1);
  STORE_ASSERT_OK(lost);
  EXPECT_EQ((std::vector<size_t>{0, 2}), *lost);
  EXPECT_EQ(Code::kNotFound, this->keys().FindKey("scope", "absent").status().code());
  Result<KeyClaim> still =
      this->keys().ClaimKey("scope", "k-left", "fp-a", PolicyAt(late + at.lock_timeout_ms - 1));
  STORE_ASSERT_OK(still);
  EXPECT_EQ(KeyClaim::Kind::kInFlight, still->kind);  // the taker's claim was not renewed away

  // A done record is not renewed back to in_flight.
  STORE_ASSERT_OK(
      this->keys().CompleteKey("scope", "k-kept", kept->token, 200, "text/plain", "ok"));
  Result<std::vector<size_t>> after =
      this->keys().RenewKeys({{"scope", "k-kept", kept->token}}, late + 2);
  STORE_ASSERT_OK(after);
  EXPECT_EQ((std::vector<size_t>{0}), *after);
  Result<KeyRecord> rec = this->keys().FindKey("scope", "k-kept");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("done", rec->state);
  Result<std::vector<size_t>> none = this->keys().RenewKeys({}, late + 3);
  STORE_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TYPED_TEST_P(StoreConformanceTest, ExpiredKeyStartsANewRequestAndIsPurged) {
  const KeyClaimPolicy at = PolicyAt(1000);
  for (const char* key : {"k-1", "k-2"}) {
    Result<KeyClaim> c = this->keys().ClaimKey("scope", key, "fp-a", at);
    STORE_ASSERT_OK(c);
    STORE_ASSERT_OK(this->keys().CompleteKey("scope", key, c->token, 200, "text/plain", key));
  }
  Result<KeyClaim> in_flight = this->keys().ClaimKey("scope", "k-3", "fp-a", at);
  STORE_ASSERT_OK(in_flight);
  const int64_t expired = 1000 + at.ttl_ms;
  Result<KeyClaim> renewed = this->keys().ClaimKey("scope", "k-1", "fp-b", PolicyAt(expired));
  STORE_ASSERT_OK(renewed);
  EXPECT_EQ(KeyClaim::Kind::kClaimed, renewed->kind);
  Result<KeyRecord> rec = this->keys().FindKey("scope", "k-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ("in_flight", rec->state);
  EXPECT_EQ("fp-b", rec->fingerprint);
  EXPECT_EQ(expired, rec->created_ms);
  // Done records created at or before the cutoff go; in_flight ones stay.
  Result<int64_t> purged = this->keys().PurgeKeys(1000);
  STORE_ASSERT_OK(purged);
  EXPECT_EQ(1, *purged);
  EXPECT_EQ(Code::kNotFound, this->keys().FindKey("scope", "k-2").status().code());
  STORE_EXPECT_OK(this->keys().FindKey("scope", "k-3"));
  STORE_EXPECT_OK(this->keys().FindKey("scope", "k-1"));
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentClaimsOfOneKeyFromTwoConnectionsHaveOneWinner) {
  Result<std::unique_ptr<Store>> second = this->factory_.Open();
  STORE_ASSERT_OK(second);
  ASSERT_NE((*second)->KeyRecords(), nullptr);
  KeyRecordStore* sides[2] = {&this->keys(), (*second)->KeyRecords()};
  std::atomic<int> claimed{0};
  std::atomic<int> in_flight{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int attempt = 0; attempt < 50; ++attempt) {
        Result<KeyClaim> c = sides[t % 2]->ClaimKey("scope", "k-1", "fp-a", PolicyAt(1000 + t));
        if (!c.ok() &&
            (c.status().code() == Code::kUnavailable || c.status().code() == Code::kAborted)) {
          SleepMs(5);
          continue;
        }
        if (c.ok() && c->kind == KeyClaim::Kind::kClaimed) ++claimed;
        if (c.ok() && c->kind == KeyClaim::Kind::kInFlight) ++in_flight;
        return;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(1, claimed.load());
  EXPECT_EQ(7, in_flight.load());
}

inline StoredSpec MakeSpec(const std::string& name, int version, const Json& doc) {
  StoredSpec s;
  s.name = name;
  s.version = version;
  s.doc = doc;
  s.fingerprint = Fingerprint(doc);
  s.created_ms = 1000 + version;
  s.created_by = "alice";
  return s;
}

TYPED_TEST_P(StoreConformanceTest, SpecVersionsAreStoredOnceAndNeverChange) {
  const Json doc = Json{{"name", "travel"}, {"steps", Json::array({"flight"})}};
  Result<SpecPutOutcome> put = this->specs().PutSpec(MakeSpec("travel", 1, doc));
  STORE_ASSERT_OK(put);
  EXPECT_TRUE(put->created);
  Result<SpecPutOutcome> same = this->specs().PutSpec(MakeSpec("travel", 1, doc));
  STORE_ASSERT_OK(same);
  EXPECT_FALSE(same->created);
  EXPECT_EQ(1001, same->spec.created_ms);
  const Json other = Json{{"name", "travel"}, {"steps", Json::array({"hotel"})}};
  EXPECT_EQ(Code::kConflict, this->specs().PutSpec(MakeSpec("travel", 1, other)).status().code());
  STORE_ASSERT_OK(this->specs().PutSpec(MakeSpec("travel", 2, other)));
  STORE_ASSERT_OK(this->specs().PutSpec(MakeSpec("alpha", 7, doc)));
  ASSERT_NO_FATAL_FAILURE(this->Reopen());

  Result<StoredSpec> latest = this->specs().GetSpec("travel", 0);
  STORE_ASSERT_OK(latest);
  EXPECT_EQ(2, latest->version);
  EXPECT_EQ(other, latest->doc);
  EXPECT_EQ(Fingerprint(other), latest->fingerprint);
  EXPECT_EQ("alice", latest->created_by);
  Result<StoredSpec> first = this->specs().GetSpec("travel", 1);
  STORE_ASSERT_OK(first);
  EXPECT_EQ(doc, first->doc);
  EXPECT_EQ(1001, first->created_ms);
  EXPECT_EQ(Code::kNotFound, this->specs().GetSpec("travel", 3).status().code());
  EXPECT_EQ(Code::kNotFound, this->specs().GetSpec("absent", 0).status().code());
  Result<std::vector<StoredSpec>> all = this->specs().ListSpecs();
  STORE_ASSERT_OK(all);
  ASSERT_EQ(3u, all->size());
  EXPECT_EQ("alpha", (*all)[0].name);
  EXPECT_EQ("travel", (*all)[1].name);
  EXPECT_EQ(1, (*all)[1].version);
  EXPECT_EQ(2, (*all)[2].version);
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentPutsOfOneSpecVersionHaveOneWinner) {
  Result<std::unique_ptr<Store>> second = this->factory_.Open();
  STORE_ASSERT_OK(second);
  ASSERT_NE((*second)->Specs(), nullptr);
  SpecStore* sides[2] = {&this->specs(), (*second)->Specs()};
  std::atomic<int> created{0};
  std::atomic<int> existing{0};
  std::atomic<int> conflicts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      // Even threads put one document, odd ones another.
      const Json doc = Json{{"name", "travel"}, {"variant", t % 2}};
      for (int attempt = 0; attempt < 50; ++attempt) {
        Result<SpecPutOutcome> r = sides[t % 2]->PutSpec(MakeSpec("travel", 1, doc));
        if (!r.ok() &&
            (r.status().code() == Code::kUnavailable || r.status().code() == Code::kAborted)) {
          SleepMs(5);
          continue;
        }
        if (r.ok()) ++(r->created ? created : existing);
        if (r.status().code() == Code::kConflict) ++conflicts;
        return;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(1, created.load());
  EXPECT_EQ(3, existing.load());
  EXPECT_EQ(4, conflicts.load());
}

inline ControlRequest MakeControl(const std::string& saga_id, const std::string& kind,
                                  const std::string& request_id, int64_t at_ms) {
  ControlRequest r;
  r.saga_id = saga_id;
  r.request_id = request_id;
  r.kind = kind;
  r.by = "ops";
  r.reason = "reason of " + request_id;
  r.requested_ms = at_ms;
  return r;
}

// What a drive starts from (Engine::Drive): the claim, the saga and its
// pending control request, as ClaimSaga, LoadSaga and PendingControl answer.
TYPED_TEST_P(StoreConformanceTest, ClaimAndLoadAnswersWhatClaimLoadAndPendingControlWould) {
  ASSERT_NE(this->store().Controls(), nullptr);
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1", 3)));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  STORE_ASSERT_OK(
      this->store().Controls()->RequestControl(MakeControl("saga-2", "pause", "rq-1", 2000)));

  Result<ClaimedSaga> first = this->store().ClaimAndLoad("saga-1", "w1", 60'000);
  STORE_ASSERT_OK(first);
  EXPECT_EQ("saga-1", first->lease.saga_id);
  EXPECT_EQ("w1", first->lease.owner);
  EXPECT_EQ(1, first->lease.epoch);
  EXPECT_GT(first->lease.expires_ms, 0);
  Result<SagaRecord> loaded = this->store().LoadSaga("saga-1");
  STORE_ASSERT_OK(loaded);
  const SagaRecord& got = first->record;
  EXPECT_EQ(loaded->summary.intent_key, got.summary.intent_key);
  EXPECT_EQ(loaded->summary.spec_name, got.summary.spec_name);
  EXPECT_EQ(loaded->summary.state, got.summary.state);
  EXPECT_EQ(loaded->summary.created_ms, got.summary.created_ms);
  EXPECT_EQ(loaded->fingerprint, got.fingerprint);
  EXPECT_EQ(loaded->spec, got.spec);
  EXPECT_EQ(loaded->input, got.input);
  ASSERT_EQ(3u, got.steps.size());
  for (size_t i = 0; i < got.steps.size(); ++i) {
    EXPECT_EQ(loaded->steps[i].index, got.steps[i].index);
    EXPECT_EQ(loaded->steps[i].step_id, got.steps[i].step_id);
    EXPECT_EQ(loaded->steps[i].step_key, got.steps[i].step_key);
    EXPECT_EQ(loaded->steps[i].state, got.steps[i].state);
  }
  EXPECT_TRUE(first->control_read);
  EXPECT_FALSE(first->control.has_value());

  // The lease is ClaimSaga's: another owner is refused (told who holds it),
  // the holder's fenced writes commit.
  Result<ClaimedSaga> other = this->store().ClaimAndLoad("saga-1", "w2", 60'000);
  EXPECT_EQ(Code::kAborted, other.status().code()) << other.status().ToString();
  EXPECT_NE(std::string::npos, other.status().message().find("w1")) << other.status().message();
  EXPECT_EQ(Code::kAborted, this->store().ClaimSaga("saga-1", "w2", 60'000).status().code());
  WriteBatch moved;
  moved.saga_id = "saga-1";
  moved.saga_state = "running";
  moved.journal = {MakeEntry("saga-1", "", "saga_started", 1500)};
  moved.fence_epoch = first->lease.epoch;
  STORE_ASSERT_OK(this->store().Commit(moved));

  // Its holder claiming again gets a new epoch (the old one is fenced out)
  // and the saga as that write left it.
  Result<ClaimedSaga> again = this->store().ClaimAndLoad("saga-1", "w1", 60'000);
  STORE_ASSERT_OK(again);
  EXPECT_EQ(2, again->lease.epoch);
  EXPECT_EQ("running", again->record.summary.state);
  WriteBatch stale = moved;
  stale.journal = {MakeEntry("saga-1", "", "stale", 1600)};
  EXPECT_EQ(Code::kAborted, this->store().Commit(stale).code());

  // The pending request comes with its saga.
  Result<ClaimedSaga> second = this->store().ClaimAndLoad("saga-2", "w1", 60'000);
  STORE_ASSERT_OK(second);
  EXPECT_TRUE(second->control_read);
  ASSERT_TRUE(second->control.has_value());
  EXPECT_EQ("saga-2", second->control->saga_id);
  EXPECT_EQ("rq-1", second->control->request_id);
  EXPECT_EQ("pause", second->control->kind);
  EXPECT_EQ("ops", second->control->by);
  EXPECT_EQ("reason of rq-1", second->control->reason);
  EXPECT_EQ(2000, second->control->requested_ms);
  EXPECT_EQ(2u, second->record.steps.size());

  EXPECT_EQ(Code::kNotFound, this->store().ClaimAndLoad("ghost", "w1", 1000).status().code());
  EXPECT_EQ(Code::kInvalidArgument, this->store().ClaimAndLoad("saga-1", "", 1000).status().code());
  EXPECT_EQ(Code::kInvalidArgument, this->store().ClaimAndLoad("saga-1", "w1", 0).status().code());
}

// A write that reads the saga's control request with it (the drive's write
// before its check between steps): the write lands as Commit's would, and
// what was read, where the store reads, is what PendingControl answers after
// it. A refused write reads nothing and writes nothing.
TYPED_TEST_P(StoreConformanceTest, CommitReadingControlWritesAndReadsWhatPendingControlWould) {
  ControlStore* controls = this->store().Controls();
  ASSERT_NE(controls, nullptr);
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  STORE_ASSERT_OK(controls->RequestControl(MakeControl("saga-2", "cancel", "rq-1", 2000)));
  Result<Lease> lease = this->store().ClaimSaga("saga-2", "w1", 60'000);
  STORE_ASSERT_OK(lease);

  for (const std::string id : {"saga-1", "saga-2"}) {
    SCOPED_TRACE(id);
    WriteBatch b;
    b.saga_id = id;
    b.saga_state = "running";
    b.journal = {MakeEntry(id, "step0", "succeeded", 3000, Json{{"ok", true}})};
    b.effects = {MakeEffect(id, "step0", "key-" + id, 3000)};
    if (id == "saga-2") b.fence_epoch = lease->epoch;
    ControlReadback back;
    back.read = true;  // stale from an earlier use: the call sets it
    back.pending = MakeControl(id, "pause", "stale", 1);
    STORE_ASSERT_OK(this->store().CommitReadingControl(b, &back));
    Result<SagaRecord> rec = this->store().LoadSaga(id);
    STORE_ASSERT_OK(rec);
    EXPECT_EQ("running", rec->summary.state);
    Result<std::vector<EffectRecord>> effects = this->store().ListEffects(id);
    STORE_ASSERT_OK(effects);
    EXPECT_EQ(1u, effects->size());
    Result<std::optional<ControlRequest>> now = controls->PendingControl(id);
    STORE_ASSERT_OK(now);
    if (back.read) {
      ASSERT_EQ(now->has_value(), back.pending.has_value());
      if (back.pending.has_value()) {
        EXPECT_EQ((*now)->request_id, back.pending->request_id);
        EXPECT_EQ("cancel", back.pending->kind);
        EXPECT_EQ("ops", back.pending->by);
        EXPECT_EQ("reason of rq-1", back.pending->reason);
        EXPECT_EQ(2000, back.pending->requested_ms);
      }
    } else {
      EXPECT_FALSE(back.pending.has_value()) << "nothing read, nothing answered";
    }
  }

  // Fenced on an epoch the saga has left: refused, nothing read or written.
  WriteBatch stale;
  stale.saga_id = "saga-2";
  stale.fence_epoch = lease->epoch + 1;
  stale.journal = {MakeEntry("saga-2", "step1", "stale", 4000)};
  ControlReadback back;
  back.read = true;
  back.pending = MakeControl("saga-2", "pause", "stale", 1);
  EXPECT_EQ(Code::kAborted, this->store().CommitReadingControl(stale, &back).code());
  EXPECT_FALSE(back.read);
  EXPECT_FALSE(back.pending.has_value());
  Result<std::vector<JournalEntry>> journal = this->store().ReadJournal("saga-2");
  STORE_ASSERT_OK(journal);
  for (const JournalEntry& e : *journal) EXPECT_NE("stale", e.event);
}

TYPED_TEST_P(StoreConformanceTest, ControlRequestsFollowOneRuleAndSurviveReopen) {
  ASSERT_NE(this->store().Controls(), nullptr);
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  ControlStore* c = this->store().Controls();
  Result<std::optional<ControlRequest>> none = c->PendingControl("saga-1");
  STORE_ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());

  // pause, then pause again: one request, one journal entry.
  Result<ControlOutcome> pause = c->RequestControl(MakeControl("saga-1", "pause", "rq-1", 2000));
  STORE_ASSERT_OK(pause);
  EXPECT_TRUE(pause->recorded);
  Result<ControlOutcome> again = c->RequestControl(MakeControl("saga-1", "pause", "rq-2", 2001));
  STORE_ASSERT_OK(again);
  EXPECT_FALSE(again->recorded);
  EXPECT_EQ("rq-1", again->pending.request_id);
  // resume replaces the pending pause; cancel replaces the resume; nothing
  // replaces a cancel.
  Result<ControlOutcome> resume = c->RequestControl(MakeControl("saga-1", "resume", "rq-3", 2002));
  STORE_ASSERT_OK(resume);
  EXPECT_TRUE(resume->recorded);
  Result<ControlOutcome> cancel = c->RequestControl(MakeControl("saga-1", "cancel", "rq-4", 2003));
  STORE_ASSERT_OK(cancel);
  EXPECT_TRUE(cancel->recorded);
  for (const char* kind : {"pause", "resume", "cancel"}) {
    Result<ControlOutcome> late = c->RequestControl(MakeControl("saga-1", kind, "rq-5", 2004));
    STORE_ASSERT_OK(late);
    EXPECT_FALSE(late->recorded) << kind;
    EXPECT_EQ("cancel", late->pending.kind);
    EXPECT_EQ("rq-4", late->pending.request_id);
  }
  STORE_ASSERT_OK(c->RequestControl(MakeControl("saga-2", "pause", "rq-6", 1500)));

  ASSERT_NO_FATAL_FAILURE(this->Reopen());
  c = this->store().Controls();
  Result<std::optional<ControlRequest>> pending = c->PendingControl("saga-1");
  STORE_ASSERT_OK(pending);
  ASSERT_TRUE(pending->has_value());
  EXPECT_EQ("saga-1", (*pending)->saga_id);
  EXPECT_EQ("rq-4", (*pending)->request_id);
  EXPECT_EQ("cancel", (*pending)->kind);
  EXPECT_EQ("ops", (*pending)->by);
  EXPECT_EQ("reason of rq-4", (*pending)->reason);
  EXPECT_EQ(2003, (*pending)->requested_ms);
  Result<std::vector<ControlRequest>> all = c->ListControls(10);
  STORE_ASSERT_OK(all);
  ASSERT_EQ(2u, all->size());
  EXPECT_EQ("saga-2", (*all)[0].saga_id) << "oldest first";
  EXPECT_EQ("saga-1", (*all)[1].saga_id);
  Result<std::vector<ControlRequest>> one = c->ListControls(1);
  STORE_ASSERT_OK(one);
  EXPECT_EQ(1u, one->size());
  EXPECT_EQ(Code::kInvalidArgument, c->ListControls(0).status().code());

  // The journal holds every recorded request, in order, and no other.
  Result<std::vector<JournalEntry>> journal = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  std::vector<std::string> events;
  for (const JournalEntry& e : *journal) events.push_back(e.event);
  EXPECT_EQ((std::vector<std::string>{"saga_created", "pause_requested", "resume_requested",
                                      "cancel_requested"}),
            events);
  EXPECT_EQ((Json{{"by", "ops"}, {"reason", "reason of rq-4"}, {"request", "rq-4"}}),
            journal->back().data);
  EXPECT_EQ(2003, journal->back().at_ms);

  // Settling another (older) request id leaves the pending one; its own id
  // removes it, and settling again is OK.
  STORE_EXPECT_OK(c->SettleControl("saga-1", "rq-3"));
  EXPECT_TRUE(c->PendingControl("saga-1")->has_value());
  STORE_EXPECT_OK(c->SettleControl("saga-1", "rq-4"));
  EXPECT_FALSE(c->PendingControl("saga-1")->has_value());
  STORE_EXPECT_OK(c->SettleControl("saga-1", "rq-4"));
  // After a settle, a new request of any kind is recorded.
  Result<ControlOutcome> next = c->RequestControl(MakeControl("saga-1", "pause", "rq-7", 3000));
  STORE_ASSERT_OK(next);
  EXPECT_TRUE(next->recorded);
}

TYPED_TEST_P(StoreConformanceTest, ControlRequestsAreCheckedAndNeedTheSaga) {
  ControlStore* c = this->store().Controls();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Code::kNotFound,
            c->RequestControl(MakeControl("absent", "cancel", "rq-1", 1)).status().code());
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  Result<ControlOutcome> bad = c->RequestControl(MakeControl("saga-1", "stop", "rq-1", 1));
  EXPECT_EQ(Code::kInvalidArgument, bad.status().code());
  EXPECT_NE(std::string::npos, bad.status().message().find("kind \"stop\""))
      << bad.status().message();
  ControlRequest nobody = MakeControl("saga-1", "cancel", "rq-1", 1);
  nobody.by.clear();
  EXPECT_EQ(Code::kInvalidArgument, c->RequestControl(nobody).status().code());
  EXPECT_FALSE(c->PendingControl("saga-1")->has_value()) << "nothing written";
  EXPECT_EQ(1u, this->store().ReadJournal("saga-1")->size());
}

TYPED_TEST_P(StoreConformanceTest, ConcurrentCancelsFromTwoConnectionsRecordOne) {
  Result<std::unique_ptr<Store>> second = this->factory_.Open();
  STORE_ASSERT_OK(second);
  ASSERT_NE((*second)->Controls(), nullptr);
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  ControlStore* sides[2] = {this->store().Controls(), (*second)->Controls()};
  std::atomic<int> recorded{0};
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int attempt = 0; attempt < 50; ++attempt) {
        Result<ControlOutcome> r = sides[t % 2]->RequestControl(
            MakeControl("saga-1", "cancel", "rq-" + std::to_string(t), 1000 + t));
        if (!r.ok() &&
            (r.status().code() == Code::kUnavailable || r.status().code() == Code::kAborted)) {
          SleepMs(5);
          continue;
        }
        if (r.ok()) ++(r->recorded ? recorded : answered);
        return;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(1, recorded.load());
  EXPECT_EQ(7, answered.load());
  Result<std::vector<JournalEntry>> journal = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  EXPECT_EQ(2u, journal->size()) << "saga_created and one cancel_requested";
}

// Asynchronous completion (migration 11): a step check is written with its
// batch, read back, listed when due (only for sagas in the asked state),
// replaced, removed, and survives a reopen.
TYPED_TEST_P(StoreConformanceTest, StepChecksAreWrittenWithTheBatchAndListedWhenDue) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  auto wait = [&](const std::string& saga, int64_t next, int checks) {
    StepRecord step = this->FirstStep(saga);
    step.state = "processing";
    WriteBatch b;
    b.saga_id = saga;
    b.saga_state = "awaiting_completion";
    b.steps = {step};
    b.journal = {MakeEntry(saga, "step0", "processing", 2000)};
    b.checks = {StepCheck{"step0", next, 100'000, checks, 2000}};
    return this->store().Commit(b);
  };
  STORE_ASSERT_OK(wait("saga-1", 5'000, 0));
  STORE_ASSERT_OK(wait("saga-2", 9'000, 3));
  Result<std::vector<StepCheck>> checks = this->store().ListStepChecks("saga-2");
  STORE_ASSERT_OK(checks);
  ASSERT_EQ(1u, checks->size());
  EXPECT_EQ("step0", (*checks)[0].step_id);
  EXPECT_EQ(9'000, (*checks)[0].next_check_ms);
  EXPECT_EQ(100'000, (*checks)[0].deadline_ms);
  EXPECT_EQ(3, (*checks)[0].checks);
  EXPECT_EQ(2'000, (*checks)[0].since_ms);

  Result<std::vector<DueCheck>> due = this->store().ListDueChecks("awaiting_completion", 4'999, 10);
  STORE_ASSERT_OK(due);
  EXPECT_TRUE(due->empty());
  due = this->store().ListDueChecks("awaiting_completion", 9'000, 10);
  STORE_ASSERT_OK(due);
  ASSERT_EQ(2u, due->size());
  EXPECT_EQ("saga-1", (*due)[0].saga_id);  // earliest first
  EXPECT_EQ(5'000, (*due)[0].next_check_ms);
  due = this->store().ListDueChecks("awaiting_completion", 9'000, 1);
  STORE_ASSERT_OK(due);
  EXPECT_EQ(1u, due->size());
  due = this->store().ListDueChecks("running", 9'000, 10);
  STORE_ASSERT_OK(due);
  EXPECT_TRUE(due->empty()) << "only sagas in the asked state";
  EXPECT_THAT(this->store().ListDueChecks("awaiting_completion", 9'000, 0),
              test::StatusIs(Code::kInvalidArgument));

  STORE_ASSERT_OK(wait("saga-1", 7'000, 1));  // replaced, not added
  checks = this->store().ListStepChecks("saga-1");
  STORE_ASSERT_OK(checks);
  ASSERT_EQ(1u, checks->size());
  EXPECT_EQ(7'000, (*checks)[0].next_check_ms);

  this->Reopen();
  checks = this->store().ListStepChecks("saga-1");
  STORE_ASSERT_OK(checks);
  EXPECT_EQ(1u, checks->size());

  // The step settles: its check goes in the same batch.
  WriteBatch done;
  done.saga_id = "saga-1";
  done.saga_state = "running";
  done.journal = {MakeEntry("saga-1", "step0", "succeeded", 8000)};
  done.checks_done = {"step0"};
  STORE_ASSERT_OK(this->store().Commit(done));
  checks = this->store().ListStepChecks("saga-1");
  STORE_ASSERT_OK(checks);
  EXPECT_TRUE(checks->empty());
  due = this->store().ListDueChecks("awaiting_completion", 1'000'000, 10);
  STORE_ASSERT_OK(due);
  ASSERT_EQ(1u, due->size());
  EXPECT_EQ("saga-2", (*due)[0].saga_id);

  // A check without a step id is refused, and nothing of its batch lands.
  WriteBatch bad;
  bad.saga_id = "saga-2";
  bad.journal = {MakeEntry("saga-2", "step0", "processing", 9000)};
  bad.checks = {StepCheck{"", 1, 1, 0, 1}};
  const size_t before = this->JournalSize("saga-2");  // saga_created, processing
  EXPECT_THAT(this->store().Commit(bad), test::StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(before, this->JournalSize("saga-2"));
  EXPECT_EQ(2u, before);
}

// The drift job's records: effects listed across sagas since a time, and a
// finding recorded once with its journal entry.
TYPED_TEST_P(StoreConformanceTest, EffectsSinceAndDriftFindingsRecordedOnce) {
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-1", "intent-1")));
  STORE_ASSERT_OK(this->store().CreateIntent(MakeSaga("saga-2", "intent-2")));
  for (const auto& [saga, at] :
       std::vector<std::pair<std::string, int64_t>>{{"saga-1", 1000}, {"saga-2", 3000}}) {
    WriteBatch b;
    b.saga_id = saga;
    b.journal = {MakeEntry(saga, "step0", "succeeded", at)};
    b.effects = {MakeEffect(saga, "step0", saga + "/step0", at)};
    STORE_ASSERT_OK(this->store().Commit(b));
  }
  Result<std::vector<EffectRecord>> since = this->store().ListEffectsSince(2000, 10);
  STORE_ASSERT_OK(since);
  ASSERT_EQ(1u, since->size());
  EXPECT_EQ("saga-2/step0", (*since)[0].idempotency_key);
  EXPECT_EQ("saga-2", (*since)[0].saga_id);
  since = this->store().ListEffectsSince(0, 10);
  STORE_ASSERT_OK(since);
  ASSERT_EQ(2u, since->size());
  EXPECT_EQ("saga-1/step0", (*since)[0].idempotency_key);  // oldest first

  DriftFinding f;
  f.kind = "effect_missing";
  f.tool = "rooms.book";
  f.key = "saga-1/step0";
  f.saga_id = "saga-1";
  f.step_id = "step0";
  f.detail = "the provider answers not_applied";
  f.found_ms = 5000;
  EXPECT_THAT(this->store().RecordDrift(f), test::IsOkAndHolds(true));
  EXPECT_THAT(this->store().RecordDrift(f), test::IsOkAndHolds(false));
  Result<std::vector<JournalEntry>> journal = this->store().ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  ASSERT_EQ(3u, journal->size());
  EXPECT_EQ("drift", journal->back().event);
  EXPECT_EQ("step0", journal->back().step_id);
  EXPECT_EQ("effect_missing", journal->back().data["kind"]);
  // An orphan of no saga: the finding alone.
  DriftFinding orphan = f;
  orphan.kind = "orphan";
  orphan.key = "nobody/step0";
  orphan.saga_id = "";
  orphan.step_id = "";
  EXPECT_THAT(this->store().RecordDrift(orphan), test::IsOkAndHolds(true));
  EXPECT_THAT(this->store().RecordDrift(orphan), test::IsOkAndHolds(false));
  DriftFinding bad = f;
  bad.kind = "weird";
  EXPECT_THAT(this->store().RecordDrift(bad), test::StatusIs(Code::kInvalidArgument));
}

// ---- retention (storage/prune.h)

/// Finishes `saga_id` in `state` at `at_ms`: step0 with personal data in its
/// arguments and result, its effect, a consumed token, journal entries.
inline WriteBatch FinishWithData(const SagaRecord& rec, const std::string& state, int64_t at_ms) {
  WriteBatch b;
  b.saga_id = rec.summary.saga_id;
  b.saga_state = state;
  StepRecord st = rec.steps[0];
  st.state = "succeeded";
  st.attempt = 1;
  st.args = Json{{"passenger", {{"name", "Ana"}, {"passport", "X123"}}}, {"seats", 1}};
  st.result = Json{{"booking", "B-1"}, {"card_number", "4242"}};
  st.phase = Json{{"preview", {{"summary", "book for Ana"}, {"passport", "X123"}}}};
  b.steps = {st};
  b.journal = {
      MakeEntry(b.saga_id, "step0", "submitted", at_ms - 1, Json{{"attempt", 1}, {"key", "k"}}),
      MakeEntry(b.saga_id, "step0", "succeeded", at_ms,
                Json{{"attempt", 1}, {"result", st.result}})};
  EffectRecord eff = MakeEffect(b.saga_id, "step0", b.saga_id + "/step0", at_ms);
  eff.result = st.result;
  b.effects = {eff};
  b.consume_token = "nonce-" + b.saga_id;
  b.consume_token_step = "step0";
  return b;
}

inline PruneRequest PruneBefore(int64_t cutoff_ms, std::vector<std::string> redact = {}) {
  PruneRequest r;
  r.finished_before_ms = cutoff_ms;
  r.states = {"succeeded", "compensated", "failed", "cancelled"};
  r.redact = std::move(redact);
  r.now_ms = 9'000;
  return r;
}

TYPED_TEST_P(StoreConformanceTest, PruneRemovesFinishedSagasDataAndKeepsTheIntent) {
  Store& s = this->store();
  for (const char* id : {"saga-old", "saga-live", "saga-new"}) {
    STORE_ASSERT_OK(s.CreateIntent(MakeSaga(id, std::string("intent-") + id)));
  }
  Result<SagaRecord> live_before = s.LoadSaga("saga-live");
  STORE_ASSERT_OK(live_before);
  STORE_ASSERT_OK(s.Commit(FinishWithData(*s.LoadSaga("saga-old"), "succeeded", 2000)));
  STORE_ASSERT_OK(s.Commit(FinishWithData(*live_before, "running", 2000)));  // not finished
  STORE_ASSERT_OK(s.Commit(FinishWithData(*s.LoadSaga("saga-new"), "failed", 8000)));  // recent
  Result<SagaRecord> live = s.LoadSaga("saga-live");
  Result<SagaRecord> recent = s.LoadSaga("saga-new");
  STORE_ASSERT_OK(live);
  STORE_ASSERT_OK(recent);
  const size_t live_journal = this->JournalSize("saga-live");

  Result<PruneReport> report = s.Prune(PruneBefore(5000));
  STORE_ASSERT_OK(report);
  EXPECT_EQ((std::vector<std::string>{"saga-old"}), report->saga_ids);
  EXPECT_EQ(2, report->steps);
  EXPECT_EQ(1, report->journal_entries);  // `succeeded` carried the result
  EXPECT_EQ(1, report->effects);
  EXPECT_EQ(1, report->tokens);
  EXPECT_EQ(1, report->batches);

  ASSERT_NO_FATAL_FAILURE(this->Reopen());
  Store& t = this->store();
  Result<SagaRecord> old = t.LoadSaga("saga-old");
  STORE_ASSERT_OK(old);
  EXPECT_EQ("succeeded", old->summary.state);
  EXPECT_EQ(9000, old->summary.pruned_at_ms);
  EXPECT_EQ(Json::object(), old->input);
  EXPECT_TRUE(old->steps[0].args.is_null());
  EXPECT_TRUE(old->steps[0].result.is_null());
  EXPECT_EQ("succeeded", old->steps[0].state);
  EXPECT_EQ(MakeSaga("saga-old", "x").spec, old->spec) << "the spec is kept";
  Result<std::vector<EffectRecord>> effects = t.ListEffects("saga-old");
  STORE_ASSERT_OK(effects);
  ASSERT_EQ(1u, effects->size());
  EXPECT_TRUE((*effects)[0].result.is_null());
  EXPECT_EQ("ext-saga-old/step0", (*effects)[0].external_ref) << "the effect itself is kept";
  Result<std::vector<JournalEntry>> journal = t.ReadJournal("saga-old");
  STORE_ASSERT_OK(journal);
  std::vector<std::string> events;
  for (const JournalEntry& e : *journal) events.push_back(e.event);
  EXPECT_EQ((std::vector<std::string>{"saga_created", "submitted", "succeeded", "saga_pruned"}),
            events);
  EXPECT_TRUE((*journal)[2].data["result"].is_null());
  EXPECT_EQ(1, (*journal)[2].data["attempt"]);
  EXPECT_EQ((Json{{"mode", "all"}}), journal->back().data);
  EXPECT_EQ(journal->back().data.dump().find("4242"), std::string::npos);

  // Live and recent sagas are untouched.
  Result<SagaRecord> live_after = t.LoadSaga("saga-live");
  STORE_ASSERT_OK(live_after);
  EXPECT_EQ(0, live_after->summary.pruned_at_ms);
  EXPECT_EQ(live->input, live_after->input);
  EXPECT_EQ(live->steps[0].args, live_after->steps[0].args);
  EXPECT_EQ(live->steps[0].result, live_after->steps[0].result);
  EXPECT_EQ(live_journal, this->JournalSize("saga-live"));
  Result<SagaRecord> recent_after = t.LoadSaga("saga-new");
  STORE_ASSERT_OK(recent_after);
  EXPECT_EQ(0, recent_after->summary.pruned_at_ms);
  EXPECT_EQ(recent->steps[0].result, recent_after->steps[0].result);

  // The intent still answers: same content, the same saga; other content, a conflict.
  NewSaga same = MakeSaga("saga-retry", "intent-saga-old");
  Result<CreateOutcome> again = t.CreateIntent(same);
  STORE_ASSERT_OK(again);
  EXPECT_FALSE(again->created);
  EXPECT_EQ("saga-old", again->saga_id);
  NewSaga other = MakeSaga("saga-other", "intent-saga-old");
  other.input = Json{{"city", "Porto"}};
  other.fingerprint = Fingerprint(Json{{"spec", other.spec}, {"input", other.input}});
  EXPECT_EQ(Code::kConflict, t.CreateIntent(other).status().code());

  // Idempotent: nothing left to prune.
  Result<PruneReport> twice = t.Prune(PruneBefore(5000));
  STORE_ASSERT_OK(twice);
  EXPECT_TRUE(twice->saga_ids.empty());
  EXPECT_EQ(0, twice->batches);
  EXPECT_EQ(events.size(), this->JournalSize("saga-old"));
}

TYPED_TEST_P(StoreConformanceTest, PruneRedactsOnlyTheNamedFieldsAtAnyDepth) {
  Store& s = this->store();
  NewSaga n = MakeSaga("saga-1", "intent-1");
  n.input = Json{{"city", "Lisbon"}, {"traveller", {{"passport", "X123"}, {"name", "Ana"}}}};
  STORE_ASSERT_OK(s.CreateIntent(n));
  STORE_ASSERT_OK(s.Commit(FinishWithData(*s.LoadSaga("saga-1"), "compensated", 2000)));
  Result<PruneReport> report = s.Prune(PruneBefore(5000, {"passport", "card_number"}));
  STORE_ASSERT_OK(report);
  ASSERT_EQ(1u, report->saga_ids.size());
  Result<SagaRecord> rec = s.LoadSaga("saga-1");
  STORE_ASSERT_OK(rec);
  EXPECT_EQ(9000, rec->summary.pruned_at_ms);
  EXPECT_EQ((Json{{"city", "Lisbon"}, {"traveller", {{"passport", kRedacted}, {"name", "Ana"}}}}),
            rec->input);
  EXPECT_EQ((Json{{"passenger", {{"name", "Ana"}, {"passport", kRedacted}}}, {"seats", 1}}),
            rec->steps[0].args);
  EXPECT_EQ((Json{{"booking", "B-1"}, {"card_number", kRedacted}}), rec->steps[0].result);
  EXPECT_EQ(kRedacted, rec->steps[0].phase["preview"]["passport"]);
  EXPECT_EQ("book for Ana", rec->steps[0].phase["preview"]["summary"]);
  Result<std::vector<EffectRecord>> effects = s.ListEffects("saga-1");
  STORE_ASSERT_OK(effects);
  EXPECT_EQ((Json{{"booking", "B-1"}, {"card_number", kRedacted}}), (*effects)[0].result);
  Result<std::vector<JournalEntry>> journal = s.ReadJournal("saga-1");
  STORE_ASSERT_OK(journal);
  EXPECT_EQ((Json{{"booking", "B-1"}, {"card_number", kRedacted}}), (*journal)[2].data["result"]);
  EXPECT_EQ((Json{{"mode", "redact"}, {"fields", {"passport", "card_number"}}}),
            journal->back().data);
  // The step row is still readable: nothing else changed.
  EXPECT_EQ("succeeded", rec->steps[0].state);
  EXPECT_EQ(1, rec->steps[0].attempt);
}

TYPED_TEST_P(StoreConformanceTest, PruneDryRunWritesNothingAndBatchesAreBounded) {
  Store& s = this->store();
  for (int i = 0; i < 5; ++i) {
    const std::string id = "saga-" + std::to_string(i);
    STORE_ASSERT_OK(s.CreateIntent(MakeSaga(id, "intent-" + id)));
    STORE_ASSERT_OK(s.Commit(FinishWithData(*s.LoadSaga(id), "succeeded", 2000 + i)));
  }
  PruneRequest dry = PruneBefore(5000);
  dry.dry_run = true;
  Result<PruneReport> counted = s.Prune(dry);
  STORE_ASSERT_OK(counted);
  EXPECT_EQ(5u, counted->saga_ids.size());
  EXPECT_EQ(10, counted->steps);
  EXPECT_EQ(5, counted->tokens);
  EXPECT_EQ(0, counted->batches);
  for (int i = 0; i < 5; ++i) {
    Result<SagaRecord> rec = s.LoadSaga("saga-" + std::to_string(i));
    STORE_ASSERT_OK(rec);
    EXPECT_EQ(0, rec->summary.pruned_at_ms);
    EXPECT_FALSE(rec->steps[0].result.is_null());
    EXPECT_EQ(3u, this->JournalSize("saga-" + std::to_string(i)));
  }
  PruneRequest batched = PruneBefore(5000);
  batched.batch_sagas = 2;
  Result<PruneReport> done = s.Prune(batched);
  STORE_ASSERT_OK(done);
  EXPECT_EQ(5u, done->saga_ids.size());
  EXPECT_EQ(3, done->batches) << "2 + 2 + 1";
  PruneRequest bad = PruneBefore(5000);
  bad.batch_sagas = 0;
  EXPECT_EQ(Code::kInvalidArgument, s.Prune(bad).status().code());
  bad = PruneBefore(5000);
  bad.states.clear();
  EXPECT_EQ(Code::kInvalidArgument, s.Prune(bad).status().code());
}

REGISTER_TYPED_TEST_SUITE_P(
    StoreConformanceTest, CreateIntentCreatesSaga,
    ClaimAndLoadAnswersWhatClaimLoadAndPendingControlWould,
    CommitReadingControlWritesAndReadsWhatPendingControlWould,
    ABatchCreatesItsSagaWithItsFirstWriteInOneTransaction,
    ABatchThatCreatesASubmittedIntentKeyWritesNothing,
    ABatchThatCreatesItsSagaIsCheckedBeforeAnythingIsWritten,
    SameKeySameFingerprintReturnsExistingAndWritesNothing,
    SameKeyOtherFingerprintConflictsAndWritesNothing, StepKeyInUseConflictsAndWritesNothing,
    LoadSagaRoundTripsEveryField, MissingSagaIsNotFound, CommitWritesStateStepsJournalAndEffects,
    CommitWithStateAndNoJournalStampsUpdatedTime, CommitWithDuplicateEffectKeyWritesNothing,
    CommitToMissingSagaIsNotFound, JournalSeqIncreasesInCommitOrder,
    ListSagasNewestFirstFilteredAndLimited, ListEffectsInCommitOrder, SchemaVersionSurvivesReopen,
    DataSurvivesReopen, ConcurrentCommitsAllLand, ConcurrentCreatesOfOneIntentMakeOneSaga,
    TwoPhaseDataRoundTrips, TokenNonceIsConsumedOnceAndASecondUseWritesNothing,
    ConcurrentConsumersOfOneNonceHaveOneWinner, ClaimTakesRunnableSagasOldestFirstUpToTheLimit,
    ClaimRejectsBadArguments, ExpiredLeaseIsTakenOverAndTheOldOwnerIsFenced,
    RenewedLeaseHoldsAndMissingSagaIsNotFound, ReleasedLeaseIsClaimableAtOnce,
    CommitCanReleaseItsLease, ClaimSagaById, GaugesCountSagasByStateLeasesAndWaitingSteps,
    ConcurrentClaimersNeverShareASaga, KeyIsClaimedOnceThenInFlightAndOtherPayloadMismatches,
    StoredResponseIsReplayedAndSurvivesReopen, ReleasedKeyIsClaimableAgain,
    AbandonedClaimIsTakenOverAndTheOldHolderIsFenced,
    RenewedClaimOutlivesTheLockTimeoutAndAnUnrenewedOneIsTakenOver,
    ExpiredKeyStartsANewRequestAndIsPurged, ConcurrentClaimsOfOneKeyFromTwoConnectionsHaveOneWinner,
    SpecVersionsAreStoredOnceAndNeverChange, ConcurrentPutsOfOneSpecVersionHaveOneWinner,
    ControlRequestsFollowOneRuleAndSurviveReopen, ControlRequestsAreCheckedAndNeedTheSaga,
    ConcurrentCancelsFromTwoConnectionsRecordOne, PruneRemovesFinishedSagasDataAndKeepsTheIntent,
    PruneRedactsOnlyTheNamedFieldsAtAnyDepth, PruneDryRunWritesNothingAndBatchesAreBounded,
    StepChecksAreWrittenWithTheBatchAndListedWhenDue, EffectsSinceAndDriftFindingsRecordedOnce);

}  // namespace idem::storage::conformance
