// The command line as an operator meets it, on the real travel-booking
// binary: global options after the subcommand, structured logs on stderr
// with nothing secret in them, and a CLI that answers at once when another
// process drives the journal.

#include "cli/cli.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

#include <fcntl.h>
#include <openssl/sha.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace idem {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kBinary = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";
constexpr const char* kTripSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip.json";
constexpr const char* kTripInput = IDEM_SOURCE_DIR "/examples/travel_booking/input.json";

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

/// A travel-booking process: stdout and stderr in files of their own.
struct Proc {
  pid_t pid = -1;
  fs::path out, err;
  int code = -1;
  std::string stdout_text, stderr_text;

  /// Waits for the process and reads what it wrote.
  void Wait() {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    stdout_text = Slurp(out);
    stderr_text = Slurp(err);
  }
  std::string Describe() const {
    return "exit " + std::to_string(code) + "\n--- stdout\n" + stdout_text + "--- stderr\n" +
           stderr_text;
  }
};

/// The saga id a `run` printed ("saga SG (new, ...)"); "" when none.
std::string SagaOf(const Proc& p) {
  const size_t at = p.stdout_text.find("saga ");
  if (at == std::string::npos) return "";
  return p.stdout_text.substr(at + 5, p.stdout_text.find(' ', at + 5) - at - 5);
}

class CliTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("idem_cli_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = (dir_ / "trip.db").string();
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  /// Starts travel-booking with exactly `args` (no global options added)
  /// and `env` ("NAME=value") besides the test's environment.
  Proc Start(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    Proc p;
    p.out = dir_ / ("p" + std::to_string(++count_) + ".out");
    p.err = dir_ / ("p" + std::to_string(count_) + ".err");
    p.pid = test::SpawnProcess(kBinary, args, p.out.string(), p.err.string(), env);
    return p;
  }
  Proc Run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    Proc p = Start(args, env);
    p.Wait();
    return p;
  }

  /// Runs the trip (`spec`) to its approval; returns the payment's token.
  std::string RunToApproval(const std::vector<std::string>& extra = {},
                            const std::string& spec = kTripSpec) {
    std::vector<std::string> args = {"run",  spec, "--input", std::string("@") + kTripInput,
                                     "--db", db_};
    args.insert(args.end(), extra.begin(), extra.end());
    Proc run = Run(args);
    run_stderr_ += run.stderr_text;
    EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
    Proc list = Run({"approvals", "--json", "--db", db_});
    EXPECT_EQ(list.code, 0) << list.Describe();
    Json pending = Json::parse(list.stdout_text, nullptr, false);
    if (!pending.is_array() || pending.empty()) {
      ADD_FAILURE() << list.Describe();
      return "";
    }
    return pending.back().value("token", "");
  }

  /// Starts `serve` on a free loopback port; returns its port (0 on failure).
  int Serve(Proc* p, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--db", db_, "serve", "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    *p = Start(args);
    for (int i = 0; i < 300; ++i) {
      std::string out = Slurp(p->out);
      size_t at = out.find("listening on 127.0.0.1:");
      if (at != std::string::npos) return std::atoi(out.c_str() + at + 23);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "serve did not start: " << Slurp(p->err);
    return 0;
  }
  static void Stop(Proc* p) {
    ::kill(p->pid, SIGTERM);
    p->Wait();
  }

  fs::path dir_;
  std::string db_;
  std::string run_stderr_;
  int count_ = 0;
};

// ---- who decides: a credential checked against the auth file

std::string Sha256Hex(const std::string& s) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), md);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : md) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

// Writes `text` to `name` in the test's directory, readable by its owner
// only (mode 0600 unless `mode` says otherwise); returns its path.
std::string Private(const fs::path& dir, const std::string& name, const std::string& text,
                    fs::perms mode = fs::perms::owner_read | fs::perms::owner_write) {
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  fs::permissions(p, mode);
  return p.string();
}

// A two-person finance quorum (tests/specs/trip_quorum.json) could once be
// filled by one local user as `--as a --role finance`, then `--as b --role
// finance`: the command line's word. Now a decision that counts toward it
// needs a credential checked against the auth file, and the roles are the
// auth file's.
TEST_F(CliTest, ApprovalsUnderAPolicyNeedACredentialCheckedAgainstTheAuthFile) {
  const std::string quorum = IDEM_SOURCE_DIR "/tests/specs/trip_quorum.json";
  const std::string token = RunToApproval({}, quorum);
  ASSERT_FALSE(token.empty());
  const std::string auth = Private(
      dir_, "auth.json",
      Json::array(
          {{{"name", "maria"},
            {"token_sha256", Sha256Hex("tok-maria")},
            {"roles", {"approver", "finance"}}},
           {{"name", "jonas"}, {"token_sha256", Sha256Hex("tok-jonas")}, {"roles", {"finance"}}},
           {{"name", "omar"}, {"token_sha256", Sha256Hex("tok-omar")}, {"roles", {"approver"}}}})
          .dump());
  const std::string maria = Private(dir_, "maria.token", "tok-maria\n");
  auto approve = [&](std::vector<std::string> extra, std::vector<std::string> env = {}) {
    std::vector<std::string> args = {"approve", token, "--db", db_};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args, env);
  };
  auto state = [&] {
    Proc list = Run({"approvals", "--json", "--db", db_});
    Json pending = Json::parse(list.stdout_text, nullptr, false);
    return pending.is_array() && !pending.empty() ? pending[0] : Json();
  };
  // The command line's word: refused, and the message says how to pass a credential.
  for (const char* who : {"a", "b"}) {
    Proc word = approve({"--as", who, "--role", "finance"});
    EXPECT_EQ(word.code, cli::kExitUsage) << word.Describe();
    EXPECT_NE(word.stderr_text.find("--role is no longer taken"), std::string::npos)
        << word.Describe();
    Proc bare = approve({"--as", who});
    EXPECT_EQ(bare.code, cli::kExitUsage) << bare.Describe();
    EXPECT_NE(bare.stderr_text.find("authentication required"), std::string::npos)
        << bare.Describe();
    EXPECT_NE(bare.stderr_text.find("--credential @FILE"), std::string::npos) << bare.Describe();
    EXPECT_NE(bare.stderr_text.find("IDEM_CREDENTIAL"), std::string::npos) << bare.Describe();
  }
  EXPECT_EQ(state()["approvals"].size(), 0u) << "nothing counted";
  // Credentials given wrongly: each refused with what to do instead.
  const std::vector<std::pair<std::vector<std::string>, std::string>> wrong = {
      {{"--auth", auth, "--credential", "tok-maria"}, "visible to every local user"},
      {{"--credential", "@" + maria}, "give --auth FILE"},
      {{"--auth", auth}, "needs your credential"},
      {{"--auth", auth, "--credential",
        "@" + Private(dir_, "shared.token", "tok-maria",
                      fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read)},
       "chmod 600"},
      {{"--auth", auth, "--credential", "@" + Private(dir_, "nobody.token", "tok-nobody")},
       "matches no caller of " + auth},
      {{"--auth", auth, "--credential", "@" + maria, "--as", "jonas"}, "the credential is maria's"},
      {{"--auth", auth, "--credential", "@" + Private(dir_, "omar.token", "tok-omar")},
       "does not hold the role finance"},
  };
  for (const auto& [extra, message] : wrong) {
    Proc p = approve(extra);
    EXPECT_EQ(p.code, cli::kExitUsage) << message << "\n" << p.Describe();
    EXPECT_NE(p.stderr_text.find(message), std::string::npos) << p.Describe();
    EXPECT_EQ(p.stderr_text.find("tok-"), std::string::npos) << "no token in the message";
  }
  // maria proves who she is: counted, one of two (exit 7).
  Proc first = approve({"--auth", auth, "--credential", "@" + maria, "--as", "Maria"});
  EXPECT_EQ(first.code, cli::kExitAwaitingApproval) << first.Describe();
  Json after = state();
  ASSERT_EQ(after["approvals"].size(), 1u) << after.dump();
  EXPECT_EQ(after["approvals"][0]["by"], "maria");
  // maria again, by the environment variable: the same person (exit 10).
  Proc again = approve({"--auth", auth}, {"IDEM_CREDENTIAL=tok-maria"});
  EXPECT_EQ(again.code, cli::kExitAlreadyDecided) << again.Describe();
  // jonas, by the environment variable: the quorum is met, the trip pays.
  Proc second = approve({"--auth", auth, "--note", "invoice ok"}, {"IDEM_CREDENTIAL=tok-jonas"});
  EXPECT_EQ(second.code, cli::kExitOk) << second.Describe();
}

// An auth file whose names fold alike (NFKC + case fold) is refused, naming
// both: "maria" and "Maria" would count as two people.
TEST_F(CliTest, AnAuthFileWithNamesThatFoldAlikeIsRefusedNamingBoth) {
  const std::string token = RunToApproval();
  ASSERT_FALSE(token.empty());
  const std::string auth = Private(
      dir_, "auth.json",
      Json::array({{{"name", "maria"}, {"token_sha256", Sha256Hex("t1")}, {"roles", {"approver"}}},
                   {{"name", "Maria"}, {"token_sha256", Sha256Hex("t2")}, {"roles", {"approver"}}}})
          .dump());
  Proc p = Run({"approve", token, "--db", db_, "--auth", auth}, {"IDEM_CREDENTIAL=t2"});
  EXPECT_EQ(p.code, cli::kExitUsage) << p.Describe();
  EXPECT_NE(p.stderr_text.find("auth[1].name: \"Maria\" and auth[0].name \"maria\" are one name"),
            std::string::npos)
      << p.Describe();
  // Without a credential, --as still names who decides an "approval": "human" commit.
  Proc word = Run({"approve", token, "--db", db_, "--as", "maria"});
  EXPECT_EQ(word.code, cli::kExitOk) << word.Describe();
}

// ---- global options after the subcommand

TEST_F(CliTest, GlobalOptionsWorkAfterTheSubcommand) {
  const std::string ledger = (dir_ / "ledger.sqlite").string();
  const std::string keys = (dir_ / "my.keys.json").string();
  Proc run = Run({"run", kTripSpec, "--input", std::string("@") + kTripInput, "--db", db_, "--keys",
                  keys, "--ledger", ledger, "--log-level", "info"});
  EXPECT_EQ(run.code, cli::kExitAwaitingApproval) << run.Describe();
  EXPECT_TRUE(fs::exists(db_));
  EXPECT_TRUE(fs::exists(keys)) << "--keys after the subcommand";
  EXPECT_TRUE(fs::exists(ledger)) << "the program's own --ledger after the subcommand";
  EXPECT_FALSE(fs::exists(db_ + ".keys.json"));

  Proc list = Run({"list", "--json", "--store", db_});
  ASSERT_EQ(list.code, 0) << list.Describe();
  Json sagas = Json::parse(list.stdout_text, nullptr, false);
  ASSERT_TRUE(sagas.is_array()) << list.Describe();
  EXPECT_EQ(sagas.size(), 1u);

  // Before the subcommand still works, and both places together.
  Proc before = Run({"--db", db_, "list", "--json", "--log-format", "json"});
  EXPECT_EQ(before.code, 0) << before.Describe();
  EXPECT_EQ(before.stdout_text, list.stdout_text);
}

TEST_F(CliTest, BadLogOptionsAreUsageErrors) {
  Proc fmt = Run({"list", "--db", db_, "--log-format", "xml"});
  EXPECT_EQ(fmt.code, cli::kExitUsage) << fmt.Describe();
  Proc lvl = Run({"list", "--db", db_, "--log-level", "loud"});
  EXPECT_EQ(lvl.code, cli::kExitUsage) << lvl.Describe();
}

// ---- no hanging decisions

TEST_F(CliTest, ApproveAnswersAtOnceWhileAServerDrivesTheJournal) {
  const std::string token = RunToApproval();
  ASSERT_FALSE(token.empty());
  Proc serve;
  ASSERT_GT(Serve(&serve, {"--insecure-no-auth"}), 0);

  auto t0 = std::chrono::steady_clock::now();
  Proc approve = Run({"approve", token, "--as", "maria", "--db", db_});
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(1));
  EXPECT_EQ(approve.code, cli::kExitBusy) << approve.Describe();
  EXPECT_NE(approve.stderr_text.find("error: the journal " + db_ +
                                     " is being driven by another process (pid " +
                                     std::to_string(serve.pid)),
            std::string::npos)
      << approve.Describe();
  EXPECT_NE(approve.stderr_text.find("POST /v1/approvals/TOKEN/approve"), std::string::npos)
      << approve.Describe();
  EXPECT_EQ(approve.stderr_text.find(token), std::string::npos) << "no token in the message";

  Proc reject = Run({"reject", token, "--as", "maria", "--reason", "no", "--db", db_});
  EXPECT_EQ(reject.code, cli::kExitBusy) << reject.Describe();
  EXPECT_NE(reject.stderr_text.find("POST /v1/approvals/TOKEN/reject"), std::string::npos)
      << reject.Describe();
  Proc recover = Run({"recover", "--db", db_});
  EXPECT_EQ(recover.code, cli::kExitBusy) << recover.Describe();

  Stop(&serve);
  // Nothing was decided: the approval is still waiting, and now goes through.
  Proc later = Run({"approve", token, "--as", "maria", "--db", db_});
  EXPECT_EQ(later.code, cli::kExitOk) << later.Describe();
}

// ---- durable requests: cancel, pause, resume

TEST_F(CliTest, CancelPauseResumeAreDurableRequestsThatNeedNoDriverLock) {
  ASSERT_FALSE(RunToApproval().empty());
  auto last_saga = [&] {
    Proc list = Run({"list", "--json", "--db", db_});
    Json sagas = Json::parse(list.stdout_text, nullptr, false);
    return sagas.is_array() && !sagas.empty() ? sagas.front().value("saga_id", "") : "";
  };
  const std::string id = last_saga();
  ASSERT_FALSE(id.empty());
  // Pause refuses a saga waiting for a person (usage), with the place.
  Proc pause = Run({"pause", id, "--as", "ops", "--db", db_});
  EXPECT_EQ(pause.code, cli::kExitUsage) << pause.Describe();
  EXPECT_NE(pause.stderr_text.find("saga " + id + " is awaiting_approval"), std::string::npos)
      << pause.Describe();
  Proc nobody = Run({"cancel", id, "--db", db_});
  EXPECT_EQ(nobody.code, cli::kExitUsage) << "--as is required: " << nobody.Describe();
  Proc absent = Run({"cancel", "sg_absent", "--as", "ops", "--db", db_});
  EXPECT_EQ(absent.code, cli::kExitNotFound) << absent.Describe();
  // Nobody else drives the journal: the cancel is carried out here.
  Proc cancel = Run({"cancel", id, "--as", "ops", "--reason", "trip called off", "--db", db_});
  EXPECT_EQ(cancel.code, cli::kExitRolledBack) << cancel.Describe();
  EXPECT_NE(cancel.stdout_text.find("cancel: cancelled: the saga is compensated"),
            std::string::npos)
      << cancel.Describe();
  Proc twice = Run({"cancel", id, "--as", "ops", "--db", db_});
  EXPECT_EQ(twice.code, cli::kExitRolledBack) << twice.Describe();
  EXPECT_NE(twice.stdout_text.find("the cancel was carried out"), std::string::npos)
      << twice.Describe();
  Proc resume = Run({"resume", id, "--as", "ops", "--db", db_});
  EXPECT_EQ(resume.code, cli::kExitUsage) << resume.Describe();
  EXPECT_NE(resume.stderr_text.find("a finished saga cannot be resumed"), std::string::npos)
      << resume.Describe();

  // While `serve` drives the journal, the request is written anyway (it is a
  // store write) and the server carries it out; the CLI answers at once.
  ASSERT_FALSE(RunToApproval().empty());
  const std::string second = last_saga();
  ASSERT_NE(second, id);
  Proc serve;
  ASSERT_GT(Serve(&serve, {"--insecure-no-auth"}), 0);
  auto t0 = std::chrono::steady_clock::now();
  Proc recorded = Run({"cancel", second, "--as", "ops", "--db", db_});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(recorded.code, cli::kExitOk) << recorded.Describe();
  EXPECT_NE(recorded.stdout_text.find("pid " + std::to_string(serve.pid) +
                                      " (`serve`) drives this journal"),
            std::string::npos)
      << recorded.Describe();
  std::string state;
  for (int i = 0; i < 300 && state != "compensated"; ++i) {
    Proc st = Run({"status", second, "--json", "--db", db_});
    state = Json::parse(st.stdout_text, nullptr, false).value("state", "");
    if (state != "compensated") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(state, "compensated") << "the server honoured the request";
  Stop(&serve);
}

// ---- structured logs

// The values that must never reach a log: commit tokens, the signing keys,
// bearer tokens and the auth file's contents.
std::vector<std::string> KeySecrets(const std::string& keys_path) {
  std::vector<std::string> out;
  Json doc = Json::parse(Slurp(keys_path), nullptr, false);
  if (!doc.is_object() || !doc["keys"].is_object()) return out;
  for (const auto& [id, k] : doc["keys"].items()) out.push_back(k.value("secret", ""));
  return out;
}

// A provider that finishes later, from the command line (saga/completion.h):
// with the HTTP tools file as a global option, `run` exits 14 while the
// provider works on the call it accepted, and `status` shows it waiting. Once
// the provider is done and its Retry-After has passed, `recover` asks its
// status endpoint and the saga succeeds: one call, never a second one.
TEST_F(CliTest, ARunWhoseProviderFinishesLaterExitsAwaitingCompletionUntilRecoverSeesItDone) {
  httplib::Server provider;
  std::mutex mu;
  int posts = 0;
  int lookups = 0;
  bool done = false;
  provider.Post("/visas", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    ++posts;
    res.status = 202;
    res.set_header("Retry-After", "1");
    res.set_content(R"({"id":"job-1"})", "application/json");
  });
  provider.Get(R"(/visas/status/(.+))", [&](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    ++lookups;
    res.set_content(done ? R"({"status":"applied","result":{"visa":"V-1"}})"
                         : R"({"status":"pending","id":"job-1"})",
                    "application/json");
  });
  provider.Post("/visas/withdraw", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  const int port = provider.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  struct Serving {  // stopped and joined on every way out of the test
    httplib::Server* server;
    std::thread thread;
    ~Serving() {
      server->stop();
      thread.join();
    }
  } serving{&provider, std::thread([&] { provider.listen_after_bind(); })};
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  const Json tools_doc = {
      {"tools",
       {{{"name", "visas.apply"},
         {"effect", "write"},
         {"base_url", base},
         {"commit", {{"method", "POST"}, {"path", "/visas"}}},
         {"status", {{"method", "GET"}, {"path", "/visas/status/{key}"}}},
         {"honours_keys", true},
         {"completion", {{"mode", "accepted"}, {"window", "1h"}, {"first_check", "1s"}}}},
        {{"name", "visas.withdraw"},
         {"effect", "idempotent"},
         {"base_url", base},
         {"commit", {{"method", "POST"}, {"path", "/visas/withdraw"}}},
         {"honours_keys", true}}}}};
  const std::string tools = (dir_ / "tools.json").string();
  std::ofstream(tools) << tools_doc.dump();
  const std::string spec = (dir_ / "visa.json").string();
  std::ofstream(spec) << R"({"name": "visa", "steps": [{"id": "visa", "tool": "visas.apply",
      "compensate": {"tool": "visas.withdraw"}}]})";

  Proc run = Run({"run", spec, "--db", db_, "--tools", tools});
  EXPECT_EQ(run.code, cli::kExitAwaitingCompletion) << run.Describe();
  EXPECT_NE(run.stdout_text.find("outcome: awaiting_completion"), std::string::npos)
      << run.Describe();
  const std::string id = SagaOf(run);
  ASSERT_FALSE(id.empty()) << run.Describe();
  Proc waiting = Run({"status", id, "--db", db_});
  EXPECT_EQ(waiting.code, cli::kExitOk) << waiting.Describe();  // the read succeeded
  EXPECT_NE(waiting.stdout_text.find("awaiting_completion"), std::string::npos)
      << waiting.Describe();
  EXPECT_NE(waiting.stdout_text.find("processing"), std::string::npos) << waiting.Describe();

  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1'200));  // past the Retry-After
  Proc recover = Run({"recover", "--db", db_, "--tools", tools});
  EXPECT_EQ(recover.code, cli::kExitOk) << recover.Describe();
  Proc finished = Run({"status", id, "--db", db_});
  EXPECT_EQ(finished.code, cli::kExitOk) << finished.Describe();
  EXPECT_NE(finished.stdout_text.find("succeeded"), std::string::npos) << finished.Describe();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(posts, 1);
  EXPECT_GE(lookups, 1);
}

// The travel example's slow provider (transfers.book, providers.h) from the
// command line: the trip waits for the transfer (exit 14, nothing held), a
// later `recover` sees it confirmed and the payment runs; a declined
// transfer rolls back the flight, hotel and car that were booked.
TEST_F(CliTest, TheAsyncTripWaitsForTheTransferThenPaysOrRollsBackWhenDeclined) {
  constexpr const char* kAsyncSpec = IDEM_SOURCE_DIR "/examples/travel_booking/trip_async.json";
  const std::string input = std::string("@") + kTripInput;
  auto step_states = [&](const std::string& db, const std::string& id) {
    Proc st = Run({"status", id, "--json", "--db", db});
    EXPECT_EQ(st.code, 0) << st.Describe();
    std::map<std::string, std::string> states;
    Json doc = Json::parse(st.stdout_text, nullptr, false);
    for (const Json& step : doc.value("steps", Json::array())) {
      states[step.value("id", "")] = step.value("state", "");
    }
    states["saga"] = doc.value("state", "");
    return states;
  };

  Proc run = Run({"run", kAsyncSpec, "--input", input, "--db", db_, "--confirm-delay-ms", "1000"});
  EXPECT_EQ(run.code, cli::kExitAwaitingCompletion) << run.Describe();
  const std::string id = SagaOf(run);
  ASSERT_FALSE(id.empty()) << run.Describe();
  auto waiting = step_states(db_, id);
  EXPECT_EQ(waiting["book_transfer"], "processing");
  EXPECT_EQ(waiting["reserve_flight"], "succeeded");
  EXPECT_EQ(waiting["charge_payment"], "planned");
  std::this_thread::sleep_for(std::chrono::milliseconds(1'300));  // the job is ready
  Proc recover = Run({"recover", "--db", db_, "--confirm-delay-ms", "1000"});
  EXPECT_EQ(recover.code, cli::kExitOk) << recover.Describe();
  auto done = step_states(db_, id);
  EXPECT_EQ(done["saga"], "succeeded");
  EXPECT_EQ(done["book_transfer"], "succeeded");
  EXPECT_EQ(done["charge_payment"], "succeeded");

  const std::string declined_db = (dir_ / "declined.db").string();
  Proc run2 = Run({"run", kAsyncSpec, "--input", input, "--db", declined_db, "--confirm-delay-ms",
                   "0", "--fault", "transfers.book=decline"});
  EXPECT_EQ(run2.code, cli::kExitAwaitingCompletion) << run2.Describe();
  const std::string id2 = SagaOf(run2);
  ASSERT_FALSE(id2.empty()) << run2.Describe();
  std::this_thread::sleep_for(std::chrono::milliseconds(1'300));  // the first check (1 s)
  Proc recover2 = Run({"recover", "--db", declined_db});
  EXPECT_EQ(recover2.code, cli::kExitRolledBack) << recover2.Describe();
  auto rolled = step_states(declined_db, id2);
  EXPECT_EQ(rolled["saga"], "compensated");
  EXPECT_EQ(rolled["book_transfer"], "failed");
  EXPECT_EQ(rolled["reserve_flight"], "compensated");
  EXPECT_EQ(rolled["book_hotel"], "compensated");
  EXPECT_EQ(rolled["rent_car"], "compensated");
  EXPECT_EQ(rolled["charge_payment"], "planned");
}

TEST_F(CliTest, DebugLogsCarryTheFieldsAndNoSecret) {
  const std::vector<std::string> debug = {"--log-level", "debug"};
  std::string logs;
  // A two-phase saga to its approval, approved from the CLI.
  const std::string token1 = RunToApproval(debug);
  ASSERT_FALSE(token1.empty());
  logs += run_stderr_;
  Proc approve = Run({"approve", token1, "--as", "maria", "--db", db_, "--log-level", "debug"});
  EXPECT_EQ(approve.code, 0) << approve.Describe();
  logs += approve.stderr_text;
  Proc bad = Run({"approve", token1 + "x", "--as", "maria", "--db", db_, "--log-level", "debug"});
  EXPECT_NE(bad.code, 0) << bad.Describe();
  logs += bad.stderr_text;

  // A second one, approved through `serve` with a bearer token.
  const std::string token2 = RunToApproval({"--intent-key", "second", "--log-level", "debug"});
  ASSERT_FALSE(token2.empty());
  logs += run_stderr_;
  const std::string bearer = "s3cr3t-bearer-value-0123456789";
  const std::string auth = (dir_ / "auth.json").string();
  const std::string auth_text =
      Json::array(
          {{{"name", "maria"}, {"token_sha256", Sha256Hex(bearer)}, {"roles", {"approver"}}}})
          .dump();
  std::ofstream(auth) << auth_text;
  Proc serve;
  int port = Serve(&serve, {"--auth", auth, "--log-level", "debug"});
  ASSERT_GT(port, 0);
  httplib::Client http("127.0.0.1", port);
  httplib::Headers h = {{"Authorization", "Bearer " + bearer}};
  auto listed = http.Get("/v1/approvals", h);
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->status, 200) << listed->body;
  auto approved = http.Post(("/v1/approvals/" + token2 + "/approve").c_str(), h,
                            R"({"note":"within budget"})", "application/json");
  ASSERT_TRUE(approved);
  EXPECT_EQ(approved->status, 200) << approved->body;
  auto refused = http.Get("/v1/approvals", {{"Authorization", "Bearer wrong-" + bearer}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  Stop(&serve);
  logs += serve.stderr_text;

  std::vector<std::string> secrets = KeySecrets(db_ + ".keys.json");
  ASSERT_FALSE(secrets.empty());
  secrets.insert(secrets.end(), {token1, token2, bearer, Sha256Hex(bearer), auth_text});
  for (const auto& s : secrets) {
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(logs.find(s), std::string::npos) << "a secret in the logs: " << s << "\n" << logs;
    // Nor any long piece of one (a token cut or re-encoded would still leak).
    EXPECT_EQ(logs.find(s.substr(s.size() / 2, 24)), std::string::npos) << s << "\n" << logs;
  }

  // The fields an operator needs, one line per event.
  for (const std::string want :
       {"saga_id=", "step=charge_payment", "key=", "attempt=1", "outcome=submitted",
        "outcome=awaiting_approval", "outcome=approved", "outcome=succeeded",
        "outcome=saga_succeeded", " debug ", " info ", " error "}) {
    EXPECT_NE(logs.find(want), std::string::npos) << want << "\n" << logs;
  }
  for (const auto& line : Lines(logs)) {
    if (line.find("outcome=") == std::string::npos) continue;
    EXPECT_NE(line.find("saga_id=sg_"), std::string::npos) << line;
  }
  // The server's own journal lines (the HTTP approval) are there too.
  EXPECT_NE(serve.stderr_text.find("outcome=approved"), std::string::npos) << serve.stderr_text;
}

TEST_F(CliTest, JsonLogsAreOneObjectPerLineAndStdoutStaysParseable) {
  const std::vector<std::string> json = {"--log-format", "json", "--log-level", "debug"};
  const std::string token = RunToApproval(json);
  ASSERT_FALSE(token.empty());
  std::string logs = run_stderr_;
  Proc approve = Run({"approve", token, "--as", "maria", "--db", db_, "--log-format", "json",
                      "--log-level", "debug"});
  EXPECT_EQ(approve.code, 0) << approve.Describe();
  logs += approve.stderr_text;
  Proc missing =
      Run({"status", "no-such-saga", "--db", db_, "--log-format", "json", "--log-level", "error"});
  EXPECT_EQ(missing.code, cli::kExitNotFound) << missing.Describe();

  int journal_lines = 0;
  bool saw_key = false;
  for (const auto& line : Lines(logs)) {
    Json j = Json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    EXPECT_TRUE(j.contains("ts") && j.contains("level") && j.contains("msg")) << line;
    if (j.value("msg", "") != "journal") continue;
    ++journal_lines;
    EXPECT_TRUE(j["saga_id"].is_string()) << line;
    EXPECT_TRUE(j["outcome"].is_string()) << line;
    if (j.contains("step")) {
      EXPECT_TRUE(j["key"].is_string()) << line;
      saw_key = true;
    }
    if (j.value("outcome", "") == "submitted") {
      EXPECT_TRUE(j["attempt"].is_number()) << line;
    }
  }
  EXPECT_GE(journal_lines, 10) << logs;
  EXPECT_TRUE(saw_key) << logs;
  EXPECT_EQ(logs.find(token), std::string::npos);

  // The error of a command is a JSON line too (with the person's message).
  bool error_line = false;
  for (const auto& line : Lines(missing.stderr_text)) {
    if (line.rfind("error: ", 0) == 0) continue;  // the message for the person
    Json j = Json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    if (j.value("level", "") == "error") error_line = true;
  }
  EXPECT_TRUE(error_line) << missing.stderr_text;

  // stdout is the command's output only.
  Proc list = Run({"list", "--json", "--db", db_, "--log-format", "json", "--log-level", "debug"});
  ASSERT_EQ(list.code, 0) << list.Describe();
  EXPECT_TRUE(Json::parse(list.stdout_text, nullptr, false).is_array()) << list.Describe();
}

}  // namespace
}  // namespace idem
