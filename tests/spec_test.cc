#include "saga/spec.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "tools/tool.h"

#include <dirent.h>

namespace idem {
namespace {

std::unique_ptr<ToolRegistry> MakeRegistry() {
  auto registry = std::make_unique<ToolRegistry>();
  struct Entry {
    const char* name;
    EffectClass effect;
    bool honours_keys;
  };
  const std::vector<Entry> entries = {
      {"flights.reserve", EffectClass::kWrite, true},
      {"flights.cancel", EffectClass::kIdempotent, false},
      {"hotels.book", EffectClass::kWrite, false},
      {"hotels.cancel", EffectClass::kIdempotent, false},
      {"cars.rent", EffectClass::kWrite, false},
      {"cars.return", EffectClass::kIdempotent, false},
      {"payments.charge", EffectClass::kWrite, false},
      {"payments.refund", EffectClass::kIdempotent, false},
      {"weather.lookup", EffectClass::kRead, false},
      {"email.send", EffectClass::kIrreversible, false},
  };
  for (const Entry& e : entries) {
    ToolInfo info;
    info.name = e.name;
    info.effect = e.effect;
    info.honours_keys = e.honours_keys;
    Status s = registry->Register(std::make_unique<FunctionTool>(
        info, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); }));
    EXPECT_OK(s);
  }
  // Key retention (saga/step_key.h): a provider that keeps keys 24 h, with a
  // preview for two-phase steps, and a compensation that keeps them 1 min.
  ToolInfo capture{"payments.capture", EffectClass::kWrite, true, false, true, 24 * 3600 * 1000};
  EXPECT_OK(registry->Register(std::make_unique<FunctionTool>(
      capture, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); }, nullptr,
      [](const ToolCall&) {
        PreviewOutcome o;
        o.ok = true;
        return o;
      })));
  // An asynchronous provider (saga/completion.h): it finishes within a 2 h
  // window but keeps keys only 1 h.
  ToolInfo visa{"visas.apply", EffectClass::kWrite, true, true, false, 3600 * 1000};
  visa.completion.accepts = true;
  visa.completion.window_ms = 2 * 3600 * 1000;
  EXPECT_OK(registry->Register(std::make_unique<FunctionTool>(
      visa, [](const ToolCall&) { return ToolOutcome::Accepted("v-1", 0); },
      [](const std::string&) {
        LookupOutcome o;
        o.kind = LookupKind::kPending;
        return o;
      })));
  ToolInfo release{"payments.release", EffectClass::kIdempotent, true, false, false, 60 * 1000};
  EXPECT_OK(registry->Register(std::make_unique<FunctionTool>(
      release, [](const ToolCall&) { return ToolOutcome::Succeeded(Json::object()); })));
  return registry;
}

const ToolRegistry& Registry() {
  static const ToolRegistry* registry = MakeRegistry().release();
  return *registry;
}

constexpr const char* kTripSpec = R"json({
  "name": "trip",
  "version": 3,
  "description": "Book a trip",
  "steps": [
    {"id": "check_weather", "tool": "weather.lookup", "args": {"city": "${input.to}"}},
    {
      "id": "reserve_flight",
      "tool": "flights.reserve",
      "args": {"from": "${input.from}", "to": "${input.to}", "seats": "${input.seats}"},
      "compensate": {
        "tool": "flights.cancel",
        "args": {"reservation_id": "${steps.reserve_flight.result.reservation_id}"}
      }
    },
    {
      "id": "book_hotel",
      "tool": "hotels.book",
      "args": {"city": "${input.to}", "near": "${steps.reserve_flight.result.airport}",
               "guests": ["${input.lead}", {"nights": "${steps.check_weather.args.city}"}]},
      "retry": {"max_attempts": 1},
      "compensate": {
        "tool": "hotels.cancel",
        "args": {"booking": "${steps.book_hotel.result.booking_id}"},
        "retry": {"max_attempts": 20, "initial_backoff_ms": 50, "max_backoff_ms": 60000}
      }
    },
    {
      "id": "charge",
      "tool": "payments.charge",
      "args": {"amount": "${input.amount}", "memo": "trip to ${input.to}"},
      "retry": {"initial_backoff_ms": 250, "max_backoff_ms": 1000},
      "compensate": {"tool": "payments.refund", "args": {"charge_id": "${steps.charge.result.id}"}}
    },
    {
      "id": "confirm",
      "tool": "email.send",
      "args": {"to": "${input.email}", "body": "Flight ${steps.reserve_flight.result.reservation_id}, $${literal}"},
      "compensate": null,
      "reason": "an email cannot be unsent",
      "approval": "none"
    }
  ]
})json";

/// `a` + "/" + `b`.
std::string Slash(std::string a, const std::string& b) {
  a += '/';
  a += b;
  return a;
}

using test::ReadFile;

// ---- parsing a good spec

TEST(SpecTest, GoodSpecParses) {
  Result<SagaSpec> r = ParseSpecText(kTripSpec, Registry(), "trip.json");
  ASSERT_OK(r);
  const SagaSpec& spec = *r;
  EXPECT_EQ(spec.name, "trip");
  EXPECT_EQ(spec.version, 3);
  EXPECT_EQ(spec.description, "Book a trip");
  ASSERT_EQ(spec.steps.size(), 5u);
  EXPECT_EQ(spec.raw, Json::parse(kTripSpec));

  const StepSpec& weather = spec.steps[0];
  EXPECT_EQ(weather.id, "check_weather");
  EXPECT_EQ(weather.tool, "weather.lookup");
  EXPECT_EQ(weather.effect, EffectClass::kRead);
  EXPECT_EQ(weather.args, Json({{"city", "${input.to}"}}));
  EXPECT_EQ(weather.retry.max_attempts, RetryPolicy::DefaultFor(EffectClass::kRead).max_attempts);
  EXPECT_FALSE(weather.compensate.has_value());
  EXPECT_EQ(weather.no_compensation_reason, "");

  const StepSpec& flight = spec.steps[1];
  EXPECT_EQ(flight.effect, EffectClass::kWrite);
  EXPECT_EQ(flight.retry.max_attempts, 2);
  EXPECT_EQ(flight.retry.initial_backoff_ms, 100);
  EXPECT_EQ(flight.retry.max_backoff_ms, 5000);
  ASSERT_TRUE(flight.compensate.has_value());
  EXPECT_EQ(flight.compensate->tool, "flights.cancel");
  EXPECT_EQ(flight.compensate->args["reservation_id"],
            "${steps.reserve_flight.result.reservation_id}");
  EXPECT_EQ(flight.compensate->retry.max_attempts, RetryPolicy::DefaultCompensation().max_attempts);

  const StepSpec& hotel = spec.steps[2];
  EXPECT_EQ(hotel.retry.max_attempts, 1);  // override
  EXPECT_EQ(hotel.retry.initial_backoff_ms, 100);
  ASSERT_TRUE(hotel.compensate.has_value());
  EXPECT_EQ(hotel.compensate->retry.max_attempts, 20);
  EXPECT_EQ(hotel.compensate->retry.initial_backoff_ms, 50);
  EXPECT_EQ(hotel.compensate->retry.max_backoff_ms, 60000);

  const StepSpec& charge = spec.steps[3];
  EXPECT_EQ(charge.retry.max_attempts, 2);
  EXPECT_EQ(charge.retry.initial_backoff_ms, 250);
  EXPECT_EQ(charge.retry.max_backoff_ms, 1000);

  const StepSpec& confirm = spec.steps[4];
  EXPECT_EQ(confirm.effect, EffectClass::kIrreversible);
  EXPECT_FALSE(confirm.compensate.has_value());
  EXPECT_EQ(confirm.no_compensation_reason, "an email cannot be unsent");
  EXPECT_EQ(confirm.no_approval_reason, "an email cannot be unsent");
}

TEST(SpecTest, DefaultsWhenOmitted) {
  Result<SagaSpec> r = ParseSpec(
      Json::parse(R"({"name": "x", "steps": [{"id": "a", "tool": "cars.return"}]})"), Registry());
  ASSERT_OK(r);
  EXPECT_EQ(r->version, 1);
  EXPECT_EQ(r->description, "");
  ASSERT_EQ(r->steps.size(), 1u);
  EXPECT_EQ(r->steps[0].args, Json::object());
  EXPECT_EQ(r->steps[0].effect, EffectClass::kIdempotent);
  EXPECT_EQ(r->steps[0].retry.max_attempts,
            RetryPolicy::DefaultFor(EffectClass::kIdempotent).max_attempts);
  EXPECT_FALSE(r->steps[0].compensate.has_value());
}

TEST(SpecTest, CompensationOnIdempotentToolAndCapsAtTheLimit) {
  Result<SagaSpec> r = ParseSpec(Json::parse(R"({"name": "x", "steps": [
      {"id": "a", "tool": "cars.return", "retry": {"max_attempts": 10},
       "compensate": {"tool": "cars.rent", "retry": {"max_attempts": 20}}}]})"),
                                 Registry());
  ASSERT_OK(r);
  EXPECT_EQ(r->steps[0].retry.max_attempts, 10);
  ASSERT_TRUE(r->steps[0].compensate.has_value());
  EXPECT_EQ(r->steps[0].compensate->args, Json::object());
  EXPECT_EQ(r->steps[0].compensate->retry.max_attempts, 20);
}

TEST(SpecTest, RefusesNonObjectsAndDeepDocuments) {
  Result<SagaSpec> r = ParseSpec(Json(42), Registry());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "spec: expected object, got integer");

  Json deep = Json::array();
  for (int i = 0; i < 200; ++i) deep = Json::array({deep});
  Json doc = Json::parse(R"({"name": "x", "steps": [{"id": "a", "tool": "weather.lookup"}]})");
  doc["steps"][0]["args"] = {{"deep", deep}};
  r = ParseSpec(doc, Registry());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "spec: nested deeper than 64 levels");
}

TEST(SpecTest, SchemaTextIsTheSchemaFile) {
  EXPECT_EQ(SagaSchemaText(), ReadFile(IDEM_SOURCE_DIR "/schema/saga.schema.json"));
  Json schema = Json::parse(SagaSchemaText());
  EXPECT_EQ(schema["$schema"], "http://json-schema.org/draft-07/schema#");
}

TEST(SpecTest, FingerprintIgnoresKeyOrderAndWhitespace) {
  Result<SagaSpec> a = ParseSpecText(
      R"({"name":"x","steps":[{"id":"a","tool":"weather.lookup","args":{"p":1,"q":[1,2]}}]})",
      Registry());
  Result<SagaSpec> b = ParseSpecText(R"(
    {
      "steps": [ { "args": { "q": [ 1, 2 ], "p": 1 }, "tool": "weather.lookup", "id": "a" } ],
      "name": "x"
    }
  )",
                                     Registry());
  Result<SagaSpec> c = ParseSpecText(
      R"({"name":"x","steps":[{"id":"a","tool":"weather.lookup","args":{"p":1,"q":[2,1]}}]})",
      Registry());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(Fingerprint(a->raw), Fingerprint(b->raw));
  EXPECT_NE(Fingerprint(a->raw), Fingerprint(c->raw));
}

TEST(SpecTest, ParsesConcurrently) {
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&failures] {
      for (int i = 0; i < 50; ++i) {
        if (!ParseSpecText(kTripSpec, Registry()).ok()) ++failures;
        Result<SagaSpec> bad =
            ParseSpecText(R"({"name": "x", "steps": [{"id": "A"}]})", Registry());
        if (bad.ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(SpecTest, LongValuesAreRefusedAndCutInMessages) {
  Json doc = Json::parse(R"({"name": "x", "steps": [{"id": "a", "tool": "weather.lookup"}]})");
  doc["steps"][0]["id"] = std::string(1 << 20, 'a');
  Result<SagaSpec> r = ParseSpec(doc, Registry());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "steps[0].id: \"" + std::string(80, 'a') +
                                      "...\" does not match ^[a-z][a-z0-9_]{0,63}$");

  doc["steps"][0]["id"] = "a";
  doc["steps"][0]["tool"] = std::string(1 << 20, 'b');
  r = ParseSpec(doc, Registry());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "steps[0].tool: unknown tool \"" + std::string(80, 'b') + "...\"");
}

// ---- templates

Json TripContext() {
  return Json::parse(R"({
    "input": {"to": "Lisbon", "seats": 2, "vip": true, "tags": ["a", "b"], "none": null},
    "steps": {
      "reserve_flight": {
        "args": {"to": "Lisbon"},
        "result": {"reservation_id": "R-17", "legs": [{"no": "TP123"}, {"no": "TP456"}]}
      }
    }
  })");
}

TEST(ResolveTemplatesTest, WholeValueKeepsItsType) {
  Json templ = {{"seats", "${input.seats}"},
                {"vip", "${input.vip}"},
                {"tags", "${input.tags}"},
                {"none", "${input.none}"},
                {"flight", "${steps.reserve_flight.result}"},
                {"leg", "${steps.reserve_flight.result.legs.1.no}"}};
  Result<Json> r = ResolveTemplates(templ, TripContext(), "steps[1].args");
  ASSERT_OK(r);
  EXPECT_EQ((*r)["seats"], 2);
  EXPECT_EQ((*r)["vip"], true);
  EXPECT_EQ((*r)["tags"], Json::array({"a", "b"}));
  EXPECT_TRUE((*r)["none"].is_null());
  EXPECT_EQ((*r)["flight"]["reservation_id"], "R-17");
  EXPECT_EQ((*r)["leg"], "TP456");
}

TEST(ResolveTemplatesTest, EmbeddedReferencesBecomeText) {
  Json templ = {{"memo", "to ${input.to} for ${input.seats}: ${input.tags} ${input.vip}"},
                {"ref", "[${steps.reserve_flight.result.reservation_id}]"},
                {"two", "${input.to}${input.to}"}};
  Result<Json> r = ResolveTemplates(templ, TripContext(), "args");
  ASSERT_OK(r);
  EXPECT_EQ((*r)["memo"], "to Lisbon for 2: [\"a\",\"b\"] true");
  EXPECT_EQ((*r)["ref"], "[R-17]");
  EXPECT_EQ((*r)["two"], "LisbonLisbon");
}

TEST(ResolveTemplatesTest, NestedArraysAndObjects) {
  Json templ = Json::parse(R"({
    "a": [1, "${input.to}", {"b": ["${steps.reserve_flight.args.to}", null, 2.5]}],
    "c": {"d": {"e": "${input.seats}"}}, "n": 7, "t": true
  })");
  Result<Json> r = ResolveTemplates(templ, TripContext(), "args");
  ASSERT_OK(r);
  EXPECT_EQ(*r, Json::parse(R"({
    "a": [1, "Lisbon", {"b": ["Lisbon", null, 2.5]}],
    "c": {"d": {"e": 2}}, "n": 7, "t": true
  })"));
}

TEST(ResolveTemplatesTest, EscapedDollarBraceIsLiteral) {
  Json templ = {{"a", "$${input.to}"}, {"b", "cost $$5 and $${x} then ${input.to}"}, {"c", "$"}};
  Result<Json> r = ResolveTemplates(templ, TripContext(), "args");
  ASSERT_OK(r);
  EXPECT_EQ((*r)["a"], "${input.to}");
  EXPECT_EQ((*r)["b"], "cost $$5 and ${x} then Lisbon");
  EXPECT_EQ((*r)["c"], "$");
}

TEST(ResolveTemplatesTest, MissingValueIsAnError) {
  Json templ = {{"flight", {{"to", "${input.to}"}, {"from", "${input.from}"}}}};
  Result<Json> r = ResolveTemplates(templ, TripContext(), "steps[1].args");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "steps[1].args.flight.from: \"${input.from}\" has no value");

  r = ResolveTemplates(Json::array({"x", "${steps.pay.result.id}"}), TripContext(), "args");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "args[1]: \"${steps.pay.result.id}\" has no value");

  r = ResolveTemplates("${input.tags.5}", TripContext(), "args");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "args: \"${input.tags.5}\" has no value");
}

TEST(ResolveTemplatesTest, MalformedTemplatesAreErrors) {
  Result<Json> r = ResolveTemplates({{"a", "hello ${input.to"}}, TripContext(), "args");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "args.a: unterminated \"${\" in \"hello ${input.to\"");
  r = ResolveTemplates({{"a", "${input..to}"}}, TripContext(), "args");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "args.a: bad reference \"${input..to}\"");
}

// ---- the bad-spec corpus

std::vector<std::string> ListJsonFiles(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

TEST(BadSpecCorpusTest, EveryFileFailsWithItsExpectedMessage) {
  const std::string dir = IDEM_SOURCE_DIR "/tests/bad_specs";
  std::map<std::string, std::string> expected;
  std::ifstream in(dir + "/expected.txt");
  ASSERT_TRUE(in) << "cannot read " << dir << "/expected.txt";
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << "expected.txt:" << line_no << ": no tab";
    std::string name = line.substr(0, tab);
    EXPECT_TRUE(expected.emplace(name, line.substr(tab + 1)).second)
        << "expected.txt:" << line_no << ": " << name << " listed twice";
  }

  std::vector<std::string> files = ListJsonFiles(dir);
  EXPECT_GE(files.size(), 30u);
  std::set<std::string> seen;
  for (const std::string& name : files) {
    seen.insert(name);
    auto it = expected.find(name);
    if (it == expected.end()) {
      ADD_FAILURE() << name << " has no line in expected.txt";
      continue;
    }
    Result<SagaSpec> r = ParseSpecText(ReadFile(Slash(dir, name)), Registry(), name);
    if (r.ok()) {
      ADD_FAILURE() << name << " parsed, expected: " << it->second;
      continue;
    }
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << name;
    EXPECT_EQ(r.status().message(), it->second) << name;
  }
  for (const auto& [name, message] : expected) {
    EXPECT_TRUE(seen.count(name) == 1) << "expected.txt names " << name << ", which is missing";
  }
}

// ---- robustness

/// Every node of `v` (pre-order), as JSON pointers.
void CollectPointers(const Json& v, const std::string& at, std::vector<std::string>* out) {
  out->push_back(at);
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      std::string key;
      for (char c : it.key()) {
        if (c == '~') {
          key += "~0";
        } else if (c == '/') {
          key += "~1";
        } else {
          key += c;
        }
      }
      CollectPointers(it.value(), Slash(at, key), out);
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) CollectPointers(v[i], at + "/" + std::to_string(i), out);
  }
}

Json RandomValue(std::mt19937_64& rng) {
  static const std::vector<Json> values = {
      nullptr,
      true,
      0,
      -1,
      3,
      1000000000000LL,
      18446744073709551615ULL,
      1.5,
      "",
      "x",
      "${",
      "${}",
      "$${input.a}",
      "${input.a",
      "${steps.reserve_flight.result.x}",
      "${steps.confirm.result}",
      "${steps.nope.args}",
      "${env.HOME}",
      "flights.cancel",
      "weather.lookup",
      "reserve_flight",
      std::string(300, 'a'),
      "\xc3\xa9t\xc3\xa9",
      Json::array(),
      Json::array({1, "${input.x}"}),
      Json::object(),
      Json({{"tool", "hotels.cancel"}}),
      Json({{"max_attempts", 3}}),
  };
  return values[rng() % values.size()];
}

std::string Mutate(const std::string& text, const Json& doc, std::mt19937_64& rng) {
  static const std::string bytes = "{}[]\",:0123456789-+.eE$ \\ntfa\x01\xff";
  switch (rng() % 8) {  // half of the mutations keep the JSON well-formed
    case 0: {           // flip bits of a byte
      std::string t = text;
      if (!t.empty()) {
        size_t at = rng() % t.size();
        t[at] = static_cast<char>(static_cast<unsigned char>(t[at]) ^ (1 + rng() % 255));
      }
      return t;
    }
    case 1: {  // delete a run of bytes
      std::string t = text;
      if (!t.empty()) {
        size_t at = rng() % t.size();
        t.erase(at, 1 + rng() % 8);
      }
      return t;
    }
    case 2: {  // insert a byte
      std::string t = text;
      t.insert(t.begin() + static_cast<long>(rng() % (t.size() + 1)), bytes[rng() % bytes.size()]);
      return t;
    }
    case 3: {  // truncate
      return text.substr(0, rng() % (text.size() + 1));
    }
    default: {  // replace or delete a value
      Json d = doc;
      std::vector<std::string> pointers;
      CollectPointers(d, "", &pointers);
      std::string ptr = pointers[rng() % pointers.size()];
      if (ptr.empty()) return RandomValue(rng).dump();
      Json::json_pointer jp(ptr);
      if (rng() % 4 == 0) {
        Json& parent = d[jp.parent_pointer()];
        if (parent.is_object()) {
          parent.erase(jp.back());
        } else if (parent.is_array()) {
          parent.erase(static_cast<size_t>(std::stoul(jp.back())));
        }
      } else {
        d[jp] = RandomValue(rng);
      }
      return d.dump(rng() % 2 == 0 ? -1 : 2);
    }
  }
}

TEST(SpecRobustnessTest, RandomMutationsNeverCrash) {
  uint64_t seed = 20261130;
  if (const char* env = std::getenv("IDEM_SPEC_FUZZ_SEED")) seed = std::strtoull(env, nullptr, 10);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (set IDEM_SPEC_FUZZ_SEED to replay)");
  std::mt19937_64 rng(seed);
  const std::string base = kTripSpec;
  const Json base_doc = Json::parse(base);
  const Json context = TripContext();
  int ok = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string text = base;
    int rounds = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < rounds; ++k) {
      Json doc = Json::parse(text, nullptr, false);
      text = Mutate(text, doc.is_discarded() ? base_doc : doc, rng);
    }
    Result<SagaSpec> r = ParseSpecText(text, Registry(), "mutant.json");
    if (r.ok()) {
      ++ok;
      for (const StepSpec& step : r->steps) {
        Result<Json> args = ResolveTemplates(step.args, context, "args");
        if (!args.ok()) {
          EXPECT_EQ(args.status().code(), Code::kInvalidArgument);
          EXPECT_FALSE(args.status().message().empty());
        }
      }
      continue;
    }
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument)
        << "iteration " << i << ": " << r.status().ToString() << "\n"
        << text;
    EXPECT_FALSE(r.status().message().empty()) << "iteration " << i << "\n" << text;
    if (HasFailure()) break;
  }
  // The mutations should leave some specs valid, or they test only the parser.
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace idem
