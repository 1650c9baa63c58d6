// The effect protocol's decision table (effect/protocol.h), row by row: the
// table in docs/architecture.md ("The effect protocol") is read from the
// document and every row is checked against Decide over every situation it
// matches; every situation must match a row (the table is complete); and
// safety properties that hold whatever the table says are checked over the
// whole space of situations.

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "effect/mutation.h"
#include "effect/protocol.h"

namespace idem::effect {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) {
    part = Trim(part);
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// One row of the documented table, as predicates over a Situation.
struct Row {
  int line = 0;
  std::string text;
  std::set<std::string> kinds;
  std::set<std::string> answers;  // empty: any ("*")
  std::vector<std::string> caps;
  std::vector<std::string> situation;
  std::string action;
  std::string durability;  // "" when the row does not say
  std::string code;
};

std::string KindGroup(CallKind k) {
  switch (k) {
    case CallKind::kAction:
    case CallKind::kCommit:
    case CallKind::kOpenCall:
      return "forward";
    case CallKind::kCompletionCheck:
      return "check";
    default:
      return CallKindName(k);
  }
}

// A token of the capabilities column, with "!" for its negation.
bool CapHolds(const std::string& token, const Capabilities& c) {
  const bool neg = token[0] == '!';
  const std::string t = neg ? token.substr(1) : token;
  bool v = false;
  if (t == "keys") {
    v = c.honours_keys;
  } else if (t == "idem") {
    v = c.idempotent;
  } else if (t == "lookup") {
    v = c.status_lookup;
  } else if (t == "async") {
    v = c.asynchronous;
  } else if (t == "safe") {
    v = c.same_key_safe();
  } else if (t == "settles") {
    v = c.honours_keys || c.status_lookup;
  } else {
    ADD_FAILURE() << "unknown capability token " << token;
  }
  return neg ? !v : v;
}

bool SituationHolds(const std::string& token, const Situation& s) {
  const bool neg = token[0] == '!';
  const std::string t = neg ? token.substr(1) : token;
  bool v = false;
  if (t == "attempts_left") {
    v = s.attempt < s.max_attempts;
  } else if (t == "resends_left") {
    v = s.attempt < std::max(s.max_attempts, 2);
  } else if (t == "absent_resends_left") {
    v = s.attempt < std::max(s.max_attempts, kMaxConfirmedAbsentAttempts);
  } else if (t == "first_attempt") {
    v = s.attempt <= 1;
  } else if (t == "lookups_left") {
    v = s.lookups < s.max_lookups;
  } else if (t == "halted") {
    v = s.halted;
  } else if (t == "can_wait") {
    v = s.can_wait;
  } else if (t == "past_window") {
    v = s.past_window;
  } else if (t == "taken_over") {
    v = s.in_flight == InFlight::kTakenOver;
  } else if (t == "refused") {
    v = s.call == Answer::kFailedRetryable;
  } else {
    ADD_FAILURE() << "unknown situation token " << token;
  }
  return neg ? !v : v;
}

bool Matches(const Row& r, const Situation& s) {
  if (r.kinds.count(KindGroup(s.kind)) == 0) return false;
  if (!r.answers.empty() && r.answers.count(AnswerName(s.answer)) == 0) return false;
  for (const auto& t : r.caps) {
    if (!CapHolds(t, s.caps)) return false;
  }
  for (const auto& t : r.situation) {
    if (!SituationHolds(t, s)) return false;
  }
  return true;
}

std::vector<Row> ReadTable() {
  const std::string path = std::string(IDEM_SOURCE_DIR) + "/docs/architecture.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<Row> rows;
  std::string line;
  bool inside = false;
  int n = 0;
  int cells_seen = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find("<!-- effect-table:begin -->") != std::string::npos) {
      inside = true;
      continue;
    }
    if (line.find("<!-- effect-table:end -->") != std::string::npos) break;
    if (!inside || line.empty() || line[0] != '|') continue;
    std::vector<std::string> cells;
    std::stringstream cs(line.substr(1));
    std::string cell;
    while (std::getline(cs, cell, '|')) cells.push_back(Trim(cell));
    if (!cells.empty() && cells.back().empty()) cells.pop_back();
    if (cells.size() != 7) {
      ADD_FAILURE() << path << ":" << n << ": a row has " << cells.size() << " cells, not 7";
      continue;
    }
    if (cells[0] == "kinds" || cells[0].rfind("---", 0) == 0) {
      ++cells_seen;
      continue;
    }
    Row r;
    r.line = n;
    r.text = line;
    for (const auto& k : Split(cells[0], ',')) r.kinds.insert(k);
    if (cells[1] != "*") {
      for (const auto& a : Split(cells[1], ',')) r.answers.insert(a);
    }
    if (cells[2] != "-") r.caps = Split(cells[2], ',');
    if (cells[3] != "-") r.situation = Split(cells[3], ',');
    r.action = cells[4];
    r.durability = cells[5];
    r.code = cells[6];
    rows.push_back(std::move(r));
  }
  EXPECT_EQ(cells_seen, 2) << "the table's header was not found in " << path;
  return rows;
}

// Every situation the table speaks of: each kind, each mix of capabilities,
// each answer (a lookup's after each uncertain or refused call), each
// in-flight case, attempts and lookups below, at and past their bounds.
void ForEachSituation(const std::function<void(const Situation&)>& fn) {
  const CallKind kinds[] = {CallKind::kAction,       CallKind::kCommit,
                            CallKind::kOpenCall,     CallKind::kCompletionCheck,
                            CallKind::kCompensation, CallKind::kGuardRead,
                            CallKind::kPreview,      CallKind::kDriftCheck};
  const Answer call_answers[] = {
      Answer::kNone,    Answer::kSucceeded, Answer::kFailedRetryable, Answer::kFailedPermanent,
      Answer::kUnknown, Answer::kAccepted};
  const Answer lookup_answers[] = {Answer::kApplied, Answer::kNotApplied, Answer::kPending,
                                   Answer::kFailed, Answer::kLookupError};
  const Answer uncertain_calls[] = {Answer::kUnknown, Answer::kAccepted, Answer::kFailedRetryable};
  const InFlight in_flight[] = {InFlight::kNo, InFlight::kCrashed, InFlight::kTakenOver};
  const int attempts[] = {0, 1, 2, 4, 5, 6};
  const int max_attempts[] = {1, 2, 6};
  const int lookups[] = {0, 1, 2, 3};
  const std::pair<bool, bool> halted_can_wait[] = {{false, true}, {true, true}, {true, false}};
  std::vector<std::pair<Answer, Answer>> answers;  // (call, answer)
  for (Answer a : call_answers) answers.push_back({a, a});
  for (Answer c : uncertain_calls) {
    for (Answer a : lookup_answers) answers.push_back({c, a});
  }
  for (CallKind kind : kinds) {
    for (int caps = 0; caps < 16; ++caps) {
      Capabilities c;
      c.honours_keys = caps & 1;
      c.idempotent = caps & 2;
      c.status_lookup = caps & 4;
      c.asynchronous = caps & 8;
      for (const auto& [call, answer] : answers) {
        for (InFlight f : in_flight) {
          for (int attempt : attempts) {
            for (int max : max_attempts) {
              for (int looked : lookups) {
                for (const auto& [halted, can_wait] : halted_can_wait) {
                  for (int past = 0; past <= (kind == CallKind::kCompletionCheck ? 1 : 0); ++past) {
                    Situation s;
                    s.kind = kind;
                    s.caps = c;
                    s.call = call;
                    s.answer = answer;
                    s.in_flight = f;
                    s.attempt = attempt;
                    s.max_attempts = max;
                    s.lookups = looked;
                    s.max_lookups = 3;
                    s.halted = halted;
                    s.can_wait = can_wait;
                    s.past_window = past == 1;
                    fn(s);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

std::string Describe(const Situation& s) {
  std::ostringstream o;
  o << CallKindName(s.kind) << " answer=" << AnswerName(s.answer) << " call=" << AnswerName(s.call)
    << " keys=" << s.caps.honours_keys << " idem=" << s.caps.idempotent
    << " lookup=" << s.caps.status_lookup << " in_flight=" << static_cast<int>(s.in_flight)
    << " attempt=" << s.attempt << "/" << s.max_attempts << " lookups=" << s.lookups << "/"
    << s.max_lookups << " halted=" << s.halted << " can_wait=" << s.can_wait
    << " past_window=" << s.past_window;
  return o.str();
}

TEST(EffectProtocolTest, EveryRowOfTheDocumentedTableHoldsAndEverySituationHasARow) {
  const std::vector<Row> rows = ReadTable();
  ASSERT_GT(rows.size(), 40u);
  std::vector<long> hits(rows.size(), 0);
  long situations = 0;
  int failures = 0;
  ForEachSituation([&](const Situation& s) {
    ++situations;
    auto row = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return Matches(r, s); });
    if (row == rows.end()) {
      if (++failures <= 20) ADD_FAILURE() << "no row of the table matches " << Describe(s);
      return;
    }
    ++hits[row - rows.begin()];
    const Decision d = Decide(s);
    std::string durability;
    if (d.action == Action::kRecordSucceeded) {
      durability = d.durability == Durability::kNow ? "now" : "next flush";
    }
    const bool same = ActionName(d.action) == row->action && d.code == row->code &&
                      (row->durability.empty() || row->durability == durability);
    if (!same && ++failures <= 20) {
      ADD_FAILURE() << "docs/architecture.md:" << row->line << ": " << row->text << "\n  "
                    << Describe(s) << "\n  Decide says " << ActionName(d.action) << " "
                    << durability << " " << d.code;
    }
  });
  EXPECT_EQ(failures, 0);
  // A row no situation reaches is dead text: the table says nothing it
  // does not mean.
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_GT(hits[i], 0) << "docs/architecture.md:" << rows[i].line
                          << ": no situation reaches this row: " << rows[i].text;
  }
  EXPECT_GT(situations, 1'000'000);
}

bool Effectful(CallKind k) {
  return k == CallKind::kAction || k == CallKind::kCommit || k == CallKind::kOpenCall ||
         k == CallKind::kCompletionCheck || k == CallKind::kCompensation;
}

bool Definite(Answer a) {
  // The provider said, for certain, that the key left no effect.
  return a == Answer::kNotApplied || a == Answer::kFailed || a == Answer::kFailedRetryable;
}

bool IsLookupAnswer(Answer a) {
  return a == Answer::kApplied || a == Answer::kNotApplied || a == Answer::kPending ||
         a == Answer::kFailed || a == Answer::kLookupError;
}

// What must hold whatever the table says: one effect per intent. Checked
// over every situation a driver can meet (a lookup answers only for a tool
// that has one). Returns the violations; `report` adds the first 20 as
// test failures.
int CountViolations(bool report, long* checked_out = nullptr) {
  long checked = 0;
  int failures = 0;
  auto check = [&](bool ok, const char* what, const std::string& where) {
    if (!ok && ++failures <= 20 && report) ADD_FAILURE() << what << ": " << where;
  };
  ForEachSituation([&](const Situation& s) {
    if (IsLookupAnswer(s.answer) && !s.caps.status_lookup && s.kind != CallKind::kGuardRead &&
        s.kind != CallKind::kDriftCheck) {
      return;  // unreachable: no lookup to answer
    }
    if (s.kind == CallKind::kCompletionCheck && !s.caps.status_lookup) {
      return;  // unreachable: only a tool with a lookup waits for its provider
    }
    ++checked;
    const Decision d = Decide(s);
    const std::string where = Describe(s) + " -> " + ActionName(d.action) + " " + d.code;
    const bool again = d.action == Action::kResend || d.action == Action::kRetryAfterBackoff;
    if (Effectful(s.kind)) {
      check(d.action != Action::kCall || s.answer == Answer::kNone,
            "a call is made only when nothing was asked yet", where);
      // Another attempt only where it cannot make a second effect: a
      // same-key resend the provider absorbs or that changes nothing, or
      // after the provider said for certain that the key left nothing.
      check(!again || s.caps.same_key_safe() || Definite(s.answer),
            "another attempt after an uncertain answer of an unsafe tool", where);
      // An attempt whose sender may still be alive can land after any
      // answer: only a safe resend.
      check(!(again && s.in_flight == InFlight::kTakenOver && s.answer == Answer::kNotApplied) ||
                s.caps.same_key_safe(),
            "a resend while a taken-over attempt may land", where);
      check(d.action != Action::kRecordSucceeded || s.answer == Answer::kSucceeded ||
                s.answer == Answer::kApplied,
            "an effect recorded without the provider's word", where);
      check(!(d.action == Action::kRecordSucceeded && d.durability == Durability::kWithNextFlush) ||
                ((s.caps.honours_keys || s.caps.status_lookup) && s.attempt <= 1),
            "a record left for later that only a person could re-learn", where);
      check(d.action != Action::kLookUp || s.caps.status_lookup, "a lookup of a tool without one",
            where);
      check(d.action != Action::kWait || (s.kind != CallKind::kCompensation &&
                                          (s.can_wait || s.kind == CallKind::kCompletionCheck)),
            "a wait where the step cannot wait", where);
    }
    if (s.kind == CallKind::kGuardRead) {
      check(
          d.action != Action::kCall || s.answer == Answer::kNone || s.answer == Answer::kNotApplied,
          "the guarded write goes on without a judged absent", where);
    }
  });
  if (checked_out != nullptr) *checked_out = checked;
  return failures;
}

TEST(EffectProtocolTest, NoSituationTurnsAnUncertainOutcomeIntoASecondEffect) {
  long checked = 0;
  EXPECT_EQ(CountViolations(/*report=*/true, &checked), 0);
  EXPECT_GT(checked, 1'000'000);
}

// The safety check is not vacuous: with a known defect put back, it fails.
TEST(EffectProtocolTest, TheSafetyCheckFindsEachDefectOfTheTable) {
  for (Mutation m : {Mutation::kUndoResendsAfterAnyLookup, Mutation::kGuardReadsAcceptedAsAbsent}) {
    SetMutation(m);
    EXPECT_GT(CountViolations(/*report=*/false), 0) << MutationName(m);
    SetMutation(Mutation::kNone);
  }
}

// The switches that put defects back change the table where they say.
TEST(EffectProtocolTest, MutationsPutTheirDefectBack) {
  Situation s;
  s.kind = CallKind::kCompensation;
  s.caps.status_lookup = true;
  s.call = Answer::kUnknown;
  s.answer = Answer::kLookupError;
  s.in_flight = InFlight::kCrashed;
  s.attempt = 1;
  s.max_attempts = 5;
  s.lookups = 3;
  EXPECT_EQ(Decide(s).action, Action::kPark);
  SetMutation(Mutation::kUndoResendsAfterAnyLookup);
  EXPECT_EQ(Decide(s).action, Action::kResend);
  SetMutation(Mutation::kNone);

  Situation g;
  g.kind = CallKind::kGuardRead;
  g.answer = g.call = Answer::kAccepted;
  g.attempt = 3;
  g.max_attempts = 3;
  EXPECT_EQ(Decide(g).action, Action::kPark);
  SetMutation(Mutation::kGuardReadsAcceptedAsAbsent);
  EXPECT_EQ(Decide(g).action, Action::kCall);
  SetMutation(Mutation::kNone);
}

}  // namespace
}  // namespace idem::effect
