// Crash tests: RELIABILITY.md section 2, rows 1-4 and 13-16, with the H5
// checker.
//
// Each test spawns the real `travel-booking` binary with IDEM_FAILPOINT armed
// (H1), checks that it died by SIGKILL at the named boundary, runs `recover`
// without failpoints, and then joins the journal (`status SAGA --json`) with
// the providers' ledger (read directly with the sqlite3 C API):
//   - per key, ledger effects <= 1 (no duplicate effect);
//   - exactly one action effect per step the journal says succeeded, none for
//     steps that never ran, failed or wait for a person, exactly one undo per
//     compensated step;
//   - no ledger effect the journal does not account for (orphan = 0);
//   - every saga the client started exists (lost = 0) and is terminal, needs
//     attention with a reason, or waits for a person's approval of a step.
//
// The trip's last step, charge_payment, is two-phase with human approval:
// `run` previews it and ends with the saga awaiting_approval (exit 7); the
// commit runs in a second process, `approve TOKEN` (the token read from
// `approvals --json`), or `reject TOKEN` rolls the saga back. So failpoints of
// the payment's commit (step.after_submitted, provider.after_apply, ...,
// saga.*_terminal) fire in the `approve` process, counted from 1 there.
// Wherever a saga waits after `run` or `recover`, the test approves it through
// the CLI and goes on checking.
//
// Row 4 (nested kills) picks its failpoints from a seeded std::mt19937_64
// (seed printed; set IDEM_CRASH_SEED to replay or explore). The expected
// failpoint hits of a process come from a small model of the engine
// (`Predictor`), so a failpoint that does not fire where it should is an error.
//
// At exit the process prints `crash sweep: N crashes injected, D duplicate
// effects, L lost sagas, O orphan effects` (one line per test process: ctest
// runs each test alone; run the binary directly for the totals of a sweep).

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "cli/cli.h"
#include "tests/test_util.h"

#include "common/json_util.h"
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace idem {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBinary = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";
// The sweep's model (Predictor) counts failpoint hits step by step, so it
// runs the trip with its steps one after another; the travel example's trip
// (flight, hotel and car at once) has its own crash tests (CrashParallelTest).
constexpr const char* kTripSpec = IDEM_SOURCE_DIR "/tests/specs/trip_sequential.json";
constexpr const char* kParallelTripSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip.json";
constexpr const char* kTripInput = IDEM_SOURCE_DIR "/examples/travel_booking/input.json";
constexpr const char* kRejectPayment = "payments.charge=reject";

// ---- the trip (examples/travel_booking/trip.json) and its providers

struct TripStep {
  const char* id;
  const char* action;  ///< "flights.reserve"
  const char* undo;    ///< its compensation tool
  bool action_keys;    ///< the action deduplicates idempotency keys
  bool action_status;  ///< the action answers status lookups
  bool undo_status;    ///< the compensation answers status lookups
};

// clang-format off
constexpr TripStep kTrip[] = {
//  id                action              undo               keys   status  undo status
  {"reserve_flight", "flights.reserve",  "flights.cancel",  true,  true,   false},
  {"book_hotel",     "hotels.book",      "hotels.cancel",   false, true,   true },
  {"rent_car",       "cars.rent",        "cars.return",     false, false,  false},
  {"charge_payment", "payments.charge",  "payments.refund", true,  true,   false},
};
// clang-format on
constexpr int kSteps = sizeof(kTrip) / sizeof(kTrip[0]);
constexpr int kPaymentStep = 3;

const TripStep* StepOfTool(const std::string& action_tool) {
  for (const TripStep& s : kTrip) {
    if (action_tool == s.action) return &s;
  }
  return nullptr;
}

std::pair<std::string, std::string> SplitTool(const std::string& tool) {
  auto dot = tool.find('.');
  return {tool.substr(0, dot), dot == std::string::npos ? "" : tool.substr(dot + 1)};
}

std::string CompensationKey(const std::string& key) { return key + ":compensate"; }

std::string Join(const std::vector<std::string>& lines, const char* sep = "\n  ") {
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : sep) + l;
  return out;
}

// ---- sweep totals (printed by SweepEnvironment)

struct SweepTotals {
  std::atomic<int> crashes{0};
  std::atomic<int> duplicates{0};
  std::atomic<int> lost{0};
  std::atomic<int> orphans{0};
};

SweepTotals& Totals() {
  static SweepTotals* t = new SweepTotals();
  return *t;
}

class SweepEnvironment : public testing::Environment {
 public:
  void TearDown() override {
    SweepTotals& t = Totals();
    std::cout << "crash sweep: " << t.crashes << " crashes injected, " << t.duplicates
              << " duplicate effects, " << t.lost << " lost sagas, " << t.orphans
              << " orphan effects" << std::endl;
    EXPECT_EQ(t.duplicates, 0);
    EXPECT_EQ(t.lost, 0);
    EXPECT_EQ(t.orphans, 0);
  }
};

testing::Environment* const kSweepEnvironment =
    testing::AddGlobalTestEnvironment(new SweepEnvironment);

// ---- processes

struct ProcessExit {
  std::string command;  ///< for messages
  std::string output;   ///< stderr (and stdout unless captured apart)
  std::string error;    ///< spawn or wait failure
  bool signaled = false;
  int signal = 0;
  int code = -1;

  bool KilledBySigkill() const { return error.empty() && signaled && signal == SIGKILL; }
  bool Exited(int c) const { return error.empty() && !signaled && code == c; }
  std::string Describe() const {
    std::string how = !error.empty() ? "not run: " + error
                      : signaled     ? "killed by signal " + std::to_string(signal)
                                     : "exit code " + std::to_string(code);
    return "`" + command + "`: " + how + "\n--- output ---\n" + output + "--------------";
  }
};

std::ostream& operator<<(std::ostream& os, const ProcessExit& e) { return os << e.Describe(); }

/// The inherited environment without the variables that would change what
/// travel-booking does, plus IDEM_FAILPOINT when `failpoint` is not empty.
std::vector<std::string> ChildEnvironment(const std::string& failpoint) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string var = *e;
    if (var.rfind("IDEM_FAILPOINT=", 0) == 0 || var.rfind("IDEM_DB=", 0) == 0 ||
        var.rfind("TRAVEL_LEDGER=", 0) == 0) {
      continue;
    }
    env.push_back(var);
  }
  if (!failpoint.empty()) env.push_back("IDEM_FAILPOINT=" + failpoint);
  return env;
}

/// A started child process.
struct Child {
  pid_t pid = -1;
  std::string error;  ///< spawn failure
};

/// Starts argv[0] with posix_spawn, stdout to `out`, stderr to `err` (the
/// same file is fine: both are opened for append); does not wait.
Child StartChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                 const fs::path& out, const fs::path& err) {
  Child child;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string out_path = out.string();
  const std::string err_path = err.string();
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  int rc = posix_spawn(&child.pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    child.pid = -1;
    child.error = std::string("posix_spawn: ") + std::strerror(rc);
  }
  return child;
}

/// Waits for a child started by StartChild.
ProcessExit WaitChild(const Child& child) {
  ProcessExit result;
  if (child.pid < 0) {
    result.error = child.error;
    return result;
  }
  int status = 0;
  pid_t w;
  do {
    w = waitpid(child.pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  if (w < 0) {
    result.error = std::string("waitpid: ") + std::strerror(errno);
    return result;
  }
  if (WIFSIGNALED(status)) {
    result.signaled = true;
    result.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    result.code = WEXITSTATUS(status);
  }
  return result;
}

// ---- the ledger, read with the sqlite3 C API

struct LedgerRow {
  int64_t id = 0;
  std::string provider;
  std::string operation;
  std::string key;
  std::string outcome;  ///< calls only
};

struct LedgerView {
  std::vector<LedgerRow> effects;  ///< in the order applied
  std::vector<LedgerRow> calls;    ///< in the order received

  /// Effect rows of `tool` ("hotels.book") under `key`.
  int Effects(const std::string& tool, const std::string& key) const {
    auto [provider, operation] = SplitTool(tool);
    return static_cast<int>(std::count_if(effects.begin(), effects.end(), [&](const LedgerRow& r) {
      return r.provider == provider && r.operation == operation && r.key == key;
    }));
  }
  /// The id of the first effect of `tool` under `key`, 0 when none.
  int64_t EffectId(const std::string& tool, const std::string& key) const {
    auto [provider, operation] = SplitTool(tool);
    for (const auto& r : effects) {
      if (r.provider == provider && r.operation == operation && r.key == key) return r.id;
    }
    return 0;
  }
  /// Calls of `tool` under `key`, status lookups excluded: attempts received.
  int Calls(const std::string& tool, const std::string& key) const {
    auto [provider, operation] = SplitTool(tool);
    return static_cast<int>(std::count_if(calls.begin(), calls.end(), [&](const LedgerRow& r) {
      return r.provider == provider && r.operation == operation && r.key == key;
    }));
  }
  /// Status lookups `provider` answered for `key`.
  int Lookups(const std::string& provider, const std::string& key) const {
    return static_cast<int>(std::count_if(calls.begin(), calls.end(), [&](const LedgerRow& r) {
      return r.provider == provider && r.operation == "lookup" && r.key == key;
    }));
  }
  std::string Dump() const {
    std::string out = "ledger effects:\n";
    for (const auto& r : effects) {
      out +=
          "  " + std::to_string(r.id) + " " + r.provider + "." + r.operation + " " + r.key + "\n";
    }
    out += "ledger calls:\n";
    for (const auto& r : calls) {
      out += "  " + r.provider + "." + r.operation + " " + r.key + " " + r.outcome + "\n";
    }
    return out;
  }
};

/// Reads the ledger at `path`. A missing file reads as empty.
bool ReadLedger(const fs::path& path, LedgerView* view, std::string* error) {
  *view = LedgerView();
  if (!fs::exists(path)) return true;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    *error = "open " + path.string() + ": " + (db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 10'000);
  auto read = [&](const char* sql, bool with_outcome, std::vector<LedgerRow>* rows) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) {
      *error = std::string(sql) + ": " + sqlite3_errmsg(db);
      return false;
    }
    auto text = [&](int col) {
      const unsigned char* t = sqlite3_column_text(stmt, col);
      return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
    };
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      LedgerRow r;
      r.id = sqlite3_column_int64(stmt, 0);
      r.provider = text(1);
      r.operation = text(2);
      r.key = text(3);
      if (with_outcome) r.outcome = text(4);
      rows->push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) *error = std::string(sql) + ": " + sqlite3_errmsg(db);
    sqlite3_finalize(stmt);
    return rc == SQLITE_DONE;
  };
  bool ok = read("SELECT id, provider, operation, idempotency_key FROM effects ORDER BY id", false,
                 &view->effects) &&
            read("SELECT id, provider, operation, idempotency_key, outcome FROM calls ORDER BY id",
                 true, &view->calls);
  sqlite3_close(db);
  return ok;
}

/// The first column of the first row of `sql` (with text `binds`) against the
/// SQLite database at `path`, as text ("" when there is no row or it is NULL).
/// For what the CLI does not show: a step's commit token, spent tokens.
bool QueryText(const fs::path& path, const std::string& sql, const std::vector<std::string>& binds,
               std::string* out, std::string* error) {
  out->clear();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    *error = "open " + path.string() + ": " + (db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 10'000);
  sqlite3_stmt* stmt = nullptr;
  bool ok = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK;
  for (size_t i = 0; ok && i < binds.size(); ++i) {
    ok = sqlite3_bind_text(stmt, static_cast<int>(i) + 1, binds[i].c_str(), -1, SQLITE_TRANSIENT) ==
         SQLITE_OK;
  }
  if (ok) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      const unsigned char* t = sqlite3_column_text(stmt, 0);
      if (t != nullptr) *out = reinterpret_cast<const char*>(t);
    } else if (rc != SQLITE_DONE) {
      ok = false;
    }
  }
  if (!ok) *error = sql + ": " + sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return ok;
}

// ---- the H5 checker

struct Verdict {
  std::vector<std::string> violations;
  std::vector<Json> sagas;  ///< `status --json` of every saga, in `list` order
  LedgerView ledger;
  int duplicates = 0;
  int lost = 0;
  int orphans = 0;

  std::string Report() const {
    std::string out = violations.empty() ? "no violations" : "violations:\n  " + Join(violations);
    out += "\n" + ledger.Dump();
    for (const auto& s : sagas) {
      out += "saga " + s.value("saga_id", "") + ": " + s.value("state", "") + " (" +
             s.value("reason", "") + ")\n";
      for (const auto& st : s.value("steps", Json::array())) {
        out += "  step " + st.value("id", "") + ": " + st.value("state", "") + ", attempts " +
               std::to_string(st.value("attempts", 0)) + "\n";
      }
      for (const auto& e : s.value("journal", Json::array())) {
        out += "  #" + std::to_string(e.value("seq", 0)) + " " + e.value("step", "") + " " +
               e.value("event", "") + " " + e.value("data", Json::object()).dump() + "\n";
      }
    }
    return out;
  }
};

bool IsTerminal(const std::string& state) {
  return state == "succeeded" || state == "compensated" || state == "failed";
}

/// A saga may wait for a person only while one of its steps does.
bool WaitsForApproval(const Json& saga) {
  if (saga.value("state", "") != "awaiting_approval") return false;
  for (const Json& st : saga.value("steps", Json::array())) {
    if (st.value("state", "") == "awaiting_approval") return true;
  }
  return false;
}

/// Joins the journal of every saga with the ledger (RELIABILITY.md H5).
/// `expected_sagas`: how many sagas the clients started (for lost sagas).
void CheckInvariants(int expected_sagas, Verdict* v) {
  const LedgerView& ledger = v->ledger;
  auto violation = [&](const std::string& what) { v->violations.push_back(what); };

  if (static_cast<int>(v->sagas.size()) < expected_sagas) {
    v->lost += expected_sagas - static_cast<int>(v->sagas.size());
    violation("lost sagas: " + std::to_string(v->sagas.size()) + " in the journal, " +
              std::to_string(expected_sagas) + " started");
  }
  if (static_cast<int>(v->sagas.size()) > expected_sagas) {
    violation(std::to_string(v->sagas.size()) + " sagas in the journal, " +
              std::to_string(expected_sagas) + " started");
  }

  // Duplicates: any (provider, operation, key) applied more than once.
  std::map<std::tuple<std::string, std::string, std::string>, int> per_key;
  for (const auto& e : ledger.effects) ++per_key[{e.provider, e.operation, e.key}];
  for (const auto& [k, n] : per_key) {
    if (n > 1) {
      v->duplicates += n - 1;
      violation("duplicate effect: " + std::get<0>(k) + "." + std::get<1>(k) + " key " +
                std::get<2>(k) + " applied " + std::to_string(n) + " times");
    }
  }

  // Which (tool, key) the journal accounts for, and in which step state.
  std::map<std::pair<std::string, std::string>, std::string> action_owner, undo_owner;
  for (const Json& saga : v->sagas) {
    const std::string sid = saga.value("saga_id", "");
    const std::string state = saga.value("state", "");
    const std::string reason = saga.value("reason", "");
    if (!IsTerminal(state) && !(state == "needs_attention" && !reason.empty()) &&
        !WaitsForApproval(saga)) {
      ++v->lost;
      violation("saga " + sid + " is stuck in state \"" + state + "\" (reason \"" + reason +
                "\"): not terminal, nor needs_attention with a reason, nor waiting for the "
                "approval of a step");
    }
    for (const Json& st : saga.value("steps", Json::array())) {
      const std::string step = sid + "/" + st.value("id", "?");
      const std::string tool = st.value("tool", "");
      const std::string key = st.value("key", "");
      const std::string s = st.value("state", "");
      const TripStep* trip = StepOfTool(tool);
      if (trip == nullptr) {
        violation("step " + step + ": unexpected tool " + tool);
        continue;
      }
      action_owner[{tool, key}] = s;
      undo_owner[{trip->undo, CompensationKey(key)}] = s;
      const int a = ledger.Effects(tool, key);
      const int c = ledger.Effects(trip->undo, CompensationKey(key));
      const Json& comp = st.contains("compensation_result") ? st["compensation_result"] : Json();
      const bool null_comp = comp.is_object() && comp.value("null_compensation", false);
      auto want = [&](const char* what, int got, int lo, int hi) {
        if (got < lo || got > hi) {
          violation("step " + step + " (" + s + "): " + what + " effects " + std::to_string(got) +
                    (lo == hi ? ", want " + std::to_string(lo)
                              : ", want " + std::to_string(lo) + ".." + std::to_string(hi)));
        }
      };
      if (s == "succeeded") {
        want("action", a, 1, 1);
        want("compensation", c, 0, 0);
      } else if (s == "compensated") {
        want("action", a, null_comp ? 0 : 1, null_comp ? 0 : 1);
        want("compensation", c, null_comp ? 0 : 1, null_comp ? 0 : 1);
      } else if (s == "planned" || s == "failed" || s == "previewed" ||
                 s == "awaiting_approval") {  // a preview has no effect
        want("action", a, 0, 0);
        want("compensation", c, 0, 0);
      } else if (s == "submitted" || s == "unknown" || s == "needs_attention") {
        want("action", a, 0, 1);  // uncertain, and the journal says so
        want("compensation", c, 0, 0);
      } else if (s == "compensating" || s == "compensation_failed") {
        want("action", a, 1, 1);
        want("compensation", c, 0, 1);
      } else {
        violation("step " + step + ": unknown state \"" + s + "\"");
      }
    }
  }

  // Orphans: effects no journal record accounts for.
  for (const auto& e : ledger.effects) {
    const std::string tool = e.provider + "." + e.operation;
    auto act = action_owner.find({tool, e.key});
    auto undo = undo_owner.find({tool, e.key});
    bool owned = false;
    if (act != action_owner.end()) {
      owned = act->second != "planned" && act->second != "failed" && act->second != "previewed" &&
              act->second != "awaiting_approval";
    } else if (undo != undo_owner.end()) {
      owned = undo->second == "compensating" || undo->second == "compensated" ||
              undo->second == "compensation_failed";
    }
    if (!owned) {
      ++v->orphans;
      violation("orphan effect #" + std::to_string(e.id) + ": " + tool + " key " + e.key);
    }
  }
}

// ---- the checker can fail: synthetic journals and ledgers

Json SyntheticSaga(const std::string& state, const std::vector<std::string>& step_states,
                   const std::string& reason = "") {
  Json steps = Json::array();
  for (int i = 0; i < kSteps; ++i) {
    steps.push_back({{"id", kTrip[i].id},
                     {"tool", kTrip[i].action},
                     {"key", std::string("sg_x/") + kTrip[i].id},
                     {"state", step_states[i]},
                     {"attempts", 1},
                     {"compensation_result", nullptr}});
  }
  return {{"saga_id", "sg_x"}, {"state", state}, {"reason", reason}, {"steps", steps}};
}

void AddEffect(Verdict* v, const std::string& tool, const std::string& key) {
  auto [provider, operation] = SplitTool(tool);
  LedgerRow r;
  r.id = static_cast<int64_t>(v->ledger.effects.size()) + 1;
  r.provider = provider;
  r.operation = operation;
  r.key = key;
  v->ledger.effects.push_back(r);
}

/// A succeeded trip, its four effects in the ledger.
Verdict SucceededTrip() {
  Verdict v;
  v.sagas.push_back(
      SyntheticSaga("succeeded", {"succeeded", "succeeded", "succeeded", "succeeded"}));
  for (const TripStep& s : kTrip) AddEffect(&v, s.action, std::string("sg_x/") + s.id);
  return v;
}

TEST(CrashCheckerTest, CleanTripPasses) {
  Verdict v = SucceededTrip();
  CheckInvariants(1, &v);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
}

TEST(CrashCheckerTest, FindsDuplicateEffect) {
  Verdict v = SucceededTrip();
  AddEffect(&v, "hotels.book", "sg_x/book_hotel");
  CheckInvariants(1, &v);
  EXPECT_EQ(v.duplicates, 1) << v.Report();
  EXPECT_FALSE(v.violations.empty());
}

TEST(CrashCheckerTest, FindsMissingEffectOfSucceededStep) {
  Verdict v = SucceededTrip();
  v.ledger.effects.erase(v.ledger.effects.begin() + 2);  // the car
  CheckInvariants(1, &v);
  ASSERT_EQ(v.violations.size(), 1u) << v.Report();
  EXPECT_NE(v.violations[0].find("rent_car"), std::string::npos) << v.Report();
}

TEST(CrashCheckerTest, FindsOrphanEffects) {
  Verdict v;
  v.sagas.push_back(SyntheticSaga("needs_attention", {"succeeded", "failed", "planned", "planned"},
                                  "step book_hotel failed"));
  AddEffect(&v, "flights.reserve", "sg_x/reserve_flight");
  AddEffect(&v, "hotels.book", "sg_x/book_hotel");                    // the journal says failed
  AddEffect(&v, "cars.rent", "sg_y/rent_car");                        // no saga has this key
  AddEffect(&v, "flights.cancel", "sg_x/reserve_flight:compensate");  // never compensated
  CheckInvariants(1, &v);
  EXPECT_EQ(v.orphans, 3) << v.Report();
}

TEST(CrashCheckerTest, CompensatedStepNeedsExactlyOneUndo) {
  Verdict v;
  v.sagas.push_back(
      SyntheticSaga("compensated", {"compensated", "compensated", "compensated", "failed"}, "x"));
  for (int i = 0; i < 3; ++i) AddEffect(&v, kTrip[i].action, std::string("sg_x/") + kTrip[i].id);
  AddEffect(&v, "flights.cancel", "sg_x/reserve_flight:compensate");
  AddEffect(&v, "hotels.cancel", "sg_x/book_hotel:compensate");
  CheckInvariants(1, &v);
  ASSERT_EQ(v.violations.size(), 1u) << v.Report();  // the car was never returned
  EXPECT_NE(v.violations[0].find("rent_car"), std::string::npos) << v.Report();
  AddEffect(&v, "cars.return", "sg_x/rent_car:compensate");
  v.violations.clear();
  CheckInvariants(1, &v);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
}

TEST(CrashCheckerTest, FindsLostAndStuckSagas) {
  Verdict none;
  CheckInvariants(1, &none);
  EXPECT_EQ(none.lost, 1);

  Verdict stuck;
  stuck.sagas.push_back(SyntheticSaga("running", {"planned", "planned", "planned", "planned"}));
  CheckInvariants(1, &stuck);
  EXPECT_EQ(stuck.lost, 1) << stuck.Report();

  Verdict silent;  // parked without saying why
  silent.sagas.push_back(
      SyntheticSaga("needs_attention", {"planned", "planned", "planned", "planned"}));
  CheckInvariants(1, &silent);
  EXPECT_EQ(silent.lost, 1) << silent.Report();
}

TEST(CrashCheckerTest, WaitingForApprovalIsNotLost) {
  Verdict v;
  v.sagas.push_back(SyntheticSaga("awaiting_approval",
                                  {"succeeded", "succeeded", "succeeded", "awaiting_approval"}));
  for (int i = 0; i < 3; ++i) AddEffect(&v, kTrip[i].action, std::string("sg_x/") + kTrip[i].id);
  CheckInvariants(1, &v);
  EXPECT_TRUE(v.violations.empty()) << v.Report();

  AddEffect(&v, "payments.charge", "sg_x/charge_payment");  // charged before the approval
  CheckInvariants(1, &v);
  EXPECT_EQ(v.orphans, 1) << v.Report();
  EXPECT_FALSE(v.violations.empty());

  Verdict nothing_waits;  // awaiting_approval, yet no step waits
  nothing_waits.sagas.push_back(
      SyntheticSaga("awaiting_approval", {"planned", "planned", "planned", "planned"}));
  CheckInvariants(1, &nothing_waits);
  EXPECT_EQ(nothing_waits.lost, 1) << nothing_waits.Report();
}

// ---- a model of the engine: which failpoints a run or a recovery hits

struct ModelStep {
  std::string state = "planned";
  int attempt = 0;
  bool applied = false;       ///< the ledger has the action's effect
  bool undo_applied = false;  ///< the ledger has the compensation's effect
  std::string decision;       ///< two-phase: "approved" or "rejected" (of the current preview)
};

struct Model {
  std::string saga = "pending";
  std::vector<ModelStep> steps = std::vector<ModelStep>(kSteps);
  bool reject_payment = false;  ///< --fault payments.charge=reject (on every process)
};

struct Prediction {
  std::vector<std::string> hits;  ///< failpoint names, in order
  std::string final_state;
};

// Resends after a status lookup confirmed the key absent (engine.cc,
// kMaxConfirmedAbsentAttempts); ordinary attempts are max(2, max_attempts) = 2.
constexpr int kMaxConfirmedAbsentAttempts = 5;

/// Mirrors saga/engine.cc against the travel providers without faults other
/// than a rejected payment: the failpoints a process reaches, from `m`, when
/// nothing kills it. One Predictor can follow several processes in turn.
class Predictor {
 public:
  explicit Predictor(Model m) : m_(std::move(m)) {}

  /// A `run` or `recover` process (Engine::Run on the saga).
  Prediction Drive() {
    hits_.clear();
    DriveSaga();
    return {hits_, m_.saga};
  }

  /// An `approve` (or `reject`) process on the step's current token
  /// (Engine::Decide). A refused decision (nothing waits) hits nothing.
  Prediction Decide(bool approve) {
    hits_.clear();
    ModelStep& pay = m_.steps[kPaymentStep];
    if (pay.decision.empty()) {
      if (m_.saga != "awaiting_approval" || pay.state != "awaiting_approval") {
        return {hits_, m_.saga};
      }
      pay.decision = approve ? "approved" : "rejected";
      m_.saga = "running";  // journaled with the decision
      Hit("approval.after_commit");
    } else if (m_.saga != "running" && m_.saga != "awaiting_approval") {
      return {hits_, m_.saga};  // a replay: the recorded outcome
    }
    DriveSaga();
    return {hits_, m_.saga};
  }

  /// The decision a person can take now: the saga waits, undecided.
  bool Undecided() const {
    return m_.saga == "awaiting_approval" && m_.steps[kPaymentStep].decision.empty();
  }
  const Model& model() const { return m_; }

 private:
  enum class End { kSucceeded, kFailed, kParked, kWaiting };

  void Hit(const char* name) { hits_.emplace_back(name); }
  void Terminal(const char* state) {
    Hit("saga.before_terminal");
    Hit("saga.after_terminal");
    m_.saga = state;
  }

  void DriveSaga() {
    if (m_.saga == "pending") {
      Hit("saga.after_start");
      m_.saga = "running";
    }
    if (m_.saga == "awaiting_approval" && !m_.steps[kPaymentStep].decision.empty()) {
      m_.saga = "running";  // the approval is settled: go on
    }
    if (m_.saga == "running") Forward();
    if (m_.saga == "compensating") Rollback();
  }

  void Forward() {
    for (int i = 0;; ++i) {
      while (i < kSteps && m_.steps[i].state == "succeeded") ++i;
      if (i == kSteps) return Terminal("succeeded");
      End e = DriveStep(i, /*rolling_back=*/false);
      if (e == End::kWaiting) {
        m_.saga = "awaiting_approval";  // no failpoint around this commit
        return;
      }
      if (e == End::kParked) return Terminal("needs_attention");
      if (e == End::kFailed) {
        if (NextUndo() >= 0) {
          m_.saga = "compensating";
          return;
        }
        return Terminal("failed");
      }
    }
  }

  int NextUndo() const {
    for (int i = kSteps - 1; i >= 0; --i) {
      const std::string& s = m_.steps[i].state;
      if (s == "submitted" || s == "unknown" || s == "needs_attention" ||
          s == "compensation_failed" || s == "compensating" || s == "succeeded") {
        return i;
      }
    }
    return -1;
  }

  void Rollback() {
    for (;;) {
      int i = NextUndo();
      if (i < 0) return Terminal("compensated");
      ModelStep& st = m_.steps[i];
      if (st.state == "submitted" || st.state == "unknown") {
        if (DriveStep(i, /*rolling_back=*/true) == End::kParked) return Terminal("needs_attention");
        continue;
      }
      if (st.state == "needs_attention" || st.state == "compensation_failed") {
        return Terminal("needs_attention");
      }
      DriveUndo(i);
    }
  }

  End DriveStep(int i, bool rolling_back) {
    ModelStep& st = m_.steps[i];
    if (st.state == "succeeded") return End::kSucceeded;
    if (st.state == "failed") return End::kFailed;
    if (st.state == "needs_attention") return End::kParked;
    if (i == kPaymentStep && (st.state == "planned" || st.state == "awaiting_approval")) {
      return TwoPhase(i);
    }
    if (st.state == "planned") {
      Hit("step.before_submitted");
      st.state = "submitted";
      st.attempt = 1;
      Hit("step.after_submitted");
      return Call(i);
    }
    if (st.state == "submitted") {
      st.state = "unknown";
      Hit("unknown.after_recorded");
    }
    return Resolve(i, rolling_back);
  }

  /// The payment (AdvanceTwoPhase): preview and wait; once decided, spend the
  /// token with `submitted` and call, or fail on a rejection.
  End TwoPhase(int i) {
    ModelStep& st = m_.steps[i];
    if (st.state == "planned") {
      Hit("preview.after_call");
      st.state = "awaiting_approval";
      st.decision.clear();
      Hit("preview.after_journal");
      return End::kWaiting;
    }
    if (st.decision.empty()) return End::kWaiting;
    if (st.decision == "rejected") {
      st.state = "failed";
      Hit("step.after_outcome");
      return End::kFailed;
    }
    ++st.attempt;
    st.state = "submitted";
    Hit("step.after_submitted");
    return Call(i);
  }

  End Call(int i) {
    ModelStep& st = m_.steps[i];
    if (i == kPaymentStep && m_.reject_payment) {
      Hit("step.after_call");
      st.state = "failed";  // a permanent refusal: no retry
      Hit("step.after_outcome");
      return End::kFailed;
    }
    if (!(kTrip[i].action_keys && st.applied)) {
      st.applied = true;
      Hit("provider.after_apply");
    }
    Hit("step.after_call");
    st.state = "succeeded";
    Hit("step.after_outcome");
    return End::kSucceeded;
  }

  End Resolve(int i, bool rolling_back) {
    ModelStep& st = m_.steps[i];
    if (kTrip[i].action_status) {
      if (st.applied) {
        st.state = "succeeded";
        Hit("step.after_outcome");
        return End::kSucceeded;
      }
      if (!rolling_back && st.attempt < kMaxConfirmedAbsentAttempts) {
        ++st.attempt;
        st.state = "submitted";
        Hit("step.after_submitted");
        return Call(i);
      }
      st.state = "failed";
      Hit("step.after_outcome");
      return End::kFailed;
    }
    if (kTrip[i].action_keys && !rolling_back && st.attempt < 2) {
      ++st.attempt;
      st.state = "submitted";
      Hit("step.after_submitted");
      return Call(i);
    }
    st.state = "needs_attention";  // neither status nor keys: a person decides
    return End::kParked;
  }

  void DriveUndo(int i) {
    ModelStep& st = m_.steps[i];
    if (st.state == "succeeded") {
      Hit("compensation.before_submitted");
      st.state = "compensating";
      Hit("compensation.after_submitted");
    } else if (kTrip[i].undo_status && st.undo_applied) {  // compensating, found by lookup
      st.state = "compensated";
      Hit("compensation.after_outcome");
      return;
    }
    // Every compensation honours keys: a resend is deduplicated.
    if (!st.undo_applied && st.applied) {
      st.undo_applied = true;
      Hit("provider.after_undo");
    }
    Hit("compensation.after_call");
    st.state = "compensated";
    Hit("compensation.after_outcome");
  }

  Model m_;
  std::vector<std::string> hits_;
};

/// The n-th (1-based) hit of `name` in `hits` exists.
bool Reaches(const std::vector<std::string>& hits, const std::string& name, int n) {
  return std::count(hits.begin(), hits.end(), name) >= n;
}

// ---- the fixture

/// `recover`'s exit code for one saga found in `before` and left in `after`.
/// Recover resumes pending, running, compensating and awaiting_approval
/// sagas. CmdRecover (cli.cc) exits 4 when a resumed saga needs attention, 3
/// when one was rolled back, and 0 otherwise: a saga left waiting for a
/// person is normal.
int RecoverExitFor(const std::string& before, const std::string& after) {
  bool resumed = before == "pending" || before == "running" || before == "compensating" ||
                 before == "awaiting_approval";
  if (!resumed || after == "succeeded" || after == "awaiting_approval") return cli::kExitOk;
  if (after == "needs_attention") return cli::kExitNeedsAttention;
  return cli::kExitRolledBack;
}

/// The exit code of `run`, `approve` or `reject` for a saga that ends in
/// `state` (cli.h).
int RunExitFor(const std::string& state) {
  if (state == "succeeded") return cli::kExitOk;
  if (state == "needs_attention") return cli::kExitNeedsAttention;
  if (state == "awaiting_approval") return cli::kExitAwaitingApproval;
  return cli::kExitRolledBack;
}

/// The decision journaled for `step` since its latest preview: "approved",
/// "rejected" or "".
std::string DecisionOf(const Json& saga, const std::string& step) {
  std::string decision;
  for (const Json& e : saga.value("journal", Json::array())) {
    if (e.value("step", "") != step) continue;
    const std::string event = e.value("event", "");
    if (event == "previewed") decision.clear();
    if (event == "approved" || event == "rejected") decision = event;
  }
  return decision;
}

/// How many times `event` was journaled for `step`.
int JournalCount(const Json& saga, const std::string& step, const std::string& event) {
  int n = 0;
  for (const Json& e : saga.value("journal", Json::array())) {
    n += e.value("step", "") == step && e.value("event", "") == event;
  }
  return n;
}

class CrashTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name();
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    tmp_.emplace("idem_crash_" + name);
    dir_ = tmp_->path();
    db_ = dir_ / "trip.db";
    ledger_ = dir_ / "trip.db.ledger.sqlite";  // travel-booking's default: <db>.ledger.sqlite
  }

  void TearDown() override {
    if (HasFailure()) {
      tmp_->Keep();
      std::cout << "temp dir kept: " << dir_ << "\n";
      for (const auto& p : logs_) {
        std::cout << "==== " << p.filename().string() << "\n" << test::ReadFile(p);
      }
    }
  }

  /// A travel-booking process started by Start.
  struct Started {
    Child child;
    std::string command;
    fs::path log;
  };

  /// Starts travel-booking with `args` after the global options; stdout and
  /// stderr go to a log file of their own, kept with the test's temp dir.
  Started Start(const std::vector<std::string>& args, const std::string& failpoint = "",
                const std::vector<std::string>& faults = {}, const fs::path& stdout_to = {}) {
    std::vector<std::string> argv = {kBinary, "--db", db_.string()};
    for (const auto& f : faults) {
      argv.push_back("--fault");
      argv.push_back(f);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    Started s;
    s.command = failpoint.empty() ? "" : "IDEM_FAILPOINT='" + failpoint + "' ";
    s.command += "travel-booking";
    for (size_t i = 1; i < argv.size(); ++i) s.command += " " + argv[i];

    char name[32];
    std::snprintf(name, sizeof(name), "%02zu-%s.log", logs_.size() + 1, args.front().c_str());
    s.log = dir_ / name;
    { std::ofstream(s.log) << "$ " << s.command << "\n"; }
    logs_.push_back(s.log);
    s.child =
        StartChild(argv, ChildEnvironment(failpoint), stdout_to.empty() ? s.log : stdout_to, s.log);
    return s;
  }

  /// Waits for a process started by Start.
  static ProcessExit Finish(const Started& s) {
    ProcessExit e = WaitChild(s.child);
    e.command = s.command;
    e.output = test::ReadFile(s.log);
    {
      std::ofstream(s.log, std::ios::app)
          << "["
          << (e.signaled ? "signal " + std::to_string(e.signal) : "exit " + std::to_string(e.code))
          << "]\n";
    }
    return e;
  }

  /// Runs travel-booking with `args` and waits for it.
  ProcessExit Travel(const std::vector<std::string>& args, const std::string& failpoint = "",
                     const std::vector<std::string>& faults = {}, const fs::path& stdout_to = {}) {
    return Finish(Start(args, failpoint, faults, stdout_to));
  }

  ProcessExit Run(const std::string& failpoint, const std::vector<std::string>& faults,
                  const std::string& intent_key = "") {
    std::vector<std::string> args = {"run", kTripSpec, "--input", std::string("@") + kTripInput};
    if (!intent_key.empty()) {
      args.push_back("--intent-key");
      args.push_back(intent_key);
    }
    return Travel(args, failpoint, faults);
  }

  ProcessExit Recover(const std::string& failpoint, const std::vector<std::string>& faults) {
    return Travel({"recover"}, failpoint, faults);
  }

  /// `submit` of the trip under `intent_key` (its own commit of the intent).
  ProcessExit Submit(const std::string& failpoint, const std::string& intent_key) {
    return Travel(
        {"submit", kTripSpec, "--input", std::string("@") + kTripInput, "--intent-key", intent_key},
        failpoint, {});
  }

  /// The client, after a crash, runs the trip again (under `intent_key`, a
  /// new one when empty): `run` says `said` and waits for the payment's
  /// approval, which commits it; then the journal and the ledger hold one
  /// saga (`saga_id` when given) with one effect per step.
  void RetryRunsTheTripOnce(const std::string& intent_key, const std::string& said,
                            const std::string& saga_id = "") {
    ProcessExit retry = Run("", {}, intent_key);
    EXPECT_TRUE(retry.Exited(RunExitFor("awaiting_approval"))) << retry;
    EXPECT_NE(retry.output.find(said), std::string::npos) << retry;
    std::string token;
    ASSERT_TRUE(OnePendingToken(&token));
    ProcessExit approve = Decide(token);
    EXPECT_TRUE(approve.Exited(cli::kExitOk)) << approve;

    Verdict v = Check(1);
    EXPECT_TRUE(v.violations.empty()) << v.Report();
    ASSERT_EQ(v.sagas.size(), 1u) << v.Report();
    if (!intent_key.empty()) EXPECT_EQ(v.sagas[0]["intent_key"], intent_key);
    if (!saga_id.empty()) EXPECT_EQ(v.sagas[0]["saga_id"], saga_id);
    EXPECT_EQ(v.sagas[0]["state"], "succeeded") << v.Report();
    EXPECT_EQ(v.ledger.effects.size(), static_cast<size_t>(kSteps)) << v.Report();
  }

  static std::vector<std::string> ApproveArgs(const std::string& token) {
    return {"approve", token, "--as", "maria", "--note", "within budget"};
  }
  static std::vector<std::string> RejectArgs(const std::string& token) {
    return {"reject", token, "--as", "maria", "--reason", "too expensive"};
  }

  /// `approve TOKEN` (or `reject TOKEN` when `approve` is false).
  ProcessExit Decide(const std::string& token, bool approve = true,
                     const std::string& failpoint = "",
                     const std::vector<std::string>& faults = {}) {
    return Travel(approve ? ApproveArgs(token) : RejectArgs(token), failpoint, faults);
  }

  /// `approvals --json`: the commits waiting for a person.
  bool PendingApprovals(Json* pending) {
    std::string error;
    if (!ReadJson({"approvals", "--json"}, pending, &error) || !pending->is_array()) {
      ADD_FAILURE() << "approvals --json: " << error << " " << pending->dump();
      return false;
    }
    return true;
  }

  /// The token of the one pending approval, which must be the payment's.
  bool OnePendingToken(std::string* token) {
    Json pending;
    if (!PendingApprovals(&pending)) return false;
    if (pending.size() != 1 || pending[0].value("step", "") != kTrip[kPaymentStep].id ||
        pending[0].value("token", "").empty()) {
      ADD_FAILURE() << "want exactly one pending approval, of charge_payment: " << pending.dump(2);
      return false;
    }
    *token = pending[0].value("token", "");
    return true;
  }

  /// `run` to the approval: the saga waits (exit 7), and its one token.
  bool RunToApproval(const std::vector<std::string>& faults, std::string* token) {
    ProcessExit run = Run("", faults);
    if (!run.Exited(cli::kExitAwaitingApproval)) {
      ADD_FAILURE() << "run should wait for approval: " << run;
      return false;
    }
    return OnePendingToken(token);
  }

  /// The commit token the journal holds for the payment step of `saga_id`
  /// ("" when the step has no preview), read from the journal database.
  std::string JournaledToken(const std::string& saga_id) {
    std::string phase, error;
    if (!QueryText(db_, "SELECT phase FROM steps WHERE saga_id = ? AND step_id = ?",
                   {saga_id, kTrip[kPaymentStep].id}, &phase, &error)) {
      ADD_FAILURE() << error;
      return "";
    }
    Json j = Json::parse(phase, nullptr, /*allow_exceptions=*/false);
    return j.is_object() ? j.value("token", "") : "";
  }

  /// How many commit tokens of `saga_id` were spent.
  int SpentTokens(const std::string& saga_id) {
    std::string n, error;
    if (!QueryText(db_, "SELECT COUNT(*) FROM consumed_tokens WHERE saga_id = ?", {saga_id}, &n,
                   &error)) {
      ADD_FAILURE() << error;
      return -1;
    }
    return std::atoi(n.c_str());
  }

  /// True, and counted as an injected crash, when `e` died by SIGKILL.
  static bool Crashed(const ProcessExit& e) {
    if (!e.KilledBySigkill()) return false;
    ++Totals().crashes;
    return true;
  }

  /// Runs a subcommand that prints JSON and parses its stdout.
  bool ReadJson(const std::vector<std::string>& args, Json* out, std::string* error) {
    fs::path json = dir_ / ("out-" + std::to_string(logs_.size() + 1) + ".json");
    ProcessExit e = Travel(args, "", {}, json);
    if (!e.Exited(cli::kExitOk)) {
      *error = e.Describe();
      return false;
    }
    *out = Json::parse(test::ReadFile(json), nullptr, /*allow_exceptions=*/false);
    if (out->is_discarded()) {
      *error = "`" + e.command + "` printed no valid JSON: " + test::ReadFile(json);
      return false;
    }
    return true;
  }

  /// `list --json`, then `status SAGA --json` of each saga, and the ledger.
  /// Adds a failure and returns false when one of them cannot be read.
  bool Observe(Verdict* v) {
    std::string error;
    Json list;
    if (!ReadJson({"list", "--json"}, &list, &error) || !list.is_array()) {
      ADD_FAILURE() << "list --json: " << error;
      return false;
    }
    v->sagas.clear();
    for (const Json& s : list) {
      Json status;
      if (!ReadJson({"status", s.value("saga_id", ""), "--json"}, &status, &error)) {
        ADD_FAILURE() << "status --json: " << error;
        return false;
      }
      v->sagas.push_back(status);
    }
    if (!ReadLedger(ledger_, &v->ledger, &error)) {
      ADD_FAILURE() << "ledger: " << error;
      return false;
    }
    return true;
  }

  /// Observes, runs the H5 checker and (with `count`: once per scenario, at
  /// its end) adds its counts to the sweep totals.
  Verdict Check(int expected_sagas, bool count = true) {
    Verdict v;
    if (!Observe(&v)) {
      v.violations.push_back("could not observe the journal and the ledger");
      return v;
    }
    CheckInvariants(expected_sagas, &v);
    if (!count) return v;
    Totals().duplicates += v.duplicates;
    Totals().lost += v.lost;
    Totals().orphans += v.orphans;
    return v;
  }

  /// The model's view of the one saga in the journal.
  bool ModelNow(bool reject_payment, Model* m, Verdict* v) {
    if (!Observe(v)) return false;
    if (v->sagas.size() != 1) {
      ADD_FAILURE() << "want one saga, found " << v->sagas.size();
      return false;
    }
    const Json& saga = v->sagas[0];
    m->saga = saga.value("state", "");
    m->reject_payment = reject_payment;
    const Json& steps = saga["steps"];
    if (!steps.is_array() || steps.size() != static_cast<size_t>(kSteps)) {
      ADD_FAILURE() << "unexpected steps: " << steps.dump();
      return false;
    }
    for (int i = 0; i < kSteps; ++i) {
      const Json& st = steps[i];
      ModelStep& ms = m->steps[i];
      ms.state = st.value("state", "");
      ms.attempt = st.value("attempts", 0);
      const std::string key = st.value("key", "");
      ms.applied = v->ledger.Effects(kTrip[i].action, key) > 0;
      ms.undo_applied = v->ledger.Effects(kTrip[i].undo, CompensationKey(key)) > 0;
      ms.decision = DecisionOf(saga, kTrip[i].id);
    }
    return true;
  }

  std::optional<test::TempDir> tmp_;  ///< removed when the test passed
  fs::path dir_;
  fs::path db_;
  fs::path ledger_;
  std::vector<fs::path> logs_;
};

std::string CaseName(std::string text) {
  for (char& ch : text) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return text;
}

/// The state a boundary leaves its step in, and the step's effects then.
struct BoundaryState {
  const char* step_state;
  int effects;
};

// The engine stages a first attempt's outcome, and an `unknown`, when its
// loss costs only a status lookup or a same-key resend (the flight, the
// hotel, the payment, and every compensation): it becomes durable with the
// next write before a call (the next `submitted`), a terminal state or the
// end of the drive. A crash in between finds the step as it was before.
bool OutcomeStaged(int step) { return kTrip[step].action_keys || kTrip[step].action_status; }
constexpr bool kUndoOutcomeStaged = true;  // every compensation honours keys

BoundaryState ForwardBoundary(const std::string& fp, int step) {
  if ((fp == "step.after_outcome" || fp == "unknown.after_recorded") && OutcomeStaged(step)) {
    return {"submitted", 1};
  }
  if (fp == "step.before_submitted" || fp == "preview.after_call") return {"planned", 0};
  if (fp == "preview.after_journal" || fp == "approval.after_commit") {
    return {"awaiting_approval", 0};
  }
  if (fp == "step.after_submitted") return {"submitted", 0};
  if (fp == "provider.after_apply" || fp == "step.after_call") return {"submitted", 1};
  if (fp == "unknown.after_recorded") return {"unknown", 1};  // with a lose_response fault
  return {"succeeded", 1};                                    // step.after_outcome
}

BoundaryState UndoBoundary(const std::string& fp) {
  if (fp == "compensation.after_outcome" && kUndoOutcomeStaged) return {"compensating", 1};
  if (fp == "compensation.before_submitted") return {"succeeded", 0};
  if (fp == "compensation.after_submitted") return {"compensating", 0};
  if (fp == "provider.after_undo" || fp == "compensation.after_call") return {"compensating", 1};
  return {"compensated", 1};  // compensation.after_outcome
}

// ---- row 1 (and 2): a crash at each forward boundary of the happy path

struct ForwardCase {
  const char* failpoint;
  int nth;
  const char* fault;           ///< for the crashing process only ("" for none)
  const char* expected_state;  ///< at the end: after recovery, and the approval if it waits
  bool in_approve;             ///< fires in `approve` (the payment's commit), after `run` waited
};

std::vector<ForwardCase> ForwardCases() {
  std::vector<ForwardCase> out = {{"saga.after_start", 1, "", "succeeded", false}};
  for (const char* fp : {"step.before_submitted", "step.after_submitted", "provider.after_apply",
                         "step.after_call", "step.after_outcome"}) {
    for (int n = 1; n < kSteps; ++n) {
      // The car (step 3) has neither keys nor status: left submitted without
      // an outcome, it can only be parked for a person.
      bool car_uncertain = n == 3 && std::string(fp) != "step.before_submitted" &&
                           std::string(fp) != "step.after_outcome";
      out.push_back({fp, n, "", car_uncertain ? "needs_attention" : "succeeded", false});
    }
    // The payment commits in `approve` (its first step failpoints there); a
    // two-phase step has no step.before_submitted: the approval is its
    // boundary (CrashApprovalTest).
    if (std::string(fp) != "step.before_submitted") {
      out.push_back({fp, 1, "", "succeeded", true});
    }
  }
  out.push_back({"saga.before_terminal", 1, "", "succeeded", true});
  out.push_back({"saga.after_terminal", 1, "", "succeeded", true});
  // unknown.after_recorded is reached only when a call's outcome is unknown.
  out.push_back({"unknown.after_recorded", 1, "flights.reserve=lose_response", "succeeded", false});
  out.push_back({"unknown.after_recorded", 1, "hotels.book=lose_response", "succeeded", false});
  out.push_back({"unknown.after_recorded", 1, "cars.rent=lose_response", "needs_attention", false});
  out.push_back({"unknown.after_recorded", 1, "payments.charge=lose_response", "succeeded", true});
  return out;
}

void PrintTo(const ForwardCase& c, std::ostream* os) {
  *os << (c.in_approve ? "approve: " : "run: ") << c.failpoint << "=kill@" << c.nth
      << (*c.fault ? std::string(" --fault ") + c.fault : "") << " => " << c.expected_state;
}

class CrashForwardTest : public CrashTest, public testing::WithParamInterface<ForwardCase> {};

TEST_P(CrashForwardTest, KillRecoverCheck) {
  const ForwardCase& c = GetParam();
  const std::string fp = c.failpoint;
  std::vector<std::string> faults;
  if (*c.fault != '\0') faults.push_back(c.fault);
  // The step the failpoint fires in (step failpoints), from the fault's tool
  // for unknown.after_recorded.
  int target = -1;
  if (fp.rfind("step.", 0) == 0 || fp.rfind("provider.", 0) == 0) {
    target = c.in_approve ? kPaymentStep : c.nth - 1;
  }
  for (int i = 0; i < kSteps && !faults.empty(); ++i) {
    if (faults[0].rfind(std::string(kTrip[i].action) + "=", 0) == 0) target = i;
  }

  // The model used by the nested tests agrees the failpoint is reached, in
  // the process it is armed in.
  if (faults.empty()) {
    Predictor p{Model()};
    Prediction run = p.Drive();
    EXPECT_EQ(run.final_state, "awaiting_approval");
    Prediction armed = c.in_approve ? p.Decide(/*approve=*/true) : run;
    EXPECT_TRUE(Reaches(armed.hits, fp, c.nth)) << Join(armed.hits, ", ");
  }

  const std::string kill = fp + "=kill@" + std::to_string(c.nth);
  std::string token;
  ProcessExit crash;
  if (c.in_approve) {
    ASSERT_TRUE(RunToApproval({}, &token));
    crash = Decide(token, /*approve=*/true, kill, faults);
  } else {
    crash = Run(kill, faults);
  }
  ASSERT_TRUE(Crashed(crash)) << crash;

  // The boundary is where its name says.
  Verdict before;
  ASSERT_TRUE(Observe(&before));
  // `run` records the intent with the first `submitted` (Engine::SubmitAndRun),
  // and `saga_started` is staged too: before it nothing is durable.
  const bool before_first_call =
      fp == "saga.after_start" || (fp == "step.before_submitted" && c.nth == 1 && !c.in_approve);
  if (before_first_call) {
    EXPECT_TRUE(before.sagas.empty()) << before.Report();
    EXPECT_TRUE(before.ledger.effects.empty()) << before.Report();
    // The client, who got no answer, runs the trip again: one saga, once.
    RetryRunsTheTripOnce("", "(new, intent key");
    return;
  }
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  const std::string sid = saga0.value("saga_id", "");
  if (fp == "saga.after_terminal") {
    EXPECT_EQ(saga0["state"], "succeeded") << before.Report();
  } else {
    EXPECT_EQ(saga0["state"], "running") << before.Report();
  }
  if (target >= 0) {
    BoundaryState b = ForwardBoundary(fp, target);
    const Json& st = saga0["steps"][target];
    EXPECT_EQ(st["state"], b.step_state) << before.Report();
    EXPECT_EQ(before.ledger.Effects(kTrip[target].action, st.value("key", "")), b.effects)
        << before.Report();
    for (int i = 0; i < kSteps; ++i) {
      // Before its `submitted`, the previous step's staged outcome is not
      // durable yet (its effect is, and a recovery finds it again).
      const bool staged =
          i == target - 1 && fp == "step.before_submitted" && OutcomeStaged(i) && !c.in_approve;
      const char* want = i < target   ? (staged ? "submitted" : "succeeded")
                         : i > target ? "planned"
                                      : nullptr;
      if (want != nullptr) {
        EXPECT_EQ(saga0["steps"][i].value("state", ""), want) << before.Report();
      }
    }
  } else {
    EXPECT_EQ(before.ledger.effects.size(), static_cast<size_t>(kSteps)) << before.Report();
  }
  if (c.in_approve) {
    EXPECT_EQ(DecisionOf(saga0, kTrip[kPaymentStep].id), "approved") << before.Report();
    EXPECT_EQ(SpentTokens(sid), 1) << "the approval spends its token with `submitted`";
  }

  // A crash before the approval leaves the saga waiting for it again.
  const std::string after_recovery = std::string(c.expected_state) == "succeeded" && !c.in_approve
                                         ? "awaiting_approval"
                                         : c.expected_state;
  if (faults.empty()) {  // the model predicts the recovery
    Model m;
    Verdict now;
    ASSERT_TRUE(ModelNow(/*reject_payment=*/false, &m, &now));
    EXPECT_EQ(Predictor(m).Drive().final_state, after_recovery);
  }

  ProcessExit rec = Recover("", {});
  EXPECT_TRUE(rec.Exited(RecoverExitFor(saga0.value("state", ""), after_recovery))) << rec;

  if (after_recovery == "awaiting_approval") {
    Verdict waiting = Check(1, /*count=*/false);
    EXPECT_TRUE(waiting.violations.empty()) << waiting.Report();
    ASSERT_EQ(waiting.sagas.size(), 1u) << waiting.Report();
    EXPECT_EQ(waiting.sagas[0]["state"], "awaiting_approval") << waiting.Report();
    ASSERT_TRUE(OnePendingToken(&token)) << waiting.Report();
    ProcessExit approve = Decide(token);
    EXPECT_TRUE(approve.Exited(cli::kExitOk)) << approve;
  }

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u) << v.Report();
  const Json& saga = v.sagas[0];
  EXPECT_EQ(saga["saga_id"], sid);
  EXPECT_EQ(saga["state"], c.expected_state) << v.Report();

  // No blind retry of the providers that do not deduplicate: every call they
  // received applied an effect.
  for (int i = 0; i < kSteps; ++i) {
    const std::string key = saga["steps"][i].value("key", "");
    if (!kTrip[i].action_keys) {
      EXPECT_EQ(v.ledger.Calls(kTrip[i].action, key), v.ledger.Effects(kTrip[i].action, key))
          << kTrip[i].id << "\n"
          << v.Report();
    }
  }

  const std::string pay_key = saga["steps"][kPaymentStep].value("key", "");
  if (std::string(c.expected_state) == "needs_attention") {
    // The car: submitted, maybe rented, and no way to know: parked with zero
    // blind retries, and nothing after it runs (not even the preview).
    const Json& car = saga["steps"][2];
    const std::string key = car.value("key", "");
    const int sent = fp == "step.after_submitted" ? 0 : 1;  // killed before or after the call
    EXPECT_EQ(car["state"], "needs_attention") << v.Report();
    EXPECT_EQ(v.ledger.Calls("cars.rent", key), sent) << v.Report();
    EXPECT_EQ(v.ledger.Effects("cars.rent", key), sent) << v.Report();
    EXPECT_NE(saga.value("reason", "").find(key), std::string::npos)
        << "the reason should name the key a person must check\n"
        << v.Report();
    EXPECT_EQ(saga["steps"][kPaymentStep]["state"], "planned") << v.Report();
    EXPECT_EQ(v.ledger.Calls("payments.charge", pay_key), 0) << v.Report();
    EXPECT_EQ(v.ledger.Calls("payments.preview", pay_key), 0) << v.Report();
  } else {
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_EQ(saga["steps"][i]["state"], "succeeded") << kTrip[i].id << "\n" << v.Report();
    }
    EXPECT_EQ(SpentTokens(sid), 1) << v.Report();
  }

  const BoundaryState b = target >= 0 ? ForwardBoundary(fp, target) : BoundaryState{"", 0};
  if (target >= 0 && b.effects == 1 && std::string(b.step_state) != "succeeded" &&
      kTrip[target].action_status) {
    // Applied, answer lost: resolved by a status lookup, not by a re-call.
    const std::string key = saga["steps"][target].value("key", "");
    EXPECT_GE(v.ledger.Lookups(SplitTool(kTrip[target].action).first, key), 1) << v.Report();
    if (!kTrip[target].action_keys) {
      EXPECT_EQ(v.ledger.Calls(kTrip[target].action, key), 1) << v.Report();
    }
    EXPECT_EQ(v.ledger.Effects(kTrip[target].action, key), 1) << v.Report();
  }

  if (c.in_approve) {
    // Row 16: the approval replayed after the recovery: the recorded
    // outcome, no new call.
    ProcessExit again = Decide(token);
    EXPECT_TRUE(again.Exited(cli::kExitOk)) << again;
    Verdict replayed = Check(1, /*count=*/false);
    EXPECT_TRUE(replayed.violations.empty()) << replayed.Report();
    EXPECT_EQ(replayed.ledger.Calls("payments.charge", pay_key),
              v.ledger.Calls("payments.charge", pay_key))
        << replayed.Report();
    EXPECT_EQ(replayed.ledger.effects.size(), v.ledger.effects.size()) << replayed.Report();
  }
}

INSTANTIATE_TEST_SUITE_P(CrashForward, CrashForwardTest, testing::ValuesIn(ForwardCases()),
                         [](const testing::TestParamInfo<ForwardCase>& info) {
                           std::string name = CaseName(std::string(info.param.failpoint) + "_" +
                                                       std::to_string(info.param.nth));
                           if (*info.param.fault != '\0') name += "_" + CaseName(info.param.fault);
                           if (info.param.in_approve) name += "_in_approve";
                           return name;
                         });

// ---- row 1, B0/B1: the client retries the same intent key

// `submit` records the intent in its own commit (intent.*); `run` records
// it with the first step's `submitted` (SubmitAndRun): killed at
// saga.after_start nothing is durable, killed at step.after_submitted the
// intent is, with step 1 submitted and not yet called.
struct IntentCase {
  const char* command;  ///< the crashing process's: "submit" or "run"
  const char* failpoint;
  bool committed;  ///< the intent is durable at the failpoint
};

void PrintTo(const IntentCase& c, std::ostream* os) {
  *os << c.command << ": " << c.failpoint << "=kill";
}

class CrashIntentTest : public CrashTest, public testing::WithParamInterface<IntentCase> {};

TEST_P(CrashIntentTest, ClientRetryMakesOneSaga) {
  const IntentCase& c = GetParam();
  const std::string fp = c.failpoint;
  const std::string intent = std::string("trip-") + c.command + "-" + CaseName(fp);
  ProcessExit crash = std::string(c.command) == "submit" ? Submit(fp + "=kill", intent)
                                                         : Run(fp + "=kill", {}, intent);
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), c.committed ? 1u : 0u) << before.Report();
  if (c.committed) {
    EXPECT_EQ(before.sagas[0]["intent_key"], intent);
    const bool with_first_step = std::string(c.command) == "run";
    EXPECT_EQ(before.sagas[0]["state"], with_first_step ? "running" : "pending");
    EXPECT_EQ(before.sagas[0]["steps"][0]["state"], with_first_step ? "submitted" : "planned");
  }
  EXPECT_TRUE(before.ledger.effects.empty()) << before.Report();

  const std::string first = c.committed ? before.sagas[0].value("saga_id", "") : "";
  RetryRunsTheTripOnce(
      intent, c.committed ? "(existing: same intent key and content" : "(new, intent key", first);
}

INSTANTIATE_TEST_SUITE_P(CrashIntent, CrashIntentTest,
                         testing::Values(IntentCase{"submit", "intent.before_commit", false},
                                         IntentCase{"submit", "intent.after_commit", true},
                                         IntentCase{"run", "saga.after_start", false},
                                         IntentCase{"run", "step.after_submitted", true}),
                         [](const testing::TestParamInfo<IntentCase>& info) {
                           return std::string(info.param.command) + "_" +
                                  CaseName(info.param.failpoint);
                         });

// ---- row 3: a crash during the rollback, at each compensation index

struct UndoCase {
  const char* failpoint;
  int nth;         ///< the j-th compensation: 1 = the car, 2 = the hotel, 3 = the flight
  bool by_person;  ///< `reject TOKEN` rolls back; else the card is declined at `approve`
};

std::vector<UndoCase> UndoCases() {
  std::vector<UndoCase> out;
  for (const char* fp :
       {"compensation.before_submitted", "compensation.after_submitted", "provider.after_undo",
        "compensation.after_call", "compensation.after_outcome"}) {
    for (int j = 1; j <= 3; ++j) out.push_back({fp, j, false});
    out.push_back({fp, 1, true});
  }
  return out;
}

void PrintTo(const UndoCase& c, std::ostream* os) {
  *os << c.failpoint << "=kill@" << c.nth
      << (c.by_person ? " in reject" : std::string(" in approve --fault ") + kRejectPayment);
}

class CrashCompensationTest : public CrashTest, public testing::WithParamInterface<UndoCase> {};

TEST_P(CrashCompensationTest, KillRecoverCheck) {
  const UndoCase& c = GetParam();
  const std::string fp = c.failpoint;
  std::vector<std::string> faults;
  if (!c.by_person) faults.push_back(kRejectPayment);
  const int target = kPaymentStep - c.nth;  // undone in reverse order

  // The rollback runs in the process that decides: `approve` (the commit is
  // refused) or `reject`.
  Model fresh;
  fresh.reject_payment = !c.by_person;
  Predictor p(fresh);
  EXPECT_EQ(p.Drive().final_state, "awaiting_approval");
  Prediction decided = p.Decide(/*approve=*/!c.by_person);
  EXPECT_TRUE(Reaches(decided.hits, fp, c.nth)) << Join(decided.hits, ", ");
  EXPECT_EQ(decided.final_state, "compensated");

  std::string token;
  ASSERT_TRUE(RunToApproval(faults, &token));
  ProcessExit crash = Decide(token, !c.by_person, fp + "=kill@" + std::to_string(c.nth), faults);
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  // The move to compensating is staged, durable with the first
  // `compensation_submitted`.
  const bool before_first_undo = fp == "compensation.before_submitted" && c.nth == 1;
  EXPECT_EQ(saga0["state"], before_first_undo ? "running" : "compensating") << before.Report();
  EXPECT_EQ(saga0["steps"][kPaymentStep]["state"], "failed") << before.Report();
  BoundaryState b = UndoBoundary(fp);
  const std::string target_key = saga0["steps"][target].value("key", "");
  EXPECT_EQ(saga0["steps"][target]["state"], b.step_state) << before.Report();
  EXPECT_EQ(before.ledger.Effects(kTrip[target].undo, CompensationKey(target_key)), b.effects)
      << before.Report();
  for (int i = 0; i < kPaymentStep; ++i) {
    // Before its `compensation_submitted`, the previous undo's staged
    // outcome is not durable yet.
    const bool staged =
        i == target + 1 && fp == "compensation.before_submitted" && kUndoOutcomeStaged;
    const char* want = i > target   ? (staged ? "compensating" : "compensated")
                       : i < target ? "succeeded"
                                    : nullptr;
    if (want != nullptr) {
      EXPECT_EQ(saga0["steps"][i].value("state", ""), want) << before.Report();
    }
  }

  // The payment already failed in the journal; the flag is passed for realism.
  ProcessExit rec = Recover("", faults);
  EXPECT_TRUE(rec.Exited(RecoverExitFor("compensating", "compensated"))) << rec;

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u) << v.Report();
  const Json& saga = v.sagas[0];
  EXPECT_EQ(saga["state"], "compensated") << v.Report();
  EXPECT_EQ(saga["steps"][kPaymentStep]["state"], "failed") << v.Report();
  int64_t previous = 0;
  for (int i = kPaymentStep - 1; i >= 0; --i) {  // the order of the undos: car, hotel, flight
    const std::string key = saga["steps"][i].value("key", "");
    EXPECT_EQ(saga["steps"][i]["state"], "compensated") << v.Report();
    EXPECT_EQ(v.ledger.Effects(kTrip[i].action, key), 1) << v.Report();
    EXPECT_EQ(v.ledger.Effects(kTrip[i].undo, CompensationKey(key)), 1) << v.Report();
    int64_t id = v.ledger.EffectId(kTrip[i].undo, CompensationKey(key));
    EXPECT_GT(id, previous) << kTrip[i].undo << " out of reverse order\n" << v.Report();
    previous = id;
  }
  const std::string pay_key = saga["steps"][kPaymentStep].value("key", "");
  EXPECT_EQ(v.ledger.Effects("payments.charge", pay_key), 0) << v.Report();
  // The declined card was called once (and refused); a rejection calls nothing.
  EXPECT_EQ(v.ledger.Calls("payments.charge", pay_key), c.by_person ? 0 : 1) << v.Report();
  EXPECT_EQ(v.ledger.Calls("payments.refund", CompensationKey(pay_key)), 0) << v.Report();
  EXPECT_EQ(v.ledger.effects.size(), 6u) << v.Report();  // 3 actions, 3 undos
}

INSTANTIATE_TEST_SUITE_P(CrashCompensation, CrashCompensationTest, testing::ValuesIn(UndoCases()),
                         [](const testing::TestParamInfo<UndoCase>& info) {
                           return CaseName(std::string(info.param.failpoint) + "_" +
                                           std::to_string(info.param.nth)) +
                                  (info.param.by_person ? "_rejected" : "_declined");
                         });

// ---- row 4: the recovery itself is killed, at seeded random failpoints

constexpr int kNestedCases = 30;
constexpr uint64_t kDefaultSeed = 0x1de3c4a5b00c1e5ULL;

uint64_t BaseSeed() {
  const char* env = std::getenv("IDEM_CRASH_SEED");
  if (env == nullptr || *env == '\0') return kDefaultSeed;
  return std::strtoull(env, nullptr, 0);
}

/// A kill at the k-th hit of `hits`.
std::string KillAt(const std::vector<std::string>& hits, size_t k) {
  auto nth = std::count(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(k) + 1, hits[k]);
  return hits[k] + "=kill@" + std::to_string(nth);
}

/// A kill at a uniformly chosen hit among the first `limit` of `hits`.
std::string PickKill(const std::vector<std::string>& hits, size_t limit, std::mt19937_64& rng) {
  return KillAt(hits, std::uniform_int_distribution<size_t>(0, limit - 1)(rng));
}

class CrashNestedTest : public CrashTest, public testing::WithParamInterface<int> {};

TEST_P(CrashNestedTest, KillRecoveryThenRecover) {
  const uint64_t seed = BaseSeed();
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(GetParam())};
  std::mt19937_64 rng(seq);
  std::cout << "IDEM_CRASH_SEED=" << seed << " case " << GetParam() << "\n";
  RecordProperty("seed", std::to_string(seed));

  // How the person decides: 0 approves, 1 approves and the card is declined
  // at the commit, 2 rejects.
  const int mode = static_cast<int>(rng() % 3);
  const bool reject_payment = mode == 1;
  const bool approve = mode != 2;
  const std::string verb = approve ? "approve" : "reject";
  std::vector<std::string> faults;
  if (reject_payment) faults.push_back(kRejectPayment);
  std::vector<std::string> chain = {mode == 0   ? "(approved)"
                                    : mode == 1 ? "(approved, card declined)"
                                                : "(rejected)"};
  auto where = [&] { return "seed " + std::to_string(seed) + " chain " + Join(chain, " -> "); };

  // The first crash, in `run` or in the decision, anywhere but after the
  // terminal commit (which would leave nothing to recover).
  Model fresh;
  fresh.reject_payment = reject_payment;
  Predictor whole(fresh);
  const Prediction run = whole.Drive();
  const Prediction decided = whole.Decide(approve);
  ASSERT_EQ(run.final_state, "awaiting_approval");
  ASSERT_GE(decided.hits.size(), 2u);
  // A kill before `run`'s first write (the intent rides with step 1's
  // `submitted`) leaves nothing to recover, only a client that runs again
  // (CrashIntentTest, CrashForwardTest): the chains start from that write.
  const auto first_write = std::find(run.hits.begin(), run.hits.end(), "step.after_submitted");
  ASSERT_NE(first_write, run.hits.end());
  const size_t k =
      std::uniform_int_distribution<size_t>(static_cast<size_t>(first_write - run.hits.begin()),
                                            run.hits.size() + decided.hits.size() - 2)(rng);
  std::string token;
  std::string kill;
  ProcessExit crash;
  if (k < run.hits.size()) {
    kill = KillAt(run.hits, k);
    chain.push_back("run " + kill);
    crash = Run(kill, faults);
  } else {
    kill = KillAt(decided.hits, k - run.hits.size());
    ASSERT_TRUE(RunToApproval(faults, &token));
    chain.push_back("run");
    chain.push_back(verb + " " + kill);
    crash = Decide(token, approve, kill, faults);
  }
  ASSERT_TRUE(Crashed(crash)) << where() << "\n" << crash;

  // 1-3 more processes killed in turn, each at a failpoint the model says it
  // reaches: `recover`, or the person's decision while the saga waits for it.
  const int nested = 1 + static_cast<int>(rng() % 3);
  int nested_done = 0;
  for (int round = 0; nested_done < nested && round < 8; ++round) {
    Model m;
    Verdict now;
    ASSERT_TRUE(ModelNow(reject_payment, &m, &now));
    Predictor next(m);
    const bool deciding = next.Undecided();
    Prediction p = deciding ? next.Decide(approve) : next.Drive();
    if (deciding) {
      ASSERT_TRUE(OnePendingToken(&token)) << where();
    }
    if (p.hits.empty()) {
      if (p.final_state == m.saga) break;  // the last kill left nothing to do
      // No failpoint on the way (a recovery that finds the preview journaled
      // and only marks the saga waiting): run it whole.
      chain.push_back("recover");
      ProcessExit rec = Recover("", faults);
      ASSERT_TRUE(rec.Exited(RecoverExitFor(m.saga, p.final_state))) << where() << "\n" << rec;
      continue;
    }
    kill = PickKill(p.hits, p.hits.size(), rng);
    chain.push_back((deciding ? verb : std::string("recover")) + " " + kill);
    ProcessExit e = deciding ? Decide(token, approve, kill, faults) : Recover(kill, faults);
    ASSERT_TRUE(Crashed(e)) << where() << "\npredicted hits: " << Join(p.hits, ", ") << "\n"
                            << e << "\n"
                            << now.Report();
    ++nested_done;
  }
  EXPECT_GE(nested_done, 1) << where();

  // Then unkilled processes until the saga settles, as the model predicts.
  Model m;
  Verdict now;
  ASSERT_TRUE(ModelNow(reject_payment, &m, &now));
  Predictor rest(m);
  for (int round = 0; round < 4; ++round) {
    const std::string from = rest.model().saga;
    const bool deciding = rest.Undecided();
    Prediction p = deciding ? rest.Decide(approve) : rest.Drive();
    if (!deciding && p.hits.empty() && p.final_state == from) break;  // settled
    if (deciding) {
      ASSERT_TRUE(OnePendingToken(&token)) << where();
    }
    chain.push_back(deciding ? verb : "recover");
    ProcessExit e = deciding ? Decide(token, approve, "", faults) : Recover("", faults);
    EXPECT_TRUE(
        e.Exited(deciding ? RunExitFor(p.final_state) : RecoverExitFor(from, p.final_state)))
        << where() << "\n"
        << e;
  }
  const std::string final_state = rest.model().saga;
  std::cout << "chain: " << Join(chain, " -> ") << " => " << final_state << "\n";

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << where() << "\n" << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], final_state) << where() << "\n" << v.Report();
  EXPECT_TRUE(IsTerminal(final_state) || final_state == "needs_attention") << where();
  // Recovery is idempotent: once more changes nothing.
  ProcessExit again = Recover("", faults);
  EXPECT_TRUE(again.Exited(cli::kExitOk)) << again;
  Verdict after = Check(1, /*count=*/false);
  EXPECT_TRUE(after.violations.empty()) << after.Report();
  EXPECT_EQ(after.ledger.effects.size(), v.ledger.effects.size()) << after.Report();
  // So is the decision: replayed, it reports the recorded outcome and calls
  // nothing.
  if (!token.empty()) {
    ProcessExit replay = Decide(token, approve, "", faults);
    EXPECT_TRUE(replay.Exited(RunExitFor(final_state))) << where() << "\n" << replay;
    Verdict replayed = Check(1, /*count=*/false);
    EXPECT_TRUE(replayed.violations.empty()) << replayed.Report();
    EXPECT_EQ(replayed.ledger.calls.size(), after.ledger.calls.size()) << replayed.Report();
    EXPECT_EQ(replayed.ledger.effects.size(), v.ledger.effects.size()) << replayed.Report();
  }
}

INSTANTIATE_TEST_SUITE_P(CrashNested, CrashNestedTest, testing::Range(0, kNestedCases),
                         [](const testing::TestParamInfo<int>& info) {
                           return "case_" + std::to_string(info.param);
                         });

// ---- rows 13-16: the approval of the payment, killed and replayed

/// The effects and calls of the payment step of the saga in `v`.
struct PaymentView {
  std::string key;
  int effects = 0;
  int charges = 0;  ///< payments.charge calls received (lookups and previews apart)
  int previews = 0;
};

PaymentView PaymentOf(const Verdict& v) {
  PaymentView p;
  if (v.sagas.size() != 1) return p;
  p.key = v.sagas[0]["steps"][kPaymentStep].value("key", "");
  p.effects = v.ledger.Effects("payments.charge", p.key);
  p.charges = v.ledger.Calls("payments.charge", p.key);
  p.previews = v.ledger.Calls("payments.preview", p.key);
  return p;
}

// (a) SIGKILL in `run` after the preview answered (before it is journaled)
// and after it was journaled with its token (before the saga is marked
// waiting): recovery leaves the saga waiting for one approval, with a fresh
// token in the first case and the journaled one in the second.
class CrashPreviewTest : public CrashTest, public testing::WithParamInterface<const char*> {};

TEST_P(CrashPreviewTest, KillRecoverApprove) {
  const std::string fp = GetParam();
  const bool journaled = fp == "preview.after_journal";
  EXPECT_TRUE(Reaches(Predictor(Model()).Drive().hits, fp, 1));

  ProcessExit crash = Run(fp + "=kill", {});
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  const std::string sid = saga0.value("saga_id", "");
  const std::string pay = kTrip[kPaymentStep].id;
  EXPECT_EQ(saga0["state"], "running") << before.Report();
  for (int i = 0; i < kPaymentStep; ++i) {
    EXPECT_EQ(saga0["steps"][i]["state"], "succeeded") << before.Report();
  }
  EXPECT_EQ(saga0["steps"][kPaymentStep]["state"], journaled ? "awaiting_approval" : "planned")
      << before.Report();
  EXPECT_EQ(JournalCount(saga0, pay, "previewed"), journaled ? 1 : 0) << before.Report();
  EXPECT_EQ(PaymentOf(before).previews, 1) << before.Report();
  EXPECT_EQ(PaymentOf(before).charges, 0) << before.Report();
  const std::string token0 = JournaledToken(sid);
  EXPECT_EQ(token0.empty(), !journaled) << token0;
  // Not listed yet: `approvals` shows sagas marked waiting, and this one is
  // still running until a recovery finds its step waiting.
  Json pending;
  ASSERT_TRUE(PendingApprovals(&pending));
  EXPECT_TRUE(pending.empty()) << pending.dump(2);

  Model m;
  Verdict now;
  ASSERT_TRUE(ModelNow(false, &m, &now));
  EXPECT_EQ(Predictor(m).Drive().final_state, "awaiting_approval");
  ProcessExit rec = Recover("", {});
  EXPECT_TRUE(rec.Exited(RecoverExitFor("running", "awaiting_approval"))) << rec;

  Verdict waiting = Check(1, /*count=*/false);
  EXPECT_TRUE(waiting.violations.empty()) << waiting.Report();
  ASSERT_EQ(waiting.sagas.size(), 1u);
  EXPECT_EQ(waiting.sagas[0]["state"], "awaiting_approval") << waiting.Report();
  std::string token;
  ASSERT_TRUE(OnePendingToken(&token)) << waiting.Report();
  EXPECT_EQ(JournaledToken(sid), token);
  EXPECT_EQ(JournalCount(waiting.sagas[0], pay, "previewed"), 1) << waiting.Report();
  if (journaled) {
    EXPECT_EQ(token, token0) << "the journaled preview stands: no second preview";
    EXPECT_EQ(PaymentOf(waiting).previews, 1) << waiting.Report();
  } else {
    EXPECT_EQ(PaymentOf(waiting).previews, 2) << "the unjournaled preview is asked again";
  }
  EXPECT_EQ(PaymentOf(waiting).charges, 0) << waiting.Report();

  ProcessExit approve = Decide(token);
  EXPECT_TRUE(approve.Exited(cli::kExitOk)) << approve;
  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], "succeeded") << v.Report();
  EXPECT_EQ(PaymentOf(v).effects, 1) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, 1) << v.Report();
  EXPECT_EQ(SpentTokens(sid), 1);
}

INSTANTIATE_TEST_SUITE_P(CrashPreview, CrashPreviewTest,
                         testing::Values("preview.after_call", "preview.after_journal"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return CaseName(info.param);
                         });

// (b) SIGKILL in `approve` (or `reject`) once the decision is journaled,
// before the token is spent and the tool called: `recover`, or the person
// repeating the command, carries the decision out once.
struct DecisionCase {
  bool approve;
  bool by_replay;  ///< finished by the same decision again, not by `recover`
};

void PrintTo(const DecisionCase& c, std::ostream* os) {
  *os << (c.approve ? "approve" : "reject") << ", killed at approval.after_commit, then "
      << (c.by_replay ? "the same decision again" : "recover");
}

class CrashDecisionTest : public CrashTest, public testing::WithParamInterface<DecisionCase> {};

TEST_P(CrashDecisionTest, KillAfterDecisionRecoverCheck) {
  const bool approve = GetParam().approve;
  const bool by_replay = GetParam().by_replay;
  const char* const final_state = approve ? "succeeded" : "compensated";
  Predictor p{Model()};
  p.Drive();
  Prediction decided = p.Decide(approve);
  EXPECT_TRUE(Reaches(decided.hits, "approval.after_commit", 1)) << Join(decided.hits, ", ");
  EXPECT_EQ(decided.final_state, final_state);

  std::string token;
  ASSERT_TRUE(RunToApproval({}, &token));
  ProcessExit crash = Decide(token, approve, "approval.after_commit=kill");
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  const std::string sid = saga0.value("saga_id", "");
  EXPECT_EQ(saga0["state"], "running") << before.Report();
  EXPECT_EQ(saga0["steps"][kPaymentStep]["state"], "awaiting_approval") << before.Report();
  EXPECT_EQ(DecisionOf(saga0, kTrip[kPaymentStep].id), approve ? "approved" : "rejected")
      << before.Report();
  EXPECT_EQ(SpentTokens(sid), 0) << "journaled, not yet spent";
  EXPECT_EQ(PaymentOf(before).charges, 0) << before.Report();

  Model m;
  Verdict now;
  ASSERT_TRUE(ModelNow(false, &m, &now));
  EXPECT_EQ(Predictor(m).Drive().final_state, final_state);
  if (by_replay) {  // Engine::Decide: decided before, so drive on
    ProcessExit again = Decide(token, approve);
    EXPECT_TRUE(again.Exited(RunExitFor(final_state))) << again;
  } else {
    ProcessExit rec = Recover("", {});
    EXPECT_TRUE(rec.Exited(RecoverExitFor("running", final_state))) << rec;
  }

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], final_state) << v.Report();
  EXPECT_EQ(PaymentOf(v).effects, approve ? 1 : 0) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, approve ? 1 : 0) << v.Report();
  EXPECT_EQ(SpentTokens(sid), approve ? 1 : 0);
  EXPECT_EQ(JournalCount(v.sagas[0], kTrip[kPaymentStep].id, approve ? "approved" : "rejected"), 1)
      << v.Report();
  EXPECT_EQ(v.ledger.effects.size(), approve ? 4u : 6u) << v.Report();

  // The same decision again: the recorded outcome, nothing called.
  ProcessExit again = Decide(token, approve);
  EXPECT_TRUE(again.Exited(RunExitFor(final_state))) << again;
  Verdict replayed = Check(1, /*count=*/false);
  EXPECT_EQ(replayed.ledger.calls.size(), v.ledger.calls.size()) << replayed.Report();
  EXPECT_EQ(replayed.ledger.effects.size(), v.ledger.effects.size()) << replayed.Report();
}

INSTANTIATE_TEST_SUITE_P(CrashDecision, CrashDecisionTest,
                         testing::Values(DecisionCase{true, false}, DecisionCase{false, false},
                                         DecisionCase{true, true}, DecisionCase{false, true}),
                         [](const testing::TestParamInfo<DecisionCase>& info) {
                           return std::string(info.param.approve ? "approved" : "rejected") +
                                  (info.param.by_replay ? "_then_replayed" : "_then_recovered");
                         });

// (c), a kill in `approve` after the token is spent (step.after_submitted,
// provider.after_apply, step.after_call, ...), is CrashForward's *_in_approve.

class CrashApprovalTest : public CrashTest {};

// (d) Row 16, sequential: the approval replayed after the commit.
TEST_F(CrashApprovalTest, ReplayAfterSuccessChargesOnce) {
  ProcessExit first = Run("", {}, "trip-replay");
  ASSERT_TRUE(first.Exited(cli::kExitAwaitingApproval)) << first;
  std::string token;
  ASSERT_TRUE(OnePendingToken(&token));
  // The agent repeats itself while the saga waits: the same saga, the same
  // preview and token.
  ProcessExit repeat = Run("", {}, "trip-replay");
  EXPECT_TRUE(repeat.Exited(cli::kExitAwaitingApproval)) << repeat;
  std::string same;
  ASSERT_TRUE(OnePendingToken(&same));
  EXPECT_EQ(same, token);
  Verdict waiting = Check(1, /*count=*/false);
  EXPECT_EQ(PaymentOf(waiting).previews, 1) << waiting.Report();

  ProcessExit approve = Decide(token);
  ASSERT_TRUE(approve.Exited(cli::kExitOk)) << approve;
  EXPECT_NE(approve.output.find("outcome: succeeded"), std::string::npos) << approve;
  Json pending;
  ASSERT_TRUE(PendingApprovals(&pending));
  EXPECT_TRUE(pending.empty()) << pending.dump(2);
  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, 1) << v.Report();

  for (int i = 0; i < 2; ++i) {
    ProcessExit again = Decide(token);
    EXPECT_TRUE(again.Exited(cli::kExitOk)) << again;
    EXPECT_NE(again.output.find("outcome: succeeded"), std::string::npos) << again;
  }
  // The other decision on a decided commit is refused.
  ProcessExit reject = Decide(token, /*approve=*/false);
  EXPECT_TRUE(reject.Exited(cli::kExitAlreadyDecided)) << reject;
  EXPECT_NE(reject.output.find("already approved"), std::string::npos) << reject;

  Verdict after = Check(1, /*count=*/false);
  EXPECT_TRUE(after.violations.empty()) << after.Report();
  ASSERT_EQ(after.sagas.size(), 1u);
  EXPECT_EQ(after.sagas[0]["state"], "succeeded") << after.Report();
  EXPECT_EQ(PaymentOf(after).effects, 1) << after.Report();
  EXPECT_EQ(PaymentOf(after).charges, 1) << "a replay calls nothing\n" << after.Report();
  EXPECT_EQ(after.ledger.calls.size(), v.ledger.calls.size()) << after.Report();
  EXPECT_EQ(after.ledger.effects.size(), static_cast<size_t>(kSteps)) << after.Report();
  EXPECT_EQ(JournalCount(after.sagas[0], kTrip[kPaymentStep].id, "submitted"), 1) << after.Report();
}

// (e) Row 16, concurrent: two `approve` processes on one token, started
// together and paused at B4 (step.after_submitted). The embedded journal's
// driver lock (cli.cc, DriverLock) runs them one after the other; the second
// finds the approval recorded and reports the saga's outcome. Guaranteed:
// one effect, one call, the saga succeeded; and here both exit 0.
TEST_F(CrashApprovalTest, ConcurrentApprovalsChargeOnce) {
  std::string token;
  ASSERT_TRUE(RunToApproval({}, &token));
  const std::string pause = "step.after_submitted=sleep(300)";
  Started first = Start(ApproveArgs(token), pause);
  Started second = Start(ApproveArgs(token), pause);
  ProcessExit a = Finish(first);
  ProcessExit b = Finish(second);
  EXPECT_TRUE(a.Exited(cli::kExitOk)) << a;
  EXPECT_TRUE(b.Exited(cli::kExitOk)) << b;

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], "succeeded") << v.Report();
  EXPECT_EQ(PaymentOf(v).effects, 1) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, 1) << v.Report();
  EXPECT_EQ(SpentTokens(v.sagas[0].value("saga_id", "")), 1);
  EXPECT_EQ(JournalCount(v.sagas[0], kTrip[kPaymentStep].id, "approved"), 1) << v.Report();
  EXPECT_EQ(JournalCount(v.sagas[0], kTrip[kPaymentStep].id, "submitted"), 1) << v.Report();
}

// Row 16, a race of opposite decisions: exactly one is journaled and carried
// out; the other is refused with the winner named.
TEST_F(CrashApprovalTest, ApproveAndRejectAtOnceOneWins) {
  std::string token;
  ASSERT_TRUE(RunToApproval({}, &token));
  const std::string pause = "approval.after_commit=sleep(200)";
  Started yes = Start(ApproveArgs(token), pause);
  Started no = Start(RejectArgs(token), pause);
  ProcessExit a = Finish(yes);
  ProcessExit r = Finish(no);

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  const std::string state = v.sagas[0].value("state", "");
  const bool approved = state == "succeeded";
  EXPECT_TRUE(approved || state == "compensated") << v.Report();
  const ProcessExit& winner = approved ? a : r;
  const ProcessExit& loser = approved ? r : a;
  EXPECT_TRUE(winner.Exited(RunExitFor(state))) << winner;
  EXPECT_TRUE(loser.Exited(cli::kExitAlreadyDecided)) << loser;
  EXPECT_NE(loser.output.find(approved ? "already approved" : "already rejected"),
            std::string::npos)
      << loser;
  EXPECT_EQ(PaymentOf(v).effects, approved ? 1 : 0) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, approved ? 1 : 0) << v.Report();
  EXPECT_EQ(JournalCount(v.sagas[0], kTrip[kPaymentStep].id, "approved") +
                JournalCount(v.sagas[0], kTrip[kPaymentStep].id, "rejected"),
            1)
      << v.Report();
}

// (f) Row 14 through the CLI: a tampered, truncated, empty or made-up token
// is refused with one message (exit 2), and changes nothing.
TEST_F(CrashApprovalTest, TamperedTokensRefused) {
  std::string token;
  ASSERT_TRUE(RunToApproval({}, &token));
  Verdict v0;
  ASSERT_TRUE(Observe(&v0));
  const size_t dot = token.rfind('.');
  ASSERT_NE(dot, std::string::npos) << token;
  ASSERT_EQ(token.rfind("idem1.", 0), 0u) << token;
  auto flip = [&](size_t at) {
    std::string t = token;
    t[at] = t[at] == 'A' ? 'B' : 'A';
    return t;
  };
  const std::vector<std::pair<std::string, std::string>> forged = {
      {"one character of the MAC", flip(dot + 10)},
      {"the last character of the MAC", flip(token.size() - 1)},
      {"one character of the claims", flip(std::string("idem1.").size() + 8)},
      {"truncated by one", token.substr(0, token.size() - 1)},
      {"truncated to the claims", token.substr(0, dot)},
      {"empty", ""},
      {"made up", "idem1.x.y"},
      {"another version", "idem2" + token.substr(5)},
  };
  for (const auto& [what, bad] : forged) {
    ASSERT_NE(bad, token) << what;
    for (bool approve : {true, false}) {
      ProcessExit e = Decide(bad, approve);
      EXPECT_TRUE(e.Exited(cli::kExitUsage)) << what << "\n" << e;
      EXPECT_NE(e.output.find("invalid commit token"), std::string::npos) << what << "\n" << e;
    }
  }

  Verdict v = Check(1, /*count=*/false);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], "awaiting_approval") << v.Report();
  EXPECT_EQ(v.ledger.calls.size(), v0.ledger.calls.size()) << "0 tool calls\n" << v.Report();
  EXPECT_EQ(v.ledger.effects.size(), 3u) << v.Report();
  EXPECT_EQ(v.sagas[0]["journal"].size(), v0.sagas[0]["journal"].size()) << "journal unchanged\n"
                                                                         << v.Report();
  std::string still;
  ASSERT_TRUE(OnePendingToken(&still));
  EXPECT_EQ(still, token);
  EXPECT_EQ(SpentTokens(v.sagas[0].value("saga_id", "")), 0);

  // The genuine token still works.
  ProcessExit approve = Decide(token);
  EXPECT_TRUE(approve.Exited(cli::kExitOk)) << approve;
  Verdict done = Check(1);
  EXPECT_TRUE(done.violations.empty()) << done.Report();
  EXPECT_EQ(PaymentOf(done).effects, 1) << done.Report();
}

// (g) A person rejects: the saga rolls back, nothing is charged, and each
// booking is undone once.
TEST_F(CrashApprovalTest, RejectRollsBack) {
  std::string token;
  ASSERT_TRUE(RunToApproval({}, &token));
  ProcessExit reject = Decide(token, /*approve=*/false);
  EXPECT_TRUE(reject.Exited(cli::kExitRolledBack)) << reject;

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  const Json& saga = v.sagas[0];
  EXPECT_EQ(saga["state"], "compensated") << v.Report();
  EXPECT_NE(saga.value("reason", "").find("rejected by maria"), std::string::npos) << v.Report();
  EXPECT_EQ(saga["steps"][kPaymentStep]["state"], "failed") << v.Report();
  EXPECT_EQ(PaymentOf(v).effects, 0) << v.Report();
  EXPECT_EQ(PaymentOf(v).charges, 0) << v.Report();
  for (int i = 0; i < kPaymentStep; ++i) {
    const std::string key = saga["steps"][i].value("key", "");
    EXPECT_EQ(saga["steps"][i]["state"], "compensated") << v.Report();
    EXPECT_EQ(v.ledger.Effects(kTrip[i].action, key), 1) << v.Report();
    EXPECT_EQ(v.ledger.Effects(kTrip[i].undo, CompensationKey(key)), 1) << v.Report();
  }
  EXPECT_EQ(v.ledger.effects.size(), 6u) << v.Report();
  EXPECT_EQ(SpentTokens(saga.value("saga_id", "")), 0) << "a rejection spends nothing";

  ProcessExit again = Decide(token, /*approve=*/false);
  EXPECT_TRUE(again.Exited(cli::kExitRolledBack)) << again;
  ProcessExit approve = Decide(token);
  EXPECT_TRUE(approve.Exited(cli::kExitAlreadyDecided)) << approve;
  EXPECT_NE(approve.output.find("already rejected"), std::string::npos) << approve;
  Verdict after = Check(1, /*count=*/false);
  EXPECT_EQ(after.ledger.calls.size(), v.ledger.calls.size()) << after.Report();
  EXPECT_EQ(after.ledger.effects.size(), v.ledger.effects.size()) << after.Report();
}

// ---- the travel example's trip: flight, hotel and car in flight at once

struct ParallelCrashCase {
  const char* name;
  const char* failpoint;  ///< where the `run` dies
  bool reject_hotel;      ///< the hotel refuses: a rollback of the other two
};

void PrintTo(const ParallelCrashCase& c, std::ostream* os) {
  *os << "IDEM_FAILPOINT=" << c.failpoint << (c.reject_hotel ? " --fault hotels.book=reject" : "");
}

// The example's trip (examples/travel_booking/trip.json: flight, hotel and
// car at once, then the payment) killed while several branches are in flight,
// then recovered (and the payment approved where it waits): no duplicate
// effect, no orphan, and the saga terminal or parked with a reason.
class CrashParallelTest : public CrashTest, public testing::WithParamInterface<ParallelCrashCase> {
 protected:
  ProcessExit RunParallel(const std::string& failpoint, const std::vector<std::string>& faults) {
    return Travel({"run", kParallelTripSpec, "--input", std::string("@") + kTripInput}, failpoint,
                  faults);
  }
};

TEST_P(CrashParallelTest, KilledWithBranchesInFlightRecoversWithoutDuplicates) {
  const ParallelCrashCase& c = GetParam();
  std::vector<std::string> faults;
  if (c.reject_hotel) faults.push_back("hotels.book=reject");
  ProcessExit run = RunParallel(c.failpoint, faults);
  ASSERT_TRUE(Crashed(run)) << "the failpoint did not kill the run: " << run;
  Verdict mid = Check(1, /*count=*/false);
  EXPECT_EQ(mid.duplicates, 0) << mid.Report();

  ProcessExit recover = Recover("", faults);
  EXPECT_TRUE(recover.Exited(cli::kExitOk) || recover.Exited(cli::kExitNeedsAttention) ||
              (c.reject_hotel && recover.Exited(cli::kExitRolledBack)))
      << recover;
  Json pending;
  ASSERT_TRUE(PendingApprovals(&pending));
  if (!pending.empty()) {
    ASSERT_EQ(pending.size(), 1u) << pending.dump(2);
    ProcessExit approve = Decide(pending[0].value("token", ""));
    EXPECT_TRUE(approve.Exited(cli::kExitOk)) << approve;
  }
  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  EXPECT_EQ(v.duplicates, 0) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  const std::string state = v.sagas[0].value("state", "");
  if (c.reject_hotel) {
    EXPECT_TRUE(state == "compensated" || state == "needs_attention") << v.Report();
  } else {
    EXPECT_TRUE(state == "succeeded" || state == "needs_attention") << v.Report();
  }
  if (state == "needs_attention") EXPECT_FALSE(v.sagas[0].value("reason", "").empty());
}

std::vector<ParallelCrashCase> ParallelCrashCases() {
  return {
      // All three `submitted` durable (one transaction), no tool called yet.
      {"after_the_submitted_batch", "step.after_submitted=kill@1", false},
      // Between their outcomes: one provider applied, the others in flight.
      {"after_the_first_apply", "provider.after_apply=kill@1", false},
      {"after_the_second_apply", "provider.after_apply=kill@2", false},
      {"after_the_first_outcome", "step.after_outcome=kill@1", false},
      // A branch failed; the rollback of the others is under way.
      {"rollback_after_the_first_undo_submitted", "compensation.after_submitted=kill@1", true},
      {"rollback_between_the_undos", "compensation.after_outcome=kill@1", true},
      {"rollback_after_the_first_undo_applied", "provider.after_undo=kill@1", true},
  };
}

INSTANTIATE_TEST_SUITE_P(CrashParallel, CrashParallelTest, testing::ValuesIn(ParallelCrashCases()),
                         [](const testing::TestParamInfo<ParallelCrashCase>& info) {
                           return info.param.name;
                         });

// ---- a bad IDEM_FAILPOINT is refused before anything is written

struct BadSpecCase {
  const char* spec;
  const char* named;  ///< what the message must name
};

void PrintTo(const BadSpecCase& c, std::ostream* os) { *os << "IDEM_FAILPOINT=" << c.spec; }

class CrashFailpointSpecTest : public CrashTest, public testing::WithParamInterface<BadSpecCase> {};

TEST_P(CrashFailpointSpecTest, RefusedAndNothingWritten) {
  const BadSpecCase& c = GetParam();
  ProcessExit e = Run(c.spec, {});
  EXPECT_TRUE(e.Exited(cli::kExitUsage)) << e;
  EXPECT_NE(e.output.find(c.named), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(db_)) << e;
  EXPECT_FALSE(fs::exists(ledger_)) << e;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    bool ours = std::find(logs_.begin(), logs_.end(), entry.path()) != logs_.end();
    EXPECT_TRUE(ours) << "unexpected file " << entry.path();
  }
}

std::vector<BadSpecCase> BadSpecCases() {
  return {{"step.after_submited=kill", "unknown failpoint \"step.after_submited\""},
          {"step.after_submitted=explode", "unknown action \"explode\""},
          {"step.after_submitted=kill@0", "@N must be 1..1000000"}};
}

std::string BadSpecName(const testing::TestParamInfo<BadSpecCase>& info) {
  static const char* const kNames[] = {"unknown_name", "unknown_action", "bad_nth"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(CrashFailpointSpec, CrashFailpointSpecTest,
                         testing::ValuesIn(BadSpecCases()), BadSpecName);

}  // namespace
}  // namespace idem

// ---- open sagas (issue 14): a kill between a call's `submitted` and its
// answer, and during the rollback. The next call (or `recover`) settles what
// the killed process left, and the ledger holds one effect per call and one
// undo per compensated call.

namespace idem {
namespace {

class OpenSagaCrashTest : public CrashTest {
 protected:
  std::string Begin(const std::string& intent) {
    Json out;
    std::string error;
    if (!ReadJson({"open", "begin", "--intent-key", intent, "--tool", "flights.reserve", "--tool",
                   "payments.charge"},
                  &out, &error)) {
      ADD_FAILURE() << error;
      return "";
    }
    return out.value("saga_id", "");
  }
  std::vector<std::string> CallArgs(const std::string& saga, const std::string& call_id,
                                    const std::string& tool, const Json& args) {
    return {"open", "call", saga, "--call-id", call_id, "--tool", tool, "--args", args.dump()};
  }
  LedgerView Ledger() {
    LedgerView view;
    std::string error;
    EXPECT_TRUE(ReadLedger(ledger_, &view, &error)) << error;
    return view;
  }
  // Per key, at most one effect: what a duplicate would break.
  int Duplicates(const LedgerView& l) {
    std::map<std::string, int> per;
    for (const auto& r : l.effects) ++per[r.provider + "." + r.operation + " " + r.key];
    int d = 0;
    for (const auto& [k, n] : per) d += n > 1 ? n - 1 : 0;
    Totals().duplicates += d;
    return d;
  }
};

const Json kFlight = {{"from", "LIS"}, {"to", "NRT"}, {"date", "2026-12-24"}};
const Json kCharge = {{"traveller", "ana"}, {"amount_cents", 9000}, {"currency", "EUR"}};

TEST_F(OpenSagaCrashTest, AKillBetweenACallsSubmittedAndItsAnswerIsSettledWithOneEffect) {
  int n = 0;
  for (const char* fp :
       {"step.after_submitted", "provider.after_apply", "step.after_call", "step.after_outcome"}) {
    SCOPED_TRACE(fp);
    const std::string saga = Begin("agent-" + std::to_string(++n));
    ASSERT_FALSE(saga.empty());
    ProcessExit killed =
        Travel(CallArgs(saga, "call_1", "flights.reserve", kFlight), std::string(fp) + "=kill");
    ASSERT_TRUE(Crashed(killed)) << killed;
    // The next call settles the first (same key), then makes its own.
    ProcessExit next = Travel(CallArgs(saga, "call_2", "payments.charge", kCharge));
    EXPECT_TRUE(next.Exited(cli::kExitOk)) << next;
    // The repeat of the killed call answers from the journal.
    Json again;
    std::string error;
    ASSERT_TRUE(ReadJson(CallArgs(saga, "call_1", "flights.reserve", kFlight), &again, &error))
        << error;
    EXPECT_EQ(again.value("state", ""), "succeeded") << again.dump();
    EXPECT_EQ(again.value("deduplicated", false), true);
    LedgerView l = Ledger();
    EXPECT_EQ(l.Effects("flights.reserve", saga + "/c1"), 1) << l.Dump();
    EXPECT_EQ(l.Effects("payments.charge", saga + "/c2"), 1) << l.Dump();
    EXPECT_EQ(Duplicates(l), 0) << l.Dump();
  }
}

TEST_F(OpenSagaCrashTest, AKillDuringTheRollbackIsFinishedByRecoverWithOneUndoEach) {
  int n = 0;
  for (const char* fp : {"compensation.after_submitted", "provider.after_undo",
                         "compensation.after_call", "compensation.after_outcome"}) {
    SCOPED_TRACE(fp);
    const std::string saga = Begin("rollback-" + std::to_string(++n));
    ASSERT_FALSE(saga.empty());
    ASSERT_TRUE(Travel(CallArgs(saga, "f", "flights.reserve", kFlight)).Exited(cli::kExitOk));
    ASSERT_TRUE(Travel(CallArgs(saga, "p", "payments.charge", kCharge)).Exited(cli::kExitOk));
    ProcessExit killed =
        Travel({"open", "rollback", saga, "--as", "agent"}, std::string(fp) + "=kill");
    ASSERT_TRUE(Crashed(killed)) << killed;
    ProcessExit rec = Recover("", {});
    EXPECT_TRUE(rec.Exited(cli::kExitRolledBack)) << rec;
    Json status;
    std::string error;
    ASSERT_TRUE(ReadJson({"status", saga, "--json"}, &status, &error)) << error;
    EXPECT_EQ(status.value("state", ""), "compensated") << status.dump(2);
    LedgerView l = Ledger();
    EXPECT_EQ(l.Effects("payments.refund", saga + "/c2:compensate"), 1) << l.Dump();
    EXPECT_EQ(l.Effects("flights.cancel", saga + "/c1:compensate"), 1) << l.Dump();
    EXPECT_EQ(Duplicates(l), 0) << l.Dump();
  }
}

// ---- approval policies: a quorum of two (issue 19)
//
// The sequential trip whose payment needs two distinct finance approvals
// (tests/specs/trip_quorum.json). A kill at each approval boundary, then
// `recover` and the remaining approvals: one charge per saga, and never a
// charge with fewer approvals than the quorum.

constexpr const char* kQuorumSpec = IDEM_SOURCE_DIR "/tests/specs/trip_quorum.json";

class QuorumCrashTest : public CrashTest {
 protected:
  // The approvers prove who they are: an auth file (as `serve --auth`
  // reads) and a credential file each (owner-only); omar holds no finance.
  std::string AuthFile() {
    const fs::path auth = dir_ / "auth.json";
    if (fs::exists(auth)) return auth.string();
    Json callers = Json::array();
    for (const auto& [who, roles] : std::vector<std::pair<std::string, Json>>{
             {"maria", {"approver", "finance"}}, {"jonas", {"finance"}}, {"omar", {"approver"}}}) {
      const std::string token = "credential-of-" + who;
      callers.push_back({{"name", who}, {"token_sha256", Sha256Hex(token)}, {"roles", roles}});
      const fs::path file = dir_ / (who + ".token");
      std::ofstream(file) << token;
      fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
    }
    std::ofstream(auth) << callers.dump();
    fs::permissions(auth, fs::perms::owner_read | fs::perms::owner_write);
    return auth.string();
  }
  std::vector<std::string> ApproveAs(const std::string& token, const std::string& who) {
    return {"approve",  token,          "--auth",
            AuthFile(), "--credential", "@" + (dir_ / (who + ".token")).string(),
            "--note",   "ok by " + who};
  }

  // `run` to the approval: the saga waits for two finance approvals.
  bool RunToQuorum(std::string* token) {
    ProcessExit run = Travel({"run", kQuorumSpec, "--input", std::string("@") + kTripInput});
    if (!run.Exited(cli::kExitAwaitingApproval)) {
      ADD_FAILURE() << "run should wait for approval: " << run;
      return false;
    }
    return OnePendingToken(token);
  }

  // The one saga, checked: no invariant broken (after recovery: `settled`),
  // the payment charged `want_charges` times, and its first `submitted` (a
  // retry after a kill resends under the same key) only with two distinct
  // approvers journaled before it.
  Json CheckSaga(int want_charges, bool settled = true) {
    Verdict v = settled ? Check(1) : Verdict{};
    if (!settled && !Observe(&v)) return Json::object();
    EXPECT_TRUE(v.violations.empty()) << v.Report();
    if (v.sagas.size() != 1) {
      ADD_FAILURE() << v.Report();
      return Json::object();
    }
    const Json& saga = v.sagas[0];
    const std::string pay_key = saga["steps"][kPaymentStep].value("key", "");
    EXPECT_EQ(v.ledger.Effects("payments.charge", pay_key), want_charges) << v.Report();
    std::set<std::string> approvers;
    for (const Json& e : saga.value("journal", Json::array())) {
      if (e.value("step", "") != kTrip[kPaymentStep].id) continue;
      const std::string event = e.value("event", "");
      if (event == "approval_counted" || event == "approved") {
        approvers.insert(e["data"].value("by", ""));
      }
      if (event == "submitted" && e["data"].contains("approved_by")) {
        EXPECT_GE(approvers.size(), 2u)
            << "a commit with fewer approvals than the quorum: " << saga.dump(2);
        EXPECT_EQ(e["data"]["approvals"].size(), 2u) << e.dump();
      }
    }
    const int submitted = JournalCount(saga, kTrip[kPaymentStep].id, "submitted");
    EXPECT_EQ(submitted > 0, want_charges > 0) << saga.dump(2);
    return saga;
  }
};

TEST_F(QuorumCrashTest, AKillAfterTheFirstApprovalKeepsItAndTheSecondCommitsOnce) {
  std::string token;
  ASSERT_TRUE(RunToQuorum(&token));
  ProcessExit killed = Travel(ApproveAs(token, "maria"), "approval.after_counted=kill");
  ASSERT_TRUE(Crashed(killed)) << killed;
  ProcessExit rec = Recover("", {});
  EXPECT_TRUE(rec.Exited(cli::kExitOk)) << rec;
  Json saga = CheckSaga(0);
  EXPECT_EQ(saga.value("state", ""), "awaiting_approval");
  const Json& pay = saga["steps"][kPaymentStep];
  ASSERT_EQ(pay["approvals"].size(), 1u) << pay.dump(2);
  EXPECT_EQ(pay["approvals"][0]["by"], "maria");
  EXPECT_EQ(JournalCount(saga, kTrip[kPaymentStep].id, "approval_counted"), 1);
  // maria again: refused, nothing changes (exit 10).
  ProcessExit twice = Travel(ApproveAs(token, "maria"));
  EXPECT_TRUE(twice.Exited(cli::kExitAlreadyDecided)) << twice;
  // A name without a credential counts for nothing toward the policy, and
  // omar's credential holds no finance: both refused (exit 2).
  ProcessExit unproven = Travel({"approve", token, "--as", "jonas"});
  EXPECT_TRUE(unproven.Exited(cli::kExitUsage)) << unproven;
  ProcessExit no_role = Travel(ApproveAs(token, "omar"));
  EXPECT_TRUE(no_role.Exited(cli::kExitUsage)) << no_role;
  ProcessExit second = Travel(ApproveAs(token, "jonas"));
  EXPECT_TRUE(second.Exited(cli::kExitOk)) << second;
  EXPECT_EQ(CheckSaga(1).value("state", ""), "succeeded");
  EXPECT_EQ(SpentTokens(saga.value("saga_id", "")), 1);
}

TEST_F(QuorumCrashTest, AKillAfterTheSecondApprovalBeforeSubmittedIsCommittedOnceByRecover) {
  std::string token;
  ASSERT_TRUE(RunToQuorum(&token));
  ASSERT_TRUE(Travel(ApproveAs(token, "maria")).Exited(cli::kExitAwaitingApproval));
  ProcessExit killed = Travel(ApproveAs(token, "jonas"), "approval.after_commit=kill");
  ASSERT_TRUE(Crashed(killed)) << killed;
  Json before = CheckSaga(0, /*settled=*/false);  // killed: the saga still says running
  EXPECT_EQ(JournalCount(before, kTrip[kPaymentStep].id, "approved"), 1) << before.dump(2);
  ProcessExit rec = Recover("", {});
  EXPECT_TRUE(rec.Exited(cli::kExitOk)) << rec;
  Json saga = CheckSaga(1);
  EXPECT_EQ(saga.value("state", ""), "succeeded");
  // jonas's approval replayed: the recorded outcome, no second charge.
  ProcessExit again = Travel(ApproveAs(token, "jonas"));
  EXPECT_TRUE(again.Exited(cli::kExitOk)) << again;
  CheckSaga(1);
}

TEST_F(QuorumCrashTest, AKillDuringTheCommitIsFinishedByRecoverWithOneCharge) {
  for (const char* fp : {"step.after_submitted", "provider.after_apply", "step.after_call"}) {
    SCOPED_TRACE(fp);
    db_ = dir_ / (CaseName(fp) + ".db");  // a fresh journal and ledger for each boundary
    ledger_ = dir_ / (CaseName(fp) + ".db.ledger.sqlite");
    std::string token;
    ASSERT_TRUE(RunToQuorum(&token));
    ASSERT_TRUE(Travel(ApproveAs(token, "maria")).Exited(cli::kExitAwaitingApproval));
    ProcessExit killed = Travel(ApproveAs(token, "jonas"), std::string(fp) + "=kill");
    ASSERT_TRUE(Crashed(killed)) << killed;
    ProcessExit rec = Recover("", {});
    EXPECT_TRUE(rec.Exited(cli::kExitOk)) << rec;
    EXPECT_EQ(CheckSaga(1).value("state", ""), "succeeded");
  }
}

}  // namespace
}  // namespace idem
