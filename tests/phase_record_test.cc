// PhaseRecord: the typed phase of a two-phase step reads and writes the
// stored JSON unchanged (journals written before it load and round-trip).

#include <gtest/gtest.h>

#include "preview_commit/phase.h"

namespace idem::preview_commit {
namespace {

// A phase as the engine stored it before PhaseRecord existed.
Json StoredPhase() {
  return {
      {"preview",
       {{"summary", "charge EUR 10"}, {"changes", {{"amount", 10}}}, {"resource_version", "v3"}}},
      {"token", "idem1.payload.mac"},
      {"nonce", "0123456789abcdef0123456789abcdef"},
      {"expires_ms", int64_t{1'700'000'060'000}},
      {"args_fingerprint", "sha256:abc"},
      {"previews", 2}};
}

TEST(PhaseRecordTest, RoundTripsTheStoredTextByteForByte) {
  Json stored = StoredPhase();
  auto rec = PhaseRecord::FromJson(stored);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->ToJson().dump(), stored.dump());

  stored["approval"] = {
      {"decision", "approved"}, {"by", "maria"}, {"note", "ok"}, {"at_ms", int64_t{5}}};
  rec = PhaseRecord::FromJson(stored);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->ToJson().dump(), stored.dump());
}

TEST(PhaseRecordTest, ReadsEveryMember) {
  Json stored = StoredPhase();
  stored["approval"] = {
      {"decision", "rejected"}, {"by", "maria"}, {"note", "too much"}, {"at_ms", int64_t{5}}};
  auto rec = PhaseRecord::FromJson(stored);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->preview.summary, "charge EUR 10");
  EXPECT_EQ(rec->preview.changes, Json({{"amount", 10}}));
  EXPECT_EQ(rec->preview.resource_version, "v3");
  EXPECT_EQ(rec->token, "idem1.payload.mac");
  EXPECT_EQ(rec->nonce, "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(rec->expires_ms, 1'700'000'060'000);
  EXPECT_EQ(rec->args_fingerprint, "sha256:abc");
  EXPECT_EQ(rec->previews, 2);
  ASSERT_TRUE(rec->approval.has_value());
  EXPECT_FALSE(rec->approval->approved());
  EXPECT_EQ(rec->approval->by, "maria");
  EXPECT_EQ(rec->approval->note, "too much");
  EXPECT_EQ(rec->approval->at_ms, 5);
}

TEST(PhaseRecordTest, NoPhaseIsNoRecord) {
  EXPECT_FALSE(PhaseRecord::FromJson(Json()).has_value());
  EXPECT_FALSE(PhaseRecord::FromJson(Json::array()).has_value());
}

TEST(PhaseRecordTest, SettledOnceDecidedOrExpired) {
  auto rec = PhaseRecord::FromJson(StoredPhase());
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->Settled(rec->expires_ms - 1));
  EXPECT_TRUE(rec->Settled(rec->expires_ms));
  rec->approval = ApprovalRecord{ApprovalRecord::kApproved, "maria", "", 1, ""};
  EXPECT_TRUE(rec->Settled(0));
}

}  // namespace
}  // namespace idem::preview_commit
