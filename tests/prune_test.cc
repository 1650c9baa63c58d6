// Retention with real `travel-booking` processes on a SQLite journal:
// `prune` removes (or redacts) finished sagas' data, never a live saga's,
// and the intent key still answers. What the store does on both backends is
// the conformance suite's (tests/store_conformance.h, Prune*).

#include <chrono>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "cli/cli.h"
#include "tests/cli_process.h"

namespace idem::testing_cli {
namespace {

class PruneTest : public CliProcessTest {
 protected:
  // The trip to its payment approval (a live saga), under `intent`.
  std::string StartTrip(const std::string& intent, const std::string& input = kTripInput) {
    ProcResult run =
        Run({"run", kTripSpec, "--input", std::string("@") + input, "--intent-key", intent});
    EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
    return SagaOf(intent);
  }
  // The trip under `intent`, approved: a finished saga.
  std::string FinishTrip(const std::string& intent) {
    const std::string id = StartTrip(intent);
    for (const Json& a : Approvals()) {
      if (a.value("saga_id", "") != id) continue;
      ProcResult ok = Run({"approve", a.value("token", ""), "--as", "maria"});
      EXPECT_EQ(ok.code, 0) << ok.Describe();
    }
    EXPECT_EQ(Status(id).value("state", ""), "succeeded");
    return id;
  }
  std::string SagaOf(const std::string& intent) {
    ProcResult list = Run({"list", "--json"});
    Json all = Json::parse(list.out, nullptr, false);
    for (const Json& s : all) {
      if (s.value("intent_key", "") == intent) return s.value("saga_id", "");
    }
    ADD_FAILURE() << "no saga for " << intent << ": " << list.Describe();
    return "";
  }
  Json Status(const std::string& id) {
    ProcResult st = Run({"status", id, "--json"});
    EXPECT_EQ(st.code, 0) << st.Describe();
    return Json::parse(st.out, nullptr, false);
  }
};

TEST_F(PruneTest, FinishedSagasLoseTheirDataLiveOnesKeepItAndTheIntentStillAnswers) {
  const std::string done = FinishTrip("ana-done");
  const std::string live = StartTrip("ana-live");
  const Json live_before = Status(live);
  ASSERT_EQ(Status(done)["input"]["traveller"], "Ana");

  ProcResult dry = Run({"prune", "--older-than", "0s", "--dry-run", "--json"});
  ASSERT_EQ(dry.code, 0) << dry.Describe();
  Json counted = Json::parse(dry.out, nullptr, false);
  EXPECT_EQ(counted["saga_ids"], Json::array({done}));
  EXPECT_EQ(Status(done)["pruned"], false) << "a dry run changes nothing";

  ProcResult pruned = Run({"prune", "--older-than", "0s"});
  ASSERT_EQ(pruned.code, 0) << pruned.Describe();
  EXPECT_NE(pruned.out.find("pruned 1 saga(s) (inputs and results)"), std::string::npos)
      << pruned.out;

  Json after = Status(done);
  EXPECT_EQ(after["state"], "succeeded");
  EXPECT_EQ(after["pruned"], true);
  EXPECT_EQ(after["input"], Json::object());
  for (const Json& st : after["steps"]) {
    EXPECT_TRUE(st["args"].is_null()) << st.dump();
    EXPECT_TRUE(st["result"].is_null()) << st.dump();
  }
  bool journaled = false;
  for (const Json& e : after["journal"]) journaled |= e["event"] == "saga_pruned";
  EXPECT_TRUE(journaled);
  EXPECT_EQ(after.dump().find("\"Ana\""), std::string::npos) << "no traveller left";

  // The live saga (waiting for its approval) is untouched.
  Json live_after = Status(live);
  EXPECT_EQ(live_after["pruned"], false);
  EXPECT_EQ(live_after["input"], live_before["input"]);
  EXPECT_EQ(live_after["steps"], live_before["steps"]);

  // The intent key still answers with its saga; other content is a conflict.
  ProcResult again =
      Run({"run", kTripSpec, "--input", std::string("@") + kTripInput, "--intent-key", "ana-done"});
  EXPECT_EQ(again.code, 0) << again.Describe();
  EXPECT_NE(again.out.find(done), std::string::npos) << again.out;
  ProcResult other =
      Run({"run", kTripSpec, "--input", R"({"traveller": "Bea"})", "--intent-key", "ana-done"});
  EXPECT_EQ(other.code, cli::kExitConflict) << other.Describe();

  // Idempotent.
  ProcResult twice = Run({"prune", "--older-than", "0s", "--json"});
  ASSERT_EQ(twice.code, 0) << twice.Describe();
  EXPECT_EQ(Json::parse(twice.out, nullptr, false)["sagas"], 0);
}

TEST_F(PruneTest, RedactReplacesOnlyTheNamedFields) {
  const std::string done = FinishTrip("ana-done");
  ProcResult pruned = Run({"prune", "--older-than", "0s", "--redact", "traveller,currency"});
  ASSERT_EQ(pruned.code, 0) << pruned.Describe();
  Json after = Status(done);
  EXPECT_EQ(after["pruned"], true);
  EXPECT_EQ(after["input"]["traveller"], "[redacted]");
  EXPECT_EQ(after["input"]["currency"], "[redacted]");
  EXPECT_EQ(after["input"]["city"], "Tokyo");
  EXPECT_EQ(after.dump().find("\"Ana\""), std::string::npos);
}

TEST_F(PruneTest, BadFlagsAreRefusedNamingTheFlag) {
  ProcResult bad = Run({"prune", "--older-than", "30 days"});
  EXPECT_EQ(bad.code, cli::kExitUsage) << bad.Describe();
  EXPECT_NE(bad.err.find("--older-than: expected a duration"), std::string::npos) << bad.err;
  ProcResult fields = Run({"prune", "--older-than", "1d", "--redact", "a,,b"});
  EXPECT_EQ(fields.code, cli::kExitUsage) << fields.Describe();
  EXPECT_NE(fields.err.find("--redact"), std::string::npos) << fields.err;
}

TEST_F(PruneTest, WorkerPrunesInTheBackground) {
  const std::string done = FinishTrip("ana-done");
  const fs::path out = dir_ / "worker.out";
  const fs::path err = dir_ / "worker.err";
  std::vector<std::string> argv = {
      kBinary, "--db",          db_, "worker", "--poll-ms", "50", "--prune-older-than",
      "0s",    "--prune-every", "1s"};
  std::vector<char*> cargs;
  for (auto& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, kBinary, &fa, nullptr, cargs.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  bool pruned = false;
  for (int i = 0; i < 100 && !pruned; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ProcResult st = Run({"status", done, "--json"});
    Json j = Json::parse(st.out, nullptr, false);
    pruned = j.is_object() && j.value("pruned", false);
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(pruned) << Slurp(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Slurp(err);
}

}  // namespace
}  // namespace idem::testing_cli
