// A drive that throws (a tool, here) parks its saga needs_attention with
// the reason through the journal, and neither Run, Work nor Recover lets
// the exception out of its thread.

#include <atomic>
#include <filesystem>
#include <stdexcept>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"

#include "common/clock.h"

namespace idem {
namespace {

namespace fs = std::filesystem;

// A tool whose client throws out of Invoke (FunctionTool would turn the
// exception into an unknown outcome; a Tool of its own need not).
class ThrowingTool : public Tool {
 public:
  explicit ThrowingTool(std::atomic<int>* calls) : calls_(calls) {
    info_.name = "boom.do";
    info_.effect = EffectClass::kWrite;
    info_.honours_keys = true;
  }
  const ToolInfo& info() const override { return info_; }
  ToolOutcome Invoke(const ToolCall&) override {
    ++*calls_;
    throw std::runtime_error("provider client blew up");
  }

 private:
  ToolInfo info_;
  std::atomic<int>* calls_;
};

class EngineFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("idem_fault_" + NewId(""));
    fs::create_directories(dir_);
    auto store = storage::OpenStore((dir_ / "journal.db").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    ASSERT_TRUE(tools_.Register(std::make_unique<ThrowingTool>(&calls_)).ok());
    Json doc = {{"name", "boom"},
                {"steps",
                 {{{"id", "only"},
                   {"tool", "boom.do"},
                   {"args", Json::object()},
                   {"compensate", nullptr},
                   {"reason", "test"}}}}};
    auto spec = ParseSpec(doc, tools_);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec_ = *spec;
  }
  void TearDown() override { fs::remove_all(dir_); }

  EngineOptions Options(bool use_leases) {
    EngineOptions o;
    o.clock = &clock_;
    o.use_leases = use_leases;
    o.owner = "engine-1";
    return o;
  }

  void ExpectParked(const std::string& saga_id) {
    auto rec = store_->LoadSaga(saga_id);
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->summary.state, "needs_attention");
    EXPECT_NE(rec->summary.reason.find("provider client blew up"), std::string::npos)
        << rec->summary.reason;
    auto journal = store_->ReadJournal(saga_id);
    ASSERT_TRUE(journal.ok());
    ASSERT_FALSE(journal->empty());
    EXPECT_EQ(journal->back().event, "saga_needs_attention");
  }

  fs::path dir_;
  ManualClock clock_;
  std::unique_ptr<storage::Store> store_;
  ToolRegistry tools_;
  SagaSpec spec_;
  std::atomic<int> calls_{0};
};

TEST_F(EngineFaultTest, RunParksTheSagaWithTheReason) {
  Engine engine(store_.get(), &tools_, Options(false));
  auto sub = engine.Submit(spec_, Json::object(), "k1");
  ASSERT_TRUE(sub.ok());
  auto rec = engine.Run(sub->saga_id);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), Code::kInternal);
  EXPECT_NE(rec.status().message().find("provider client blew up"), std::string::npos);
  ExpectParked(sub->saga_id);
  EXPECT_EQ(calls_, 1);
}

TEST_F(EngineFaultTest, WorkerParksTheSagaReleasesTheLeaseAndGoesOn) {
  std::atomic<bool> stop{false};
  EngineOptions o = Options(true);
  o.stop = &stop;
  Engine engine(store_.get(), &tools_, o);
  auto sub = engine.Submit(spec_, Json::object(), "k1");
  ASSERT_TRUE(sub.ok());
  WorkerOptions w;
  w.concurrency = 2;
  w.poll_ms = 1;
  Status done;
  w.on_done = [&](const std::string&, const Status& s) {
    done = s;
    stop = true;
  };
  EXPECT_TRUE(engine.Work(w).ok());
  EXPECT_EQ(done.code(), Code::kInternal);
  ExpectParked(sub->saga_id);
  // The park gave the lease up: another owner claims the saga at once.
  EXPECT_TRUE(store_->ClaimSaga(sub->saga_id, "engine-2", 30'000).ok());
}

TEST_F(EngineFaultTest, RecoveryReportsTheSagaAndGoesOn) {
  Engine engine(store_.get(), &tools_, Options(false));
  auto a = engine.Submit(spec_, Json::object(), "k1");
  auto b = engine.Submit(spec_, Json::object(), "k2");
  ASSERT_TRUE(a.ok() && b.ok());
  auto report = engine.Recover(2);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->resumed, 2);
  EXPECT_EQ(report->errors.size(), 2u);
  ExpectParked(a->saga_id);
  ExpectParked(b->saga_id);
}

}  // namespace
}  // namespace idem
