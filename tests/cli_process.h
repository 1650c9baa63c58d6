#pragma once
// A test fixture that runs the real `travel-booking` binary (the idem CLI
// with the example providers) on a journal in a fresh directory, and reads
// the providers' ledger with the sqlite3 C API: what the tests of exit
// codes, `keys retire` and journal regressions share.
//
// Thread safety: one fixture per test thread.

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "common/json_util.h"
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace idem::testing_cli {

namespace fs = std::filesystem;

inline constexpr const char* kBinary = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";
inline constexpr const char* kTripSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip.json";
/// The trip with its steps one after another (no "after"): for tests whose
/// failpoints count the steps in order (flight, hotel, car, payment).
inline constexpr const char* kSequentialTripSpec =
    IDEM_SOURCE_DIR "/tests/specs/trip_sequential.json";
inline constexpr const char* kTripInput = IDEM_SOURCE_DIR "/examples/travel_booking/input.json";

inline std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// One finished travel-booking process.
struct ProcResult {
  int code = -1;  ///< exit code, or 128 + signal
  std::string out, err;
  std::string Describe() const {
    return "exit " + std::to_string(code) + "\n--- stdout\n" + out + "--- stderr\n" + err;
  }
};

class CliProcessTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("idem_" + std::string(info->test_suite_name()) + "_" +
                                        info->name() + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = (dir_ / "trip.db").string();
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  /// Runs travel-booking with `args` (and `--db` the test's journal), with
  /// `env` ("NAME=value") added to an environment cleared of IDEM_* and
  /// TRAVEL_* variables, and waits for it.
  ProcResult Run(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    args.insert(args.begin(), {"--db", db_});
    const fs::path out = dir_ / ("p" + std::to_string(++count_) + ".out");
    const fs::path err = dir_ / ("p" + std::to_string(count_) + ".err");
    std::vector<std::string> argv = {kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargs;
    for (auto& a : argv) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::vector<std::string> vars = env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string var = *e;
      if (var.rfind("IDEM_", 0) == 0 || var.rfind("TRAVEL_", 0) == 0) continue;
      vars.push_back(var);
    }
    std::vector<char*> cenv;
    for (auto& e : vars) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT, 0644);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT, 0644);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, kBinary, &fa, nullptr, cargs.data(), cenv.data());
    posix_spawn_file_actions_destroy(&fa);
    ProcResult r;
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn: " << std::strerror(rc);
      return r;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  /// `run` of the trip, with `env` (e.g. IDEM_FAILPOINT=...).
  ProcResult RunTrip(const std::vector<std::string>& env = {}) {
    return Run({"run", kTripSpec, "--input", std::string("@") + kTripInput}, env);
  }
  /// `run` of the sequential trip (kSequentialTripSpec), with `env`.
  ProcResult RunSequentialTrip(const std::vector<std::string>& env = {}) {
    return Run({"run", kSequentialTripSpec, "--input", std::string("@") + kTripInput}, env);
  }

  /// The commits waiting for a person (`approvals --json`).
  Json Approvals() {
    ProcResult list = Run({"approvals", "--json"});
    EXPECT_EQ(list.code, 0) << list.Describe();
    Json pending = Json::parse(list.out, nullptr, false);
    if (!pending.is_array()) {
      ADD_FAILURE() << list.Describe();
      return Json::array();
    }
    return pending;
  }

  /// Rows of the providers' ledger `table` ("effects" or "calls") for one
  /// provider operation ("cars.rent"); -1 if the ledger cannot be read.
  int LedgerRows(const char* table, const std::string& tool) {
    const std::string path = db_ + ".ledger.sqlite";
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      sqlite3_close(db);
      return -1;
    }
    const size_t dot = tool.find('.');
    const std::string sql =
        std::string("SELECT COUNT(*) FROM ") + table + " WHERE provider = ?1 AND operation = ?2";
    sqlite3_stmt* st = nullptr;
    int n = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
      const std::string provider = tool.substr(0, dot), op = tool.substr(dot + 1);
      sqlite3_bind_text(st, 1, provider.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 2, op.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
  }

  fs::path dir_;
  std::string db_;
  int count_ = 0;
};

}  // namespace idem::testing_cli
