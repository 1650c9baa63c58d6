// Crash tests: RELIABILITY.md section 2, rows 1-4, with the H5 checker.
//
// Each test spawns the real `travel-booking` binary with IDEM_FAILPOINT armed
// (H1), checks that it died by SIGKILL at the named boundary, runs `recover`
// without failpoints, and then joins the journal (`status SAGA --json`) with
// the providers' ledger (read directly with the sqlite3 C API):
//   - per key, ledger effects <= 1 (no duplicate effect);
//   - exactly one action effect per step the journal says succeeded, none for
//     steps that never ran or failed, exactly one undo per compensated step;
//   - no ledger effect the journal does not account for (orphan = 0);
//   - every saga the client started exists (lost = 0) and is terminal, or
//     needs attention with a reason.
// Row 4 (nested kills) picks its failpoints from a seeded std::mt19937_64
// (seed printed; set IDEM_CRASH_SEED to replay or explore). The expected
// failpoint hits of a recovery come from a small model of the engine
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
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "cli/cli.h"

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
constexpr const char* kTripSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip.json";
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

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

/// Runs argv[0] with posix_spawn, stdout to `out`, stderr to `err` (the same
/// file is fine: both are opened for append), and waits for it.
ProcessExit Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  const fs::path& out, const fs::path& err) {
  ProcessExit result;
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
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    result.error = std::string("posix_spawn: ") + std::strerror(rc);
    return result;
  }
  int status = 0;
  pid_t w;
  do {
    w = waitpid(pid, &status, 0);
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
    if (!IsTerminal(state) && !(state == "needs_attention" && !reason.empty())) {
      ++v->lost;
      violation("saga " + sid + " is stuck in state \"" + state + "\" (reason \"" + reason +
                "\"): not terminal, nor needs_attention with a reason");
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
      } else if (s == "planned" || s == "failed") {
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
      owned = act->second != "planned" && act->second != "failed";
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

// ---- a model of the engine: which failpoints a run or a recovery hits

struct ModelStep {
  std::string state = "planned";
  int attempt = 0;
  bool applied = false;       ///< the ledger has the action's effect
  bool undo_applied = false;  ///< the ledger has the compensation's effect
};

struct Model {
  std::string saga = "pending";
  std::vector<ModelStep> steps = std::vector<ModelStep>(kSteps);
  bool reject_payment = false;  ///< --fault payments.charge=reject
};

struct Prediction {
  std::vector<std::string> hits;  ///< failpoint names, in order
  std::string final_state;
};

/// Mirrors saga/engine.cc against the travel providers without faults other
/// than a rejected payment: the failpoints a process reaches, from `m`, when
/// nothing kills it. Write tools get max(2, max_attempts) = 2 attempts.
class Predictor {
 public:
  explicit Predictor(Model m) : m_(std::move(m)) {}

  Prediction Run() {
    if (m_.saga == "pending") {
      Hit("saga.after_start");
      m_.saga = "running";
    }
    if (m_.saga == "running") Forward();
    if (m_.saga == "compensating") Rollback();
    return {hits_, m_.saga};
  }

 private:
  enum class End { kSucceeded, kFailed, kParked };

  void Hit(const char* name) { hits_.emplace_back(name); }
  void Terminal(const char* state) {
    Hit("saga.before_terminal");
    Hit("saga.after_terminal");
    m_.saga = state;
  }

  void Forward() {
    for (int i = 0;; ++i) {
      while (i < kSteps && m_.steps[i].state == "succeeded") ++i;
      if (i == kSteps) return Terminal("succeeded");
      End e = DriveStep(i, /*rolling_back=*/false);
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
      if (!rolling_back && st.attempt < 2) {
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
/// Recover resumes only pending, running and compensating sagas. CmdRecover
/// (cli.cc) exits 4 when a resumed saga needs attention and 0 otherwise:
/// unlike `run`, it does not report a rolled-back saga as kExitRolledBack.
int RecoverExitFor(const std::string& before, const std::string& after) {
  bool resumed = before == "pending" || before == "running" || before == "compensating";
  if (!resumed || after == "succeeded") return cli::kExitOk;
  if (after == "needs_attention") return cli::kExitNeedsAttention;
  return cli::kExitRolledBack;
}

/// `run`'s exit code for a saga that ends in `state` (cli.h).
int RunExitFor(const std::string& state) {
  if (state == "succeeded") return cli::kExitOk;
  if (state == "needs_attention") return cli::kExitNeedsAttention;
  return cli::kExitRolledBack;
}

class CrashTest : public testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name();
    for (char& ch : name) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    dir_ = fs::temp_directory_path() / ("idem_crash_" + name + "_" + std::to_string(getpid()) +
                                        "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = dir_ / "trip.db";
    ledger_ = dir_ / "trip.db.ledger.sqlite";  // travel-booking's default: <db>.ledger.sqlite
  }

  void TearDown() override {
    if (HasFailure()) {
      std::cout << "temp dir kept: " << dir_ << "\n";
      for (const auto& p : logs_) {
        std::cout << "==== " << p.filename().string() << "\n" << ReadText(p);
      }
      return;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Runs travel-booking with `args` after the global options; stdout and
  /// stderr go to a log file of their own, kept with the test's temp dir.
  ProcessExit Travel(const std::vector<std::string>& args, const std::string& failpoint = "",
                     const std::vector<std::string>& faults = {}, const fs::path& stdout_to = {}) {
    std::vector<std::string> argv = {kBinary, "--db", db_.string()};
    for (const auto& f : faults) {
      argv.push_back("--fault");
      argv.push_back(f);
    }
    argv.insert(argv.end(), args.begin(), args.end());
    std::string command = failpoint.empty() ? "" : "IDEM_FAILPOINT='" + failpoint + "' ";
    command += "travel-booking";
    for (size_t i = 1; i < argv.size(); ++i) command += " " + argv[i];

    char name[32];
    std::snprintf(name, sizeof(name), "%02zu-%s.log", logs_.size() + 1, args.front().c_str());
    fs::path log = dir_ / name;
    { std::ofstream(log) << "$ " << command << "\n"; }
    logs_.push_back(log);
    ProcessExit e =
        Spawn(argv, ChildEnvironment(failpoint), stdout_to.empty() ? log : stdout_to, log);
    e.command = command;
    e.output = ReadText(log);
    {
      std::ofstream(log, std::ios::app)
          << "["
          << (e.signaled ? "signal " + std::to_string(e.signal) : "exit " + std::to_string(e.code))
          << "]\n";
    }
    return e;
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
    *out = Json::parse(ReadText(json), nullptr, /*allow_exceptions=*/false);
    if (out->is_discarded()) {
      *error = "`" + e.command + "` printed no valid JSON: " + ReadText(json);
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

  /// Observes, runs the H5 checker and adds its counts to the sweep totals.
  Verdict Check(int expected_sagas) {
    Verdict v;
    if (!Observe(&v)) {
      v.violations.push_back("could not observe the journal and the ledger");
      return v;
    }
    CheckInvariants(expected_sagas, &v);
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
    }
    return true;
  }

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

BoundaryState ForwardBoundary(const std::string& fp) {
  if (fp == "step.before_submitted") return {"planned", 0};
  if (fp == "step.after_submitted") return {"submitted", 0};
  if (fp == "provider.after_apply" || fp == "step.after_call") return {"submitted", 1};
  if (fp == "unknown.after_recorded") return {"unknown", 1};  // with a lose_response fault
  return {"succeeded", 1};                                    // step.after_outcome
}

BoundaryState UndoBoundary(const std::string& fp) {
  if (fp == "compensation.before_submitted") return {"succeeded", 0};
  if (fp == "compensation.after_submitted") return {"compensating", 0};
  if (fp == "provider.after_undo" || fp == "compensation.after_call") return {"compensating", 1};
  return {"compensated", 1};  // compensation.after_outcome
}

// ---- row 1 (and 2): a crash at each forward boundary of the happy path

struct ForwardCase {
  const char* failpoint;
  int nth;
  const char* fault;           ///< for the crashing run only ("" for none)
  const char* expected_state;  ///< after recovery
};

std::vector<ForwardCase> ForwardCases() {
  std::vector<ForwardCase> out = {{"saga.after_start", 1, "", "succeeded"}};
  for (const char* fp : {"step.before_submitted", "step.after_submitted", "provider.after_apply",
                         "step.after_call", "step.after_outcome"}) {
    for (int n = 1; n <= kSteps; ++n) {
      // The car (step 3) has neither keys nor status: left submitted without
      // an outcome, it can only be parked for a person.
      bool car_uncertain = n == 3 && std::string(fp) != "step.before_submitted" &&
                           std::string(fp) != "step.after_outcome";
      out.push_back({fp, n, "", car_uncertain ? "needs_attention" : "succeeded"});
    }
  }
  out.push_back({"saga.before_terminal", 1, "", "succeeded"});
  out.push_back({"saga.after_terminal", 1, "", "succeeded"});
  // unknown.after_recorded is reached only when a call's outcome is unknown.
  out.push_back({"unknown.after_recorded", 1, "flights.reserve=lose_response", "succeeded"});
  out.push_back({"unknown.after_recorded", 1, "hotels.book=lose_response", "succeeded"});
  out.push_back({"unknown.after_recorded", 1, "cars.rent=lose_response", "needs_attention"});
  return out;
}

void PrintTo(const ForwardCase& c, std::ostream* os) {
  *os << c.failpoint << "=kill@" << c.nth << (*c.fault ? std::string(" --fault ") + c.fault : "")
      << " => " << c.expected_state;
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
  if (fp.rfind("step.", 0) == 0 || fp.rfind("provider.", 0) == 0) target = c.nth - 1;
  for (int i = 0; i < kSteps && !faults.empty(); ++i) {
    if (faults[0].rfind(std::string(kTrip[i].action) + "=", 0) == 0) target = i;
  }

  // The model used by the nested tests agrees the failpoint is reached.
  if (faults.empty()) {
    Prediction whole = Predictor(Model()).Run();
    EXPECT_TRUE(Reaches(whole.hits, fp, c.nth)) << Join(whole.hits, ", ");
  }

  ProcessExit crash = Run(fp + "=kill@" + std::to_string(c.nth), faults);
  ASSERT_TRUE(Crashed(crash)) << crash;

  // The boundary is where its name says.
  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  const std::string sid = saga0.value("saga_id", "");
  if (fp == "saga.after_terminal") {
    EXPECT_EQ(saga0["state"], "succeeded") << before.Report();
  } else {
    EXPECT_EQ(saga0["state"], "running") << before.Report();
  }
  if (target >= 0) {
    BoundaryState b = ForwardBoundary(fp);
    const Json& st = saga0["steps"][target];
    EXPECT_EQ(st["state"], b.step_state) << before.Report();
    EXPECT_EQ(before.ledger.Effects(kTrip[target].action, st.value("key", "")), b.effects)
        << before.Report();
    for (int i = 0; i < kSteps; ++i) {
      const char* want = i < target ? "succeeded" : i > target ? "planned" : nullptr;
      if (want != nullptr) {
        EXPECT_EQ(saga0["steps"][i].value("state", ""), want) << before.Report();
      }
    }
  } else if (fp == "saga.after_start") {
    EXPECT_TRUE(before.ledger.effects.empty()) << before.Report();
  } else {
    EXPECT_EQ(before.ledger.effects.size(), static_cast<size_t>(kSteps)) << before.Report();
  }

  if (faults.empty()) {  // and predicts the recovery
    Model m;
    Verdict now;
    ASSERT_TRUE(ModelNow(/*reject_payment=*/false, &m, &now));
    EXPECT_EQ(Predictor(m).Run().final_state, c.expected_state);
  }

  ProcessExit rec = Recover("", {});
  EXPECT_TRUE(rec.Exited(RecoverExitFor(saga0.value("state", ""), c.expected_state))) << rec;

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

  if (std::string(c.expected_state) == "needs_attention") {
    // The car: submitted, maybe rented, and no way to know: parked with zero
    // blind retries, and nothing after it runs.
    const Json& car = saga["steps"][2];
    const std::string key = car.value("key", "");
    const int sent = fp == "step.after_submitted" ? 0 : 1;  // killed before or after the call
    EXPECT_EQ(car["state"], "needs_attention") << v.Report();
    EXPECT_EQ(v.ledger.Calls("cars.rent", key), sent) << v.Report();
    EXPECT_EQ(v.ledger.Effects("cars.rent", key), sent) << v.Report();
    EXPECT_NE(saga.value("reason", "").find(key), std::string::npos)
        << "the reason should name the key a person must check\n"
        << v.Report();
    EXPECT_EQ(saga["steps"][3]["state"], "planned") << v.Report();
    EXPECT_EQ(v.ledger.Calls("payments.charge", saga["steps"][3].value("key", "")), 0);
  } else {
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_EQ(saga["steps"][i]["state"], "succeeded") << kTrip[i].id << "\n" << v.Report();
    }
  }

  const BoundaryState b = ForwardBoundary(fp);
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
}

INSTANTIATE_TEST_SUITE_P(CrashForward, CrashForwardTest, testing::ValuesIn(ForwardCases()),
                         [](const testing::TestParamInfo<ForwardCase>& info) {
                           std::string name = CaseName(std::string(info.param.failpoint) + "_" +
                                                       std::to_string(info.param.nth));
                           if (*info.param.fault != '\0') name += "_" + CaseName(info.param.fault);
                           return name;
                         });

// ---- row 1, B0/B1: the client retries the same intent key

class CrashIntentTest : public CrashTest, public testing::WithParamInterface<const char*> {};

TEST_P(CrashIntentTest, ClientRetryMakesOneSaga) {
  const std::string fp = GetParam();
  const std::string intent = "trip-" + CaseName(fp);
  ProcessExit crash = Run(fp + "=kill", {}, intent);
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  const bool committed = fp == "intent.after_commit";
  ASSERT_EQ(before.sagas.size(), committed ? 1u : 0u) << before.Report();
  if (committed) {
    EXPECT_EQ(before.sagas[0]["intent_key"], intent);
    EXPECT_EQ(before.sagas[0]["state"], "pending");
  }
  EXPECT_TRUE(before.ledger.effects.empty()) << before.Report();

  ProcessExit retry = Run("", {}, intent);
  EXPECT_TRUE(retry.Exited(RunExitFor("succeeded"))) << retry;
  const char* said = committed ? "(existing: same intent key and content" : "(new, intent key";
  EXPECT_NE(retry.output.find(said), std::string::npos) << retry;

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u) << v.Report();
  EXPECT_EQ(v.sagas[0]["intent_key"], intent);
  EXPECT_EQ(v.sagas[0]["state"], "succeeded") << v.Report();
  if (committed) {
    EXPECT_EQ(v.sagas[0]["saga_id"], before.sagas[0]["saga_id"]);
  }
  EXPECT_EQ(v.ledger.effects.size(), static_cast<size_t>(kSteps)) << v.Report();
}

INSTANTIATE_TEST_SUITE_P(CrashIntent, CrashIntentTest,
                         testing::Values("intent.before_commit", "intent.after_commit"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return CaseName(info.param);
                         });

// ---- row 3: a crash during the rollback, at each compensation index

struct UndoCase {
  const char* failpoint;
  int nth;  ///< the j-th compensation: 1 = the car, 2 = the hotel, 3 = the flight
};

std::vector<UndoCase> UndoCases() {
  std::vector<UndoCase> out;
  for (const char* fp :
       {"compensation.before_submitted", "compensation.after_submitted", "provider.after_undo",
        "compensation.after_call", "compensation.after_outcome"}) {
    for (int j = 1; j <= 3; ++j) out.push_back({fp, j});
  }
  return out;
}

void PrintTo(const UndoCase& c, std::ostream* os) {
  *os << c.failpoint << "=kill@" << c.nth << " --fault " << kRejectPayment;
}

class CrashCompensationTest : public CrashTest, public testing::WithParamInterface<UndoCase> {};

TEST_P(CrashCompensationTest, KillRecoverCheck) {
  const UndoCase& c = GetParam();
  const std::string fp = c.failpoint;
  const std::vector<std::string> faults = {kRejectPayment};
  const int target = kPaymentStep - c.nth;  // undone in reverse order

  Model fresh;
  fresh.reject_payment = true;
  Prediction whole = Predictor(fresh).Run();
  EXPECT_TRUE(Reaches(whole.hits, fp, c.nth)) << Join(whole.hits, ", ");
  EXPECT_EQ(whole.final_state, "compensated");

  ProcessExit crash = Run(fp + "=kill@" + std::to_string(c.nth), faults);
  ASSERT_TRUE(Crashed(crash)) << crash;

  Verdict before;
  ASSERT_TRUE(Observe(&before));
  ASSERT_EQ(before.sagas.size(), 1u) << before.Report();
  const Json saga0 = before.sagas[0];
  EXPECT_EQ(saga0["state"], "compensating") << before.Report();
  EXPECT_EQ(saga0["steps"][kPaymentStep]["state"], "failed") << before.Report();
  BoundaryState b = UndoBoundary(fp);
  const std::string target_key = saga0["steps"][target].value("key", "");
  EXPECT_EQ(saga0["steps"][target]["state"], b.step_state) << before.Report();
  EXPECT_EQ(before.ledger.Effects(kTrip[target].undo, CompensationKey(target_key)), b.effects)
      << before.Report();
  for (int i = 0; i < kPaymentStep; ++i) {
    const char* want = i > target ? "compensated" : i < target ? "succeeded" : nullptr;
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
  EXPECT_EQ(v.ledger.Calls("payments.refund", CompensationKey(pay_key)), 0) << v.Report();
  EXPECT_EQ(v.ledger.effects.size(), 6u) << v.Report();  // 3 actions, 3 undos
}

INSTANTIATE_TEST_SUITE_P(CrashCompensation, CrashCompensationTest, testing::ValuesIn(UndoCases()),
                         [](const testing::TestParamInfo<UndoCase>& info) {
                           return CaseName(std::string(info.param.failpoint) + "_" +
                                           std::to_string(info.param.nth));
                         });

// ---- row 4: the recovery itself is killed, at seeded random failpoints

constexpr int kNestedCases = 10;
constexpr uint64_t kDefaultSeed = 0x1de3c4a5b00c1e5ULL;

uint64_t BaseSeed() {
  const char* env = std::getenv("IDEM_CRASH_SEED");
  if (env == nullptr || *env == '\0') return kDefaultSeed;
  return std::strtoull(env, nullptr, 0);
}

/// A kill at a uniformly chosen hit among the first `limit` of `hits`.
std::string PickKill(const std::vector<std::string>& hits, size_t limit, std::mt19937_64& rng) {
  size_t k = std::uniform_int_distribution<size_t>(0, limit - 1)(rng);
  auto nth = std::count(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(k) + 1, hits[k]);
  return hits[k] + "=kill@" + std::to_string(nth);
}

class CrashNestedTest : public CrashTest, public testing::WithParamInterface<int> {};

TEST_P(CrashNestedTest, KillRecoveryThenRecover) {
  const uint64_t seed = BaseSeed();
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(GetParam())};
  std::mt19937_64 rng(seq);
  std::cout << "IDEM_CRASH_SEED=" << seed << " case " << GetParam() << "\n";
  RecordProperty("seed", std::to_string(seed));

  const bool reject = rng() % 2 == 1;
  std::vector<std::string> faults;
  if (reject) faults.push_back(kRejectPayment);
  std::vector<std::string> chain;

  // The first crash, anywhere but after the terminal commit (which would
  // leave nothing to recover).
  Model fresh;
  fresh.reject_payment = reject;
  Prediction first = Predictor(fresh).Run();
  ASSERT_GE(first.hits.size(), 2u);
  std::string kill = PickKill(first.hits, first.hits.size() - 1, rng);
  chain.push_back("run " + kill);
  ProcessExit crash = Run(kill, faults);
  ASSERT_TRUE(Crashed(crash)) << "seed " << seed << " chain " << Join(chain, " -> ") << "\n"
                              << crash;

  // 1-3 recoveries killed in turn, each at a failpoint the model says it reaches.
  const int nested = 1 + static_cast<int>(rng() % 3);
  int nested_done = 0;
  for (int r = 0; r < nested; ++r) {
    Model m;
    Verdict now;
    ASSERT_TRUE(ModelNow(reject, &m, &now));
    Prediction p = Predictor(m).Run();
    if (p.hits.empty()) break;  // the last kill left nothing to do
    kill = PickKill(p.hits, p.hits.size(), rng);
    chain.push_back("recover " + kill);
    ProcessExit rec = Recover(kill, faults);
    ASSERT_TRUE(Crashed(rec)) << "seed " << seed << " chain " << Join(chain, " -> ")
                              << "\npredicted hits: " << Join(p.hits, ", ") << "\n"
                              << rec << "\n"
                              << now.Report();
    ++nested_done;
  }
  EXPECT_GE(nested_done, 1) << "chain " << Join(chain, " -> ");

  Model m;
  Verdict now;
  ASSERT_TRUE(ModelNow(reject, &m, &now));
  Prediction rest = Predictor(m).Run();
  chain.push_back("recover");
  std::cout << "chain: " << Join(chain, " -> ") << " => " << rest.final_state << "\n";
  ProcessExit rec = Recover("", faults);
  EXPECT_TRUE(rec.Exited(RecoverExitFor(m.saga, rest.final_state)))
      << "chain " << Join(chain, " -> ") << "\n"
      << rec;

  Verdict v = Check(1);
  EXPECT_TRUE(v.violations.empty()) << "seed " << seed << " chain " << Join(chain, " -> ") << "\n"
                                    << v.Report();
  ASSERT_EQ(v.sagas.size(), 1u);
  EXPECT_EQ(v.sagas[0]["state"], rest.final_state)
      << "seed " << seed << " chain " << Join(chain, " -> ") << "\n"
      << v.Report();
  // Recovery is idempotent: once more changes nothing.
  ProcessExit again = Recover("", faults);
  EXPECT_TRUE(again.Exited(cli::kExitOk)) << again;
  Verdict after = Check(1);
  EXPECT_TRUE(after.violations.empty()) << after.Report();
  EXPECT_EQ(after.ledger.effects.size(), v.ledger.effects.size()) << after.Report();
}

INSTANTIATE_TEST_SUITE_P(CrashNested, CrashNestedTest, testing::Range(0, kNestedCases),
                         [](const testing::TestParamInfo<int>& info) {
                           return "case_" + std::to_string(info.param);
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
