#include <gtest/gtest.h>

#include "tests/test_util.h"

#include "common/clock.h"
#include "common/duration.h"
#include "common/failpoint.h"
#include "common/json_util.h"
#include "common/principal_name.h"
#include "common/status.h"
#include "common/utf8.h"

namespace idem {
namespace {

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = Status::Conflict("intent key k: other content");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kConflict);
  EXPECT_EQ(s.ToString(), "conflict: intent key k: other content");
  EXPECT_EQ(Status::Ok().ToString(), "ok");
}

TEST(ResultTest, HoldsValueOrError) {
  Result<int> v = 7;
  ASSERT_OK(v);
  EXPECT_EQ(*v, 7);
  Result<int> e = Status::NotFound("saga x");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kNotFound);
}

TEST(CanonicalJsonTest, KeyOrderAndWhitespaceDoNotMatter) {
  auto a = ParseJson(R"({"b": 1, "a": {"y": [1, 2], "x": "s"}})", "a");
  auto b = ParseJson("{\"a\":{\"x\":\"s\",\"y\":[1,2]},\n \"b\":1}", "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(CanonicalJson(*a), R"({"a":{"x":"s","y":[1,2]},"b":1})");
  EXPECT_EQ(Fingerprint(*a), Fingerprint(*b));
  EXPECT_NE(Fingerprint(Json{{"a", 1}}), Fingerprint(Json{{"a", 2}}));
  // 1 and 1.0 are different numbers in the canonical form.
  EXPECT_NE(Fingerprint(Json{{"a", 1}}), Fingerprint(Json{{"a", 1.0}}));
}

TEST(Sha256Test, KnownVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(ParseJsonTest, NamesThePlaceOfASyntaxError) {
  auto r = ParseJson("{\"a\": 1,}", "trip.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("trip.json: invalid JSON: ", 0), 0u) << r.status().message();
}

TEST(ParseJsonTest, RefusesDeepNestingBeforeParsing) {
  std::string deep(100000, '[');
  auto r = ParseJson(deep, "body");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested deeper than 64"), std::string::npos);
  std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_OK(ParseJson(ok, "body"));
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseJson("\"" + std::string(200, '[') + "\"", "body").ok());
}

TEST(NewIdTest, UniqueAndPrefixed) {
  std::string a = NewId("sg_");
  std::string b = NewId("sg_");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("sg_", 0), 0u);
  EXPECT_EQ(a.size(), 3u + 26u);
}

TEST(ManualClockTest, SleepAdvancesTime) {
  ManualClock c(1000);
  c.SleepMs(250);
  EXPECT_EQ(c.NowMs(), 1250);
  EXPECT_EQ(c.sleeps(), 1);
}

TEST(FailpointTest, UnknownNameIsAnError) {
  Status s = failpoint::Arm("step.after_submited=kill");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown failpoint \"step.after_submited\""), std::string::npos);
}

TEST(FailpointTest, BadActionIsAnError) {
  EXPECT_FALSE(failpoint::Arm("step.after_call=explode").ok());
  EXPECT_FALSE(failpoint::Arm("step.after_call=kill@0").ok());
  EXPECT_FALSE(failpoint::Arm("step.after_call").ok());
}

TEST(FailpointTest, ErrFiresOnTheNthHitOnly) {
  failpoint::DisarmAll();
  ASSERT_TRUE(failpoint::Arm("step.after_call=err@3").ok());
  EXPECT_FALSE(IDEM_FAILPOINT("step.after_call"));
  EXPECT_FALSE(IDEM_FAILPOINT("step.after_call"));
  EXPECT_TRUE(IDEM_FAILPOINT("step.after_call"));
  EXPECT_FALSE(IDEM_FAILPOINT("step.after_call"));
  EXPECT_EQ(failpoint::HitCount("step.after_call"), 4);
  failpoint::DisarmAll();
}

TEST(FailpointDeathTest, KillDiesBySigkill) {
  failpoint::DisarmAll();
  ASSERT_TRUE(failpoint::Arm("saga.after_start=kill").ok());
  EXPECT_EXIT(IDEM_FAILPOINT("saga.after_start"), ::testing::KilledBySignal(SIGKILL), "");
  failpoint::DisarmAll();
}

TEST(DurationTest, ParsesEachUnit) {
  EXPECT_THAT(ParseDurationMs(std::string("30s"), "d"), test::IsOkAndHolds(30'000));
  EXPECT_THAT(ParseDurationMs(std::string("15m"), "d"), test::IsOkAndHolds(900'000));
  EXPECT_THAT(ParseDurationMs(std::string("2h"), "d"), test::IsOkAndHolds(7'200'000));
  EXPECT_THAT(ParseDurationMs(std::string("3d"), "d"), test::IsOkAndHolds(259'200'000));
  EXPECT_THAT(ParseDurationMs(Json(90), "d"), test::IsOkAndHolds(90'000));  // seconds
}

TEST(DurationTest, RefusesWhatIsNotADurationNamingThePlace) {
  for (const char* bad : {"", "s", "15", "1.5h", "-3m", " 3m", "3 m", "3w", "3ms", "1h30m"}) {
    EXPECT_THAT(
        ParseDurationMs(std::string(bad), "tools[0].key_retention"),
        test::StatusIs(Code::kInvalidArgument, "tools[0].key_retention: expected a duration"))
        << bad;
  }
  EXPECT_THAT(ParseDurationMs(Json(-1), "x"), test::StatusIs(Code::kInvalidArgument, "negative"));
  EXPECT_THAT(ParseDurationMs(Json(1.5), "x"),
              test::StatusIs(Code::kInvalidArgument, "x: expected"));
  EXPECT_THAT(ParseDurationMs(std::string("31d"), "ttl", 30LL * 86'400'000),
              test::StatusIs(Code::kInvalidArgument, "ttl: 31d is above the maximum of 30d"));
  EXPECT_THAT(ParseDurationMs(std::string("99999999999999d"), "x"),
              test::StatusIs(Code::kInvalidArgument, "x:"));
}

TEST(DurationTest, FormatsExactly) {
  EXPECT_EQ(FormatDurationMs(0), "0s");
  EXPECT_EQ(FormatDurationMs(86'400'000), "1d");
  EXPECT_EQ(FormatDurationMs(5'400'000), "1h 30m");
  EXPECT_EQ(FormatDurationMs(30LL * 86'400'000 + 100), "30d 100ms");
  EXPECT_EQ(FormatDurationMs(1500), "1s 500ms");
  EXPECT_EQ(FormatDurationMs(-60'000), "-1m");
}

// RFC 3629: every well-formed length, and each way a sequence is not.
TEST(Utf8Test, DecodesWellFormedSequencesAndRefusesTheRest) {
  struct Case {
    std::string text;
    bool ok;
    uint32_t cp;
    size_t next;
  };
  const Case cases[] = {
      {"a", true, 0x61, 1},
      {"\xC3\xA9", true, 0xE9, 2},             // é
      {"\xEF\xBD\x8D", true, 0xFF4D, 3},       // fullwidth m
      {"\xF0\x9F\x98\x80", true, 0x1F600, 4},  // an emoji
      {"\xC0\xAF", false, 0, 0},               // overlong '/'
      {"\xE0\x80\xAF", false, 0, 0},           // overlong, three bytes
      {"\xED\xA0\x80", false, 0, 0},           // a surrogate
      {"\xF4\x90\x80\x80", false, 0, 0},       // above U+10FFFF
      {"\xC3", false, 0, 0},                   // cut short
      {"\xC3\x28", false, 0, 0},               // a bad continuation
      {"\x80", false, 0, 0},                   // a lone continuation
  };
  for (const Case& c : cases) {
    size_t at = 0;
    uint32_t cp = 0;
    EXPECT_EQ(NextCodePoint(c.text, &at, &cp), c.ok) << PrintableText(c.text);
    EXPECT_EQ(at, c.next) << PrintableText(c.text);
    if (c.ok) {
      EXPECT_EQ(cp, c.cp);
    }
  }
}

// One person, one name: what NFKC and case folding make one.
TEST(PrincipalNameTest, NamesThatReadAlikeFoldAlike) {
  EXPECT_EQ(FoldName("Maria"), "maria");
  EXPECT_EQ(FoldName("MARIA"), "maria");
  EXPECT_EQ(FoldName("\xEF\xBD\x8D"
                     "aria"),
            "maria");  // fullwidth m
  EXPECT_EQ(FoldName("\xE2\x84\xAA"
                     "im"),
            "kim");  // Kelvin sign
  EXPECT_EQ(FoldName("Stra\xC3\x9F"
                     "e"),
            FoldName("STRASSE"));                                 // ß
  EXPECT_EQ(FoldName("Zo\xC3\xAB"), FoldName("ZO\x45\xCC\x88"));  // ë, and E + combining diaeresis
  EXPECT_TRUE(SameName("Ana", "ana"));
  EXPECT_FALSE(SameName("ana", "anna"));
  EXPECT_EQ(FoldName("\xC3\x28"), "\xC3\x28") << "not UTF-8: compared as written";
}

TEST(PrincipalNameTest, NamesAreVisibleAndShort) {
  for (const std::string ok : {"maria", "ops-1", "a.b_c", "Zo\xC3\xAB",
                               "\xEF\xBD\x8D"
                               "aria"}) {
    EXPECT_EQ(PrincipalNameProblem(ok), "") << ok;
  }
  for (const std::string& bad :
       {std::string(), std::string(65, 'a'), std::string("ma ria"), std::string("ana:bo"),
        std::string("mar\xE2\x80\x8Bia"),  // zero width space
        std::string("ma\xE2\x80\xAEria"),  // right-to-left override
        std::string("\xC2\xA0maria"),      // no-break space
        std::string("maria\xEF\xB8\x8F"),  // variation selector
        std::string("\xC3\x28")}) {        // not UTF-8
    EXPECT_NE(PrincipalNameProblem(bad), "") << PrintableText(bad);
  }
}

}  // namespace
}  // namespace idem
