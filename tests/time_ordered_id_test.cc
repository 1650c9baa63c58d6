// NewTimeOrderedId (common/time_ordered_id.h): NewId's text format, sorted
// as the times it carries, unique within one millisecond.

#include "common/time_ordered_id.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/json_util.h"

namespace idem {
namespace {

bool SameFormatAsNewId(const std::string& id) {
  const std::string old = NewId("sg_");
  if (id.size() != old.size() || id.rfind("sg_", 0) != 0) return false;
  return std::all_of(id.begin() + 3, id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'); });
}

TEST(TimeOrderedIdTest, HasNewIdsFormatAndCarriesItsTime) {
  const int64_t ms = 1'764'612'345'678;  // 2025-12-01
  const std::string id = NewTimeOrderedId("sg_", ms);
  EXPECT_TRUE(SameFormatAsNewId(id)) << id;
  EXPECT_EQ(ms, TimeOrderedIdMs(id, "sg_"));
  EXPECT_EQ(0, TimeOrderedIdMs(NewTimeOrderedId("sg_", 0), "sg_"));
  const int64_t max48 = (int64_t{1} << 48) - 1;
  EXPECT_EQ(max48, TimeOrderedIdMs(NewTimeOrderedId("sg_", max48), "sg_"));
  EXPECT_EQ(-1, TimeOrderedIdMs("sg_short", "sg_"));
  EXPECT_EQ(-1, TimeOrderedIdMs(id, "op_"));
  std::string bad = id;
  bad[4] = '!';
  EXPECT_EQ(-1, TimeOrderedIdMs(bad, "sg_"));
}

TEST(TimeOrderedIdTest, SortsAsItsTimeAcrossEveryCharacterBoundary) {
  // Times whose encodings differ in each of the first ten characters.
  std::vector<int64_t> times = {0, 1, 2, 3, 31, 32, 1023, 1024};
  for (int bit = 11; bit < 48; bit += 3) times.push_back(int64_t{1} << bit);
  for (int bit = 11; bit < 48; bit += 3) times.push_back((int64_t{1} << bit) - 1);
  std::sort(times.begin(), times.end());
  std::vector<std::string> ids;
  for (int64_t t : times) ids.push_back(NewTimeOrderedId("sg_", t));
  for (size_t i = 1; i < ids.size(); ++i) {
    if (times[i] == times[i - 1]) continue;
    EXPECT_LT(ids[i - 1], ids[i]) << times[i - 1] << " vs " << times[i];
  }
}

TEST(TimeOrderedIdTest, IdsOfOneMillisecondAreDistinctAndShareTheirTimePrefix) {
  std::set<std::string> seen;
  std::set<std::string> random_parts;
  for (int i = 0; i < 10'000; ++i) {
    const std::string id = NewTimeOrderedId("sg_", 1'764'612'345'678);
    EXPECT_EQ(0, id.compare(0, 12, seen.empty() ? id.substr(0, 12) : seen.begin()->substr(0, 12)));
    seen.insert(id);
    random_parts.insert(id.substr(3 + 10));
  }
  EXPECT_EQ(10'000u, seen.size());
  EXPECT_EQ(10'000u, random_parts.size());  // 80 random bits: no repeat here
}

}  // namespace
}  // namespace idem
