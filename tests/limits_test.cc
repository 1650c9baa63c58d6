// Bounded sagas (issue 12, item 7; saga/limits.h): the step count, the size
// of one call's resolved arguments and the saga's total size, checked at
// Submit before anything is written, and again before a step whose arguments
// depend on an earlier result is journaled. A real SQLite journal file and
// in-process tools that count their calls.

#include "saga/limits.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include <gtest/gtest.h>

#include "saga/engine.h"
#include "saga/spec.h"
#include "storage/store.h"
#include "tests/test_util.h"

namespace idem {
namespace {

namespace fs = std::filesystem;
using test::StatusIs;
using ::testing::HasSubstr;

// Tools that count calls; "make_blob" answers a result of `blob_bytes`.
struct Calls {
  std::mutex mu;
  std::map<std::string, int> by_tool;
  size_t blob_bytes = 0;
  int Of(const std::string& tool) {
    std::lock_guard<std::mutex> lock(mu);
    return by_tool[tool];
  }
};

void AddTool(ToolRegistry* tools, Calls* calls, const std::string& name, EffectClass effect) {
  ToolInfo info;
  info.name = name;
  info.effect = effect;
  info.honours_keys = true;
  ASSERT_OK(tools->Register(std::make_unique<FunctionTool>(info, [calls, name](const ToolCall&) {
    std::lock_guard<std::mutex> lock(calls->mu);
    calls->by_tool[name]++;
    Json result = {{"ok", true}};
    if (name == "make_blob") result["blob"] = std::string(calls->blob_bytes, 'b');
    return ToolOutcome::Succeeded(result, name);
  })));
}

uintmax_t FileBytes(const std::string& path) {
  std::error_code ec;
  uintmax_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AddTool(&tools_, &calls_, "send", EffectClass::kWrite);
    AddTool(&tools_, &calls_, "unsend", EffectClass::kWrite);
    AddTool(&tools_, &calls_, "make_blob", EffectClass::kWrite);
    ASSERT_OK_AND_ASSIGN(store_, db_.Open());
    engine_ = std::make_unique<Engine>(store_.get(), &tools_, EngineOptions{});
  }

  SagaSpec Parse(const Json& doc) {
    auto spec = ParseSpec(doc, tools_);
    EXPECT_OK(spec);
    return spec.ok() ? *spec : SagaSpec{};
  }

  // The journal's bytes on disk: the database file and its WAL.
  uintmax_t JournalBytes() { return FileBytes(db_.path()) + FileBytes(db_.path() + "-wal"); }

  size_t SagaCount() {
    auto all = store_->ListSagas({});
    EXPECT_OK(all);
    return all.ok() ? all->size() : 0;
  }

  static Json Step(const std::string& id, const std::string& tool, Json args) {
    return {{"id", id},
            {"tool", tool},
            {"args", std::move(args)},
            {"compensate", {{"tool", "unsend"}, {"args", {{"id", id}}}}}};
  }

  Calls calls_;
  ToolRegistry tools_;
  test::SqliteTestStore db_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<Engine> engine_;
};

// The reproduction: 20,000 uses of a 10 KB input field (a 372 KB request)
// would resolve to a 200 MB argument. Refused at Submit, naming the place,
// with nothing written: the journal's size and its saga count are unchanged.
TEST_F(LimitsTest, AmplifiedArgumentIsRefusedBeforeAnythingIsWritten) {
  Json uses = Json::array();
  for (int i = 0; i < 20'000; ++i) uses.push_back("${input.note}");
  SagaSpec spec = Parse({{"name", "amplify"}, {"steps", {Step("s", "send", {{"items", uses}})}}});
  Json input = {{"note", std::string(10'000, 'n')}};
  EXPECT_GT(spec.raw.dump().size() + input.dump().size(), 300'000u);  // the request's size

  const uintmax_t before = JournalBytes();
  ASSERT_EQ(SagaCount(), 0u);
  auto out = engine_->Submit(spec, input, "amplify-1");
  EXPECT_THAT(out, StatusIs(Code::kInvalidArgument, "steps[0].args.items["));
  EXPECT_THAT(out.status().message(), HasSubstr("max_arg_bytes (1048576 bytes per call)"));
  EXPECT_EQ(JournalBytes(), before);
  EXPECT_EQ(SagaCount(), 0u);
  EXPECT_EQ(calls_.Of("send"), 0);
}

// An embedded template grows a string: the same bound, stopping in the string.
TEST_F(LimitsTest, InterpolatedStringPastTheBoundIsRefused) {
  std::string body;
  for (int i = 0; i < 200; ++i) body += "line ${input.note}\n";
  SagaSpec spec = Parse({{"name", "text"}, {"steps", {Step("mail", "send", {{"body", body}})}}});
  auto out = engine_->Submit(spec, {{"note", std::string(10'000, 'n')}}, "text-1");
  EXPECT_THAT(out, StatusIs(Code::kInvalidArgument,
                            "steps[0].args.body: resolved arguments exceed max_arg_bytes"));
  EXPECT_EQ(SagaCount(), 0u);
}

// Within the bounds nothing changes: the same shape, small, runs.
TEST_F(LimitsTest, SagaWithinTheBoundsRuns) {
  Json uses = Json::array();
  for (int i = 0; i < 50; ++i) uses.push_back("${input.note}");
  SagaSpec spec = Parse({{"name", "small"}, {"steps", {Step("s", "send", {{"items", uses}})}}});
  ASSERT_OK_AND_ASSIGN(auto sub, engine_->Submit(spec, {{"note", std::string(10'000, 'n')}}, "ok"));
  ASSERT_OK_AND_ASSIGN(auto rec, engine_->Run(sub.saga_id));
  EXPECT_EQ(rec.summary.state, "succeeded");
  EXPECT_EQ(calls_.Of("send"), 1);
}

TEST_F(LimitsTest, StepCountIsBounded) {
  auto spec_of = [](int n) {
    Json steps = Json::array();
    for (int i = 0; i < n; ++i)
      steps.push_back(Step("s" + std::to_string(i), "send", Json::object()));
    return Json{{"name", "many"}, {"steps", steps}};
  };
  // The default is the schema's own cap, which ParseSpec enforces first.
  EXPECT_EQ(EngineOptions{}.limits.max_steps, 100);
  EXPECT_FALSE(ParseSpec(spec_of(101), tools_).ok());
  EngineOptions options;
  options.limits.max_steps = 10;
  Engine strict(store_.get(), &tools_, options);
  auto over = strict.Submit(Parse(spec_of(11)), Json::object(), "many-11");
  EXPECT_THAT(over, StatusIs(Code::kInvalidArgument, "steps: 11 steps, more than max_steps (10)"));
  EXPECT_EQ(SagaCount(), 0u);
  EXPECT_OK(strict.Submit(Parse(spec_of(10)), Json::object(), "many-10"));
  EXPECT_OK(engine_->Submit(Parse(spec_of(100)), Json::object(), "many-100"));
  EXPECT_EQ(SagaCount(), 2u);
}

// Each call is within max_arg_bytes, but together the arguments pass
// max_saga_bytes: the step where the total crosses it is named.
TEST_F(LimitsTest, TotalSagaSizeIsBounded) {
  Json steps = Json::array();
  for (int i = 0; i < 12; ++i) {
    steps.push_back(Step("s" + std::to_string(i), "send", {{"copy", "${input.part}"}}));
  }
  SagaSpec spec = Parse({{"name", "total"}, {"steps", steps}});
  Json input = {{"part", std::string(900'000, 'p')}};  // 0.9 MB: each call fits
  auto out = engine_->Submit(spec, input, "total-1");
  // input + 8 copies = 8.1 MB < 8 MiB (8.39 MB); the ninth copy crosses it.
  EXPECT_THAT(out, StatusIs(Code::kInvalidArgument,
                            "steps[8].args.copy: resolved arguments exceed "
                            "what max_saga_bytes"));
  EXPECT_EQ(SagaCount(), 0u);

  // The bounds are options: a smaller saga bound refuses earlier.
  EngineOptions small;
  small.limits.max_saga_bytes = 2'000'000;
  Engine strict(store_.get(), &tools_, small);
  EXPECT_THAT(strict.Submit(spec, input, "total-2"),
              StatusIs(Code::kInvalidArgument, "steps[1].args.copy"));
}

// An argument that grows from a step's result is known only when the step
// runs: it is refused before its `submitted` write, so the tool is never
// called; the step fails and the saga rolls back what it did.
TEST_F(LimitsTest, ArgumentGrownFromAResultIsRefusedBeforeTheCall) {
  calls_.blob_bytes = 600'000;  // one copy fits in 1 MiB, two do not
  SagaSpec spec =
      Parse({{"name", "grow"},
             {"steps",
              {Step("make", "make_blob", {{"n", 1}}),
               Step("send", "send",
                    {{"a", "${steps.make.result.blob}"}, {"b", "${steps.make.result.blob}"}})}}});
  ASSERT_OK_AND_ASSIGN(auto sub, engine_->Submit(spec, Json::object(), "grow-1"));
  ASSERT_OK_AND_ASSIGN(auto rec, engine_->Run(sub.saga_id));

  EXPECT_EQ(calls_.Of("make_blob"), 1);
  EXPECT_EQ(calls_.Of("send"), 0);
  EXPECT_EQ(calls_.Of("unsend"), 1);  // step make's effect was undone
  EXPECT_EQ(rec.summary.state, "compensated");
  ASSERT_EQ(rec.steps.size(), 2u);
  EXPECT_EQ(rec.steps[1].state, "failed");
  EXPECT_THAT(rec.steps[1].error,
              HasSubstr("steps[1].args.b: resolved arguments exceed max_arg_bytes"));
  ASSERT_OK_AND_ASSIGN(auto journal, store_->ReadJournal(sub.saga_id));
  for (const auto& e : journal) {
    EXPECT_FALSE(e.step_id == "send" && e.event == "submitted") << "the refused step was journaled";
  }
}

// A reference the input cannot answer is not a limit's business: Submit
// records the saga, and the step parks on the missing value when it runs
// (saga/park.h: no drive will find it, a person decides).
TEST_F(LimitsTest, MissingInputIsTheStepsErrorNotTheLimits) {
  SagaSpec spec =
      Parse({{"name", "missing"}, {"steps", {Step("s", "send", {{"to", "${input.who}"}})}}});
  ASSERT_OK_AND_ASSIGN(auto sub, engine_->Submit(spec, Json::object(), "missing-1"));
  ASSERT_OK_AND_ASSIGN(auto rec, engine_->Run(sub.saga_id));
  EXPECT_EQ(rec.steps[0].state, "needs_attention");
  EXPECT_THAT(rec.steps[0].error, HasSubstr("${input.who}\" has no value"));
  EXPECT_EQ(calls_.Of("send"), 0);
}

TEST(JsonBytesTest, CountsCompactTextAndStopsEarly) {
  EXPECT_EQ(JsonBytes(Json("abc")), 5u);
  for (const char* text : {R"({"a":[1,"x"],"b":{}})", "[true,false,null,[]]", R"({"k":-1.5})"}) {
    EXPECT_EQ(JsonBytes(Json::parse(text)), std::string(text).size()) << text;
  }
  Json big = Json::array();
  for (int i = 0; i < 1000; ++i) big.push_back(std::string(1000, 'x'));
  EXPECT_LT(JsonBytes(big, 10'000), 20'000u);  // stopped soon after 10,000
  EXPECT_GT(JsonBytes(big), 1'000'000u);
}

}  // namespace
}  // namespace idem
