// HTTP tools (tools/http_tool.h) and the provider-side idempotency layer
// (server/idempotency.h), against real cpp-httplib servers on 127.0.0.1.
// RELIABILITY.md rows 6, 8, 9, 10, 11, 12 and 24.

#include "tools/http_tool.h"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <sqlite3.h>

#include "server/idempotency.h"
#include "tests/test_util.h"

#include "common/clock.h"
#include "common/json_util.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace idem {
namespace {

using server::IdempotencyLayer;
using server::IdempotencyOptions;
using server::WrapOptions;

// A client that gave up may leave the server writing to a closed socket.
[[maybe_unused]] const bool sigpipe_ignored = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

// ---- Harness ---------------------------------------------------------------------

/// An httplib::Server on an ephemeral loopback port, run on its own thread.
class TestServer {
 public:
  TestServer() = default;
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;
  TestServer(TestServer&&) = delete;
  TestServer& operator=(TestServer&&) = delete;
  ~TestServer() { Stop(); }

  httplib::Server& Http() { return svr_; }

  int Start() {
    port_ = svr_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) return port_;
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    for (int i = 0; i < 2000 && !svr_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return port_;
  }

  void Stop() {
    svr_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int Port() const { return port_; }

 private:
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
};

/// A one-shot gate a handler waits on.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

using test::UnusedPort;

/// A raw listening socket on loopback (for servers httplib cannot imitate).
struct RawListener {
  int fd = -1;
  int port = 0;
  RawListener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 8) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on a loopback port";
    }
    port = ntohs(addr.sin_port);
  }
  ~RawListener() { ::close(fd); }
  RawListener(const RawListener&) = delete;
  RawListener& operator=(const RawListener&) = delete;
  RawListener(RawListener&&) = delete;
  RawListener& operator=(RawListener&&) = delete;
};

/// Reads one HTTP request (headers and a Content-Length body) from `fd`.
std::string ReadRequest(int fd) {
  std::string in;
  std::array<char, 4096> buf{};
  size_t need = std::string::npos;
  while (need == std::string::npos || in.size() < need) {
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    in.append(buf.data(), static_cast<size_t>(n));
    size_t end = in.find("\r\n\r\n");
    if (need == std::string::npos && end != std::string::npos) {
      size_t length = 0;
      size_t cl = in.find("Content-Length: ");
      if (cl != std::string::npos && cl < end) length = std::stoul(in.substr(cl + 16));
      need = end + 4 + length;
    }
  }
  return in;
}

// Generous timeouts by default, so that a loaded machine never turns an answer
// into "unknown"; tests of timeouts pass kShortTimeoutMs.
constexpr int kDefaultTimeoutMs = 3000;
constexpr int kShortTimeoutMs = 300;

std::string ToolsDoc(int port, const std::string& extra = "", int timeout_ms = kDefaultTimeoutMs) {
  return R"({"tools": [{"name": "payments.charge", "effect": "write",
    "base_url": "http://127.0.0.1:)" +
         std::to_string(port) + R"(",
    "commit": {"method": "POST", "path": "/charges"},
    "status": {"method": "GET", "path": "/charges/status/{key}"},
    "preview": {"method": "POST", "path": "/charges/preview"},
    "honours_keys": true, "connect_timeout_ms": 1000, "timeout_ms": )" +
         std::to_string(timeout_ms) + extra + "}]}";
}

std::unique_ptr<Tool> MakeTool(int port, const std::string& extra = "",
                               int timeout_ms = kDefaultTimeoutMs) {
  Result<Json> doc = ParseJson(ToolsDoc(port, extra, timeout_ms), "test");
  EXPECT_OK(doc);
  Result<std::vector<HttpToolConfig>> configs = ParseHttpTools(*doc);
  EXPECT_OK(configs);
  Result<std::unique_ptr<Tool>> tool = NewHttpTool((*configs)[0]);
  EXPECT_OK(tool);
  return std::move(tool).value();
}

ToolCall Call(const std::string& key, Json args = Json::object()) {
  ToolCall c;
  c.tool = "payments.charge";
  c.key = key;
  c.args = std::move(args);
  return c;
}

// ---- Classification of every status class ------------------------------------------

struct ClassifyCase {
  std::string name;
  Json respond;  // what the server answers: {"status", "body", "type", "retry_after"}
  OutcomeKind kind;
  bool retryable = false;
  bool stale = false;
};

void PrintTo(const ClassifyCase& c, std::ostream* os) { *os << c.name; }

/// Answers POST /charges as the call's args say.
void Respond(const httplib::Request& req, httplib::Response& res) {
  Json a = Json::parse(req.body);
  res.status = a.at("status").get<int>();
  if (a.contains("type")) {
    Json problem = {{"type", a["type"]}, {"title", "t"}, {"status", res.status}};
    res.set_content(problem.dump(), "application/problem+json");
  } else if (a.contains("body")) {
    res.set_content(a["body"].get<std::string>(), "application/json");
  }
  if (a.value("retry_after", false)) res.set_header("Retry-After", "1");
  if (res.status >= 300 && res.status < 400) res.set_header("Location", "/elsewhere");
}

class HttpToolClassifyTest : public ::testing::TestWithParam<ClassifyCase> {};

TEST_P(HttpToolClassifyTest, StatusMapsToOutcome) {
  const ClassifyCase& c = GetParam();
  TestServer server;
  server.Http().Post("/charges", Respond);
  ASSERT_GT(server.Start(), 0);
  auto tool = MakeTool(server.Port());
  ToolOutcome o = tool->Invoke(Call("k1", c.respond));
  EXPECT_EQ(OutcomeKindName(o.kind), std::string(OutcomeKindName(c.kind))) << o.error;
  EXPECT_EQ(o.retryable, c.retryable) << o.error;
  EXPECT_EQ(o.stale, c.stale) << o.error;
  if (o.kind != OutcomeKind::kSucceeded) {
    EXPECT_NE(o.error.find("HTTP " + std::to_string(c.respond["status"].get<int>())),
              std::string::npos)
        << o.error;
  }
}

constexpr OutcomeKind kOk = OutcomeKind::kSucceeded;
constexpr OutcomeKind kFail = OutcomeKind::kFailed;
constexpr OutcomeKind kUnk = OutcomeKind::kUnknown;

INSTANTIATE_TEST_SUITE_P(
    EveryClass, HttpToolClassifyTest,
    ::testing::Values(
        ClassifyCase{"s200", {{"status", 200}, {"body", R"({"id":"ch_1"})"}}, kOk},
        ClassifyCase{"s201", {{"status", 201}, {"body", "{}"}}, kOk},
        ClassifyCase{"s204", {{"status", 204}}, kOk},
        ClassifyCase{"s302", {{"status", 302}}, kFail},
        ClassifyCase{"s400", {{"status", 400}, {"body", R"({"error":"bad"})"}}, kFail},
        ClassifyCase{"s402", {{"status", 402}, {"body", R"({"error":"card declined"})"}}, kFail},
        ClassifyCase{"s404", {{"status", 404}}, kFail},
        ClassifyCase{
            "s409_business", {{"status", 409}, {"type", "https://x.test/p/sold-out"}}, kFail},
        ClassifyCase{"s409_stale",
                     {{"status", 409}, {"type", "https://x.test/p/stale"}},
                     kFail,
                     false,
                     true},
        ClassifyCase{"s409_retry_after", {{"status", 409}, {"retry_after", true}}, kUnk},
        ClassifyCase{
            "s409_in_flight", {{"status", 409}, {"type", server::kProblemKeyInFlight}}, kUnk},
        ClassifyCase{"s412", {{"status", 412}}, kFail, false, true},
        ClassifyCase{"s422", {{"status", 422}, {"body", R"({"error":"amount"})"}}, kFail},
        ClassifyCase{
            "s422_key_reused", {{"status", 422}, {"type", server::kProblemKeyReused}}, kUnk},
        ClassifyCase{"s408", {{"status", 408}}, kFail, true},
        ClassifyCase{"s425", {{"status", 425}}, kFail, true},
        ClassifyCase{"s429", {{"status", 429}, {"retry_after", true}}, kFail, true},
        ClassifyCase{"s500", {{"status", 500}}, kUnk},
        ClassifyCase{"s501", {{"status", 501}}, kFail},
        ClassifyCase{"s502", {{"status", 502}}, kUnk},
        ClassifyCase{"s503", {{"status", 503}, {"retry_after", true}}, kFail, true},
        ClassifyCase{"s504", {{"status", 504}}, kUnk},
        ClassifyCase{"s507", {{"status", 507}}, kUnk}),
    [](const ::testing::TestParamInfo<ClassifyCase>& info) { return info.param.name; });

TEST(HttpToolTest, SuccessCarriesTheBodyAndTheExternalRef) {
  TestServer server;
  server.Http().Post("/charges", [](const httplib::Request&, httplib::Response& res) {
    res.status = 201;
    res.set_content(R"({"id": "ch_42", "amount": 1840})", "application/json");
  });
  server.Http().Post("/refs", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"id": "x", "external_ref": "ref_7"})", "application/json");
  });
  server.Http().Post("/text", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("done", "text/plain");
  });
  ASSERT_GT(server.Start(), 0);

  ToolOutcome o = MakeTool(server.Port())->Invoke(Call("k"));
  ASSERT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  EXPECT_EQ(o.result, Json::parse(R"({"id": "ch_42", "amount": 1840})"));
  EXPECT_EQ(o.external_ref, "ch_42");

  std::string doc = ToolsDoc(server.Port());
  // external_ref wins over id; a non-JSON body is kept as text.
  for (auto [path, ref, result] :
       {std::tuple<std::string, std::string, Json>{
            "/refs", "ref_7", Json::parse(R"({"id":"x","external_ref":"ref_7"})")},
        std::tuple<std::string, std::string, Json>{"/text", "", Json("done")}}) {
    HttpToolConfig c = (*ParseHttpTools(Json::parse(doc)))[0];
    c.commit.path = path;
    auto tool = std::move(NewHttpTool(c)).value();
    ToolOutcome t = tool->Invoke(Call("k"));
    ASSERT_EQ(t.kind, OutcomeKind::kSucceeded) << t.error;
    EXPECT_EQ(t.external_ref, ref);
    EXPECT_EQ(t.result, result);
  }
}

// ---- Headers ---------------------------------------------------------------------------

TEST(HttpToolTest, SendsKeyAttemptIfMatchAndTheArgsAsCanonicalJson) {
  TestServer server;
  std::mutex mu;
  std::vector<httplib::Request> seen;
  server.Http().Post("/charges", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(req);
    res.set_content("{}", "application/json");
  });
  ASSERT_GT(server.Start(), 0);
  auto tool = MakeTool(server.Port(), R"(, "headers": {"Authorization": "Bearer t0k"})");

  ToolCall call = Call("saga_1/charge", Json::parse(R"({"b": 2, "a": {"y": 1, "x": [1, 2]}})"));
  call.attempt = 2;
  call.expected_version = "\"v17\"";
  ASSERT_EQ(tool->Invoke(call).kind, OutcomeKind::kSucceeded);
  call.attempt = 1;
  call.expected_version.clear();
  ASSERT_EQ(tool->Invoke(call).kind, OutcomeKind::kSucceeded);

  ASSERT_EQ(seen.size(), 2u);
  const httplib::Request& r = seen[0];
  EXPECT_EQ(r.get_header_value("Idempotency-Key"), "saga_1/charge");
  EXPECT_EQ(r.get_header_value_count("Idempotency-Key"), 1u);
  EXPECT_EQ(r.get_header_value("Idempotency-Attempt"), "2");
  EXPECT_EQ(r.get_header_value("If-Match"), "\"v17\"");
  EXPECT_EQ(r.get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r.get_header_value("Authorization"), "Bearer t0k");
  EXPECT_EQ(r.body, R"({"a":{"x":[1,2],"y":1},"b":2})");
  EXPECT_FALSE(seen[1].has_header("If-Match"));
  EXPECT_EQ(seen[1].get_header_value("Idempotency-Attempt"), "1");
}

TEST(HttpToolTest, UnsendableKeyIsRefusedBeforeSending) {
  auto tool = MakeTool(UnusedPort());
  ToolOutcome o = tool->Invoke(Call("bad\r\nX-Injected: 1"));
  EXPECT_EQ(o.kind, OutcomeKind::kFailed);
  EXPECT_FALSE(o.retryable);
  EXPECT_NE(o.error.find("was not sent"), std::string::npos) << o.error;
}

// ---- Lost connections (row 24) ------------------------------------------------------------

/// A provider with an effect ledger keyed by Idempotency-Key and a status
/// endpoint; `commit_then_hang` applies the effect, then answers only after
/// the client has given up.
struct LedgerProvider {
  TestServer server;
  std::mutex mu;
  std::map<std::string, Json> ledger;
  std::atomic<int> commits{0};
  std::atomic<bool> commit_then_hang{false};

  LedgerProvider() {
    server.Http().Post("/charges", [this](const httplib::Request& req, httplib::Response& res) {
      std::string key = req.get_header_value("Idempotency-Key");
      Json result = {{"id", "ch_" + std::to_string(++commits)}, {"args", Json::parse(req.body)}};
      {
        std::lock_guard<std::mutex> lock(mu);
        ledger[key] = result;
      }
      if (commit_then_hang) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      res.set_content(result.dump(), "application/json");
    });
    server.Http().Get(R"(/charges/status/(.+))",
                      [this](const httplib::Request& req, httplib::Response& res) {
                        std::lock_guard<std::mutex> lock(mu);
                        auto it = ledger.find(req.matches[1]);
                        if (it == ledger.end()) {
                          res.status = 404;
                          res.set_content(R"({"status":"not_found"})", "application/json");
                          return;
                        }
                        Json body = {{"status", "applied"}, {"result", it->second}};
                        res.set_content(body.dump(), "application/json");
                      });
  }
};

TEST(HttpToolTest, EffectAppliedThenResponseLostIsUnknownAndLookupFindsIt) {
  LedgerProvider p;
  ASSERT_GT(p.server.Start(), 0);
  auto tool = MakeTool(p.server.Port(), "", kShortTimeoutMs);
  p.commit_then_hang = true;

  ToolOutcome o = tool->Invoke(Call("saga_9/charge", {{"amount", 5}}));
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown) << o.error;
  EXPECT_NE(o.error.find("may have taken effect"), std::string::npos) << o.error;
  EXPECT_EQ(p.commits.load(), 1);

  LookupOutcome l = tool->Lookup("saga_9/charge");
  ASSERT_EQ(l.kind, LookupKind::kApplied) << l.error;
  EXPECT_EQ(l.result["args"], Json({{"amount", 5}}));
  EXPECT_EQ(l.external_ref, "ch_1");
  EXPECT_EQ(p.commits.load(), 1);  // resolved without a re-call

  EXPECT_EQ(tool->Lookup("saga_9/other").kind, LookupKind::kNotApplied);
}

TEST(HttpToolTest, ConnectionResetAfterTheRequestLeftIsUnknown) {
  RawListener listener;
  std::atomic<bool> received{false};
  std::thread peer([&] {
    int fd = ::accept(listener.fd, nullptr, nullptr);
    if (fd < 0) return;
    received = ReadRequest(fd).find("\"amount\":5") != std::string::npos;
    linger hard{1, 0};  // close with RST
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(fd);
  });
  ToolOutcome o = MakeTool(listener.port)->Invoke(Call("k", {{"amount", 5}}));
  peer.join();
  EXPECT_TRUE(received.load());
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown) << o.error;
}

TEST(HttpToolTest, ServerThatNeverAnswersIsUnknown) {
  RawListener listener;  // accepts into the backlog, never reads or answers
  auto start = std::chrono::steady_clock::now();
  ToolOutcome o = MakeTool(listener.port, "", kShortTimeoutMs)->Invoke(Call("k"));
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown) << o.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(HttpToolTest, OversizedResponseIsAbandonedAsUnknown) {
  TestServer server;
  server.Http().Post("/charges", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string((8u << 20) + 1, 'x'), "text/plain");
  });
  ASSERT_GT(server.Start(), 0);
  ToolOutcome o = MakeTool(server.Port())->Invoke(Call("k"));
  EXPECT_EQ(o.kind, OutcomeKind::kUnknown) << o.error;
  EXPECT_NE(o.error.find("larger than 8388608 bytes"), std::string::npos) << o.error;
}

TEST(HttpToolTest, ConnectionRefusedIsFailedRetryable) {
  auto tool = MakeTool(UnusedPort());
  ToolOutcome o = tool->Invoke(Call("k"));
  EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
  EXPECT_TRUE(o.retryable);
  EXPECT_FALSE(o.stale);
  EXPECT_EQ(o.error, "payments.charge POST /charges: could not connect; the request was not sent");

  LookupOutcome l = tool->Lookup("k");
  EXPECT_EQ(l.kind, LookupKind::kError);
  PreviewOutcome p = tool->Preview(Call("k"));
  EXPECT_FALSE(p.ok);
  EXPECT_TRUE(p.retryable);
}

// ---- Lookup ---------------------------------------------------------------------------

TEST(HttpToolTest, LookupReadsTheStatusEndpoint) {
  TestServer server;
  std::mutex mu;
  std::vector<std::string> targets;
  server.Http().Get(
      R"(/charges/status/(.+))", [&](const httplib::Request& req, httplib::Response& res) {
        {
          std::lock_guard<std::mutex> lock(mu);
          targets.push_back(req.target);
        }
        const std::string key = req.matches[1];
        if (key == "saga 1/a") {
          res.set_content(R"({"status":"applied","result":{"id":"ch_1"}})", "application/json");
        } else if (key == "ref") {
          res.set_content(R"({"status":"SUCCEEDED","result":{},"external_ref":"r_2"})",
                          "application/json");
        } else if (key == "nf") {
          res.set_content(R"({"status":"not_found"})", "application/json");
        } else if (key == "failed") {
          res.set_content(R"({"status":"failed"})", "application/json");
        } else if (key == "pending") {
          res.set_content(R"({"status":"pending"})", "application/json");
        } else if (key == "gone") {
          res.status = 404;
          res.set_content(R"({"type":"about:blank","status":404})", "application/problem+json");
        } else if (key == "junk") {
          res.set_content("<html>", "text/html");
        } else {
          res.status = 500;
        }
      });
  ASSERT_GT(server.Start(), 0);
  auto tool = MakeTool(server.Port());
  ASSERT_TRUE(tool->info().has_status);

  LookupOutcome a = tool->Lookup("saga 1/a");
  ASSERT_EQ(a.kind, LookupKind::kApplied) << a.error;
  EXPECT_EQ(a.result, Json({{"id", "ch_1"}}));
  EXPECT_EQ(a.external_ref, "ch_1");
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets[0], "/charges/status/saga%201%2Fa");  // one encoded segment

  LookupOutcome r = tool->Lookup("ref");
  ASSERT_EQ(r.kind, LookupKind::kApplied) << r.error;
  EXPECT_EQ(r.external_ref, "r_2");
  EXPECT_EQ(tool->Lookup("nf").kind, LookupKind::kNotApplied);
  EXPECT_EQ(tool->Lookup("failed").kind, LookupKind::kNotApplied);
  EXPECT_EQ(tool->Lookup("gone").kind, LookupKind::kNotApplied);
  // "pending" is an answer, not an error: the provider holds the key and
  // has not finished (saga/completion.h).
  LookupOutcome pending = tool->Lookup("pending");
  EXPECT_EQ(pending.kind, LookupKind::kPending) << pending.error;
  EXPECT_EQ(tool->Lookup("junk").kind, LookupKind::kError);
  EXPECT_EQ(tool->Lookup("boom").kind, LookupKind::kError);
}

// Asynchronous completion over HTTP (saga/completion.h): a tool declared
// "completion": {"mode": "accepted"} takes 202 as accepted, not done, with
// the provider's reference and its Retry-After; a pending status answer
// carries its Retry-After too, which sets the next check. Retry-After as an
// HTTP date (or anything but whole seconds) leaves the tool's own backoff.
TEST(HttpToolTest, AcceptedAnswersAndPendingLookupsCarryTheProvidersRetryAfter) {
  TestServer server;
  server.Http().Post("/charges", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 202;
    res.set_content(R"({"id":"job-7"})", "application/json");
    const Json a = Json::parse(req.body);
    if (a.contains("retry_after"))
      res.set_header("Retry-After", a["retry_after"].get<std::string>());
  });
  server.Http().Get(R"(/charges/status/(.+))",
                    [](const httplib::Request& req, httplib::Response& res) {
                      const std::string key = req.matches[1];
                      res.set_content(R"({"status":"pending","id":"job-7"})", "application/json");
                      if (key == "soon") res.set_header("Retry-After", "4");
                      if (key == "dated")
                        res.set_header("Retry-After", "Wed, 21 Oct 2026 07:28:00 GMT");
                    });
  ASSERT_GT(server.Start(), 0);
  auto tool = MakeTool(server.Port(), R"(, "completion": {"mode": "accepted", "window": "2h"})");
  ASSERT_TRUE(tool->info().completion.accepts);
  EXPECT_EQ(tool->info().completion.window_ms, 2 * 3'600'000);

  ToolOutcome later = tool->Invoke(Call("k1", {{"retry_after", "7"}}));
  ASSERT_EQ(later.kind, OutcomeKind::kAccepted) << later.error;
  EXPECT_EQ(later.external_ref, "job-7");
  EXPECT_EQ(later.check_after_ms, 7'000);
  ToolOutcome plain = tool->Invoke(Call("k2"));
  ASSERT_EQ(plain.kind, OutcomeKind::kAccepted) << plain.error;
  EXPECT_EQ(plain.check_after_ms, 0);
  ToolOutcome dated = tool->Invoke(Call("k3", {{"retry_after", "Wed, 21 Oct 2026 07:28:00 GMT"}}));
  ASSERT_EQ(dated.kind, OutcomeKind::kAccepted) << dated.error;
  EXPECT_EQ(dated.check_after_ms, 0);

  LookupOutcome soon = tool->Lookup("soon");
  ASSERT_EQ(soon.kind, LookupKind::kPending) << soon.error;
  EXPECT_EQ(soon.check_after_ms, 4'000);
  EXPECT_EQ(soon.external_ref, "job-7");
  LookupOutcome no_hint = tool->Lookup("other");
  ASSERT_EQ(no_hint.kind, LookupKind::kPending) << no_hint.error;
  EXPECT_EQ(no_hint.check_after_ms, 0);
  EXPECT_EQ(tool->Lookup("dated").check_after_ms, 0);

  // Without the declaration a 202 is a success like any 2xx: the provider
  // did not say it would finish later.
  ToolOutcome done = MakeTool(server.Port())->Invoke(Call("k4"));
  EXPECT_EQ(done.kind, OutcomeKind::kSucceeded) << done.error;
}

TEST(HttpToolTest, BareNotFoundFromAWrongStatusPathIsAnErrorNotNotApplied) {
  TestServer server;  // no status route: httplib answers a bare 404
  ASSERT_GT(server.Start(), 0);
  LookupOutcome l = MakeTool(server.Port())->Lookup("k");
  EXPECT_EQ(l.kind, LookupKind::kError);
  EXPECT_NE(l.error.find("is the status path right?"), std::string::npos) << l.error;
}

// ---- Preview --------------------------------------------------------------------------

TEST(HttpToolTest, PreviewReadsSummaryChangesAndVersion) {
  TestServer server;
  std::atomic<bool> saw_key{false};
  server.Http().Post("/charges/preview", [&](const httplib::Request& req, httplib::Response& res) {
    saw_key = req.has_header("Idempotency-Key");
    Json a = Json::parse(req.body);
    int mode = a.value("mode", 0);
    if (mode == 1) {
      res.status = 500;
    } else if (mode == 2) {
      res.status = 400;
    } else if (mode == 3) {
      res.set_content(R"({"changes":{}})", "application/json");
    } else {
      res.set_content(
          R"({"summary":"charge EUR 18.40","changes":{"amount":1840},"resource_version":7})",
          "application/json");
    }
  });
  ASSERT_GT(server.Start(), 0);
  auto tool = MakeTool(server.Port());
  ASSERT_TRUE(tool->info().has_preview);

  PreviewOutcome p = tool->Preview(Call("k", {{"mode", 0}}));
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.summary, "charge EUR 18.40");
  EXPECT_EQ(p.changes, Json({{"amount", 1840}}));
  EXPECT_EQ(p.resource_version, "7");
  EXPECT_FALSE(saw_key.load());

  PreviewOutcome e500 = tool->Preview(Call("k", {{"mode", 1}}));
  EXPECT_FALSE(e500.ok);
  EXPECT_TRUE(e500.retryable);
  PreviewOutcome e400 = tool->Preview(Call("k", {{"mode", 2}}));
  EXPECT_FALSE(e400.ok);
  EXPECT_FALSE(e400.retryable);
  PreviewOutcome no_summary = tool->Preview(Call("k", {{"mode", 3}}));
  EXPECT_FALSE(no_summary.ok);
  EXPECT_EQ(no_summary.error, "payments.charge preview: the answer has no \"summary\" string");
}

// ---- Connections kept between calls ---------------------------------------------------

/// A provider that answers every charge and lookup and notes the client
/// port of each request: one port per connection the tool opened.
struct PortProvider {
  TestServer server;
  std::mutex mu;
  std::vector<int> ports;  // GUARDED_BY(mu), one per request
  std::atomic<int> commits{0};

  PortProvider() {
    server.Http().Post("/charges", [this](const httplib::Request& req, httplib::Response& res) {
      Note(req);
      res.set_content(R"({"id": "ch_)" + std::to_string(++commits) + "\"}", "application/json");
    });
    server.Http().Get(
        R"(/charges/status/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
          Note(req);
          res.set_content(R"({"status": "applied", "result": {}})", "application/json");
        });
  }
  void Note(const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mu);
    ports.push_back(req.remote_port);
  }
  size_t Connections() {
    std::lock_guard<std::mutex> lock(mu);
    return std::set<int>(ports.begin(), ports.end()).size();
  }
  size_t Requests() {
    std::lock_guard<std::mutex> lock(mu);
    return ports.size();
  }
};

/// The descriptor flags of this process's sockets connected to
/// 127.0.0.1:`port` (the connections a tool keeps to that provider).
std::vector<int> FlagsOfSocketsTo(int port) {
  std::vector<int> flags;
  for (int fd = 0; fd < 1024; ++fd) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (peer.sin_family != AF_INET || ntohs(peer.sin_port) != port) continue;
    flags.push_back(::fcntl(fd, F_GETFD));
  }
  return flags;
}

TEST(HttpToolTest, CallsInARowShareOneConnection) {
  PortProvider p;
  ASSERT_GT(p.server.Start(), 0);
  auto tool = MakeTool(p.server.Port());
  for (int i = 0; i < 3; ++i) {
    ToolOutcome o = tool->Invoke(Call("saga_1/step_" + std::to_string(i)));
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  }
  EXPECT_EQ(tool->Lookup("saga_1/step_0").kind, LookupKind::kApplied);
  EXPECT_EQ(p.Requests(), 4u);
  EXPECT_EQ(p.Connections(), 1u) << "every call after the first went on the kept connection";
  EXPECT_EQ(p.commits.load(), 3);
  // Kept open for the next call, and never inherited by a child process
  // (an MCP server the gateway starts later): cpp-httplib opens its sockets
  // close-on-exec.
  std::vector<int> kept = FlagsOfSocketsTo(p.server.Port());
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_NE(kept[0] & FD_CLOEXEC, 0);
}

TEST(HttpToolTest, AConnectionTheServerClosedIsReplacedAndEachCallSentOnce) {
  // Closed after each answer (Connection: close): a new one per call.
  {
    PortProvider p;
    p.server.Http().set_keep_alive_max_count(1);
    ASSERT_GT(p.server.Start(), 0);
    auto tool = MakeTool(p.server.Port());
    for (int i = 0; i < 3; ++i) {
      ToolOutcome o = tool->Invoke(Call("saga_2/step_" + std::to_string(i)));
      EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    }
    EXPECT_EQ(p.Connections(), 3u);
    EXPECT_EQ(p.commits.load(), 3);
  }
  // Closed by the server while idle (its keep-alive timeout, 1 s, inside
  // the tool's 2 s): noticed before the next request is written.
  {
    PortProvider p;
    p.server.Http().set_keep_alive_timeout(1);
    ASSERT_GT(p.server.Start(), 0);
    auto tool = MakeTool(p.server.Port());
    EXPECT_EQ(tool->Invoke(Call("saga_3/a")).kind, OutcomeKind::kSucceeded);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ToolOutcome o = tool->Invoke(Call("saga_3/b"));
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    EXPECT_EQ(p.Requests(), 2u);
    EXPECT_EQ(p.Connections(), 2u);
    EXPECT_EQ(p.commits.load(), 2);
  }
}

/// One kept connection that the peer resets under the second request,
/// then (if the tool connects again within 1 s) a new connection whose
/// request is answered. What the peer read, in order.
struct ResetUnderSecondRequest {
  RawListener listener;
  std::vector<std::string> requests;  // written by the peer thread; read after join
  bool reconnected = false;
  std::thread peer;

  ResetUnderSecondRequest() {
    peer = std::thread([this] {
      const std::string ok =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n"
          R"({"id":"ch_1"})";
      int a = ::accept(listener.fd, nullptr, nullptr);
      if (a < 0) return;
      requests.push_back(ReadRequest(a));
      (void)!::send(a, ok.data(), ok.size(), MSG_NOSIGNAL);
      requests.push_back(ReadRequest(a));  // the second, on the kept connection
      linger hard{1, 0};                   // then a reset, no answer
      ::setsockopt(a, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
      ::close(a);
      pollfd pf{listener.fd, POLLIN, 0};
      if (::poll(&pf, 1, 1000) != 1) return;
      int b = ::accept(listener.fd, nullptr, nullptr);
      if (b < 0) return;
      reconnected = true;
      requests.push_back(ReadRequest(b));
      const std::string again =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
          "Content-Length: 13\r\n\r\n"
          R"({"id":"ch_1"})";
      (void)!::send(b, again.data(), again.size(), MSG_NOSIGNAL);
      ::close(b);
    });
  }
  ~ResetUnderSecondRequest() {
    if (peer.joinable()) peer.join();
  }
};

std::string KeyOf(const std::string& request) {
  const std::string h = "Idempotency-Key: ";
  size_t at = request.find(h);
  if (at == std::string::npos) return "";
  return request.substr(at + h.size(), request.find("\r\n", at) - at - h.size());
}

TEST(HttpToolTest, AKeptConnectionResetUnderTheRequestIsResentOnceOnlyToAProviderThatHonoursKeys) {
  // honours_keys: the same request, same key, once more on a new connection.
  {
    ResetUnderSecondRequest peer;
    auto tool = MakeTool(peer.listener.port);
    EXPECT_EQ(tool->Invoke(Call("saga_4/a")).kind, OutcomeKind::kSucceeded);
    ToolOutcome o = tool->Invoke(Call("saga_4/b", {{"amount", 5}}));
    peer.peer.join();
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    ASSERT_TRUE(peer.reconnected);
    ASSERT_EQ(peer.requests.size(), 3u);
    EXPECT_EQ(KeyOf(peer.requests[1]), "saga_4/b");
    EXPECT_EQ(KeyOf(peer.requests[2]), "saga_4/b");
    EXPECT_NE(peer.requests[2].find("\"amount\":5"), std::string::npos);
  }
  // A provider that does not honour keys may have acted on it: unknown,
  // never sent again.
  {
    ResetUnderSecondRequest peer;
    std::string doc = ToolsDoc(peer.listener.port);
    doc.replace(doc.find("\"honours_keys\": true"), 20, "\"honours_keys\": false");
    Result<Json> parsed = ParseJson(doc, "test");
    ASSERT_OK(parsed);
    Result<std::vector<HttpToolConfig>> configs = ParseHttpTools(*parsed);
    ASSERT_OK(configs);
    Result<std::unique_ptr<Tool>> tool = NewHttpTool((*configs)[0]);
    ASSERT_OK(tool);
    EXPECT_EQ((*tool)->Invoke(Call("saga_5/a")).kind, OutcomeKind::kSucceeded);
    ToolOutcome o = (*tool)->Invoke(Call("saga_5/b"));
    peer.peer.join();
    EXPECT_EQ(o.kind, OutcomeKind::kUnknown) << o.error;
    EXPECT_FALSE(peer.reconnected) << "an uncertain call was sent again";
    EXPECT_EQ(peer.requests.size(), 2u);
  }
}

// ---- LoadHttpTools --------------------------------------------------------------------

struct LoadCase {
  std::string doc;
  std::string error;
};

TEST(LoadHttpToolsTest, ErrorsNameThePlace) {
  const std::string ok =
      R"({"name":"a","effect":"write","base_url":"http://127.0.0.1:1","commit":{"path":"/c"}})";
  auto second = [&](const std::string& tool) { return R"({"tools":[)" + ok + "," + tool + "]}"; };
  auto with = [](const std::string& fields) {
    return R"({"name":"b","effect":"write","base_url":"http://127.0.0.1:1","commit":{"path":"/c"})" +
           fields + "}";
  };
  const std::vector<LoadCase> cases = {
      {"{}", "tools: is required"},
      {R"({"tools":{}})", "tools: expected an array"},
      {R"({"tools":[], "x":1})", "x: unknown field"},
      {R"({"tools":[1]})", "tools[0]: expected an object"},
      {second(R"({"effect":"write"})"), "tools[1].name: is required"},
      {second(R"({"name":"a b"})"), R"(tools[1].name: "a b" is not [A-Za-z0-9._-]{1,128})"},
      {second(ok), R"(tools[1].name: "a" is declared twice (also tools[0]))"},
      {second(R"({"name":"b","effect":"sometimes"})"),
       R"(tools[1].effect: unknown effect class "sometimes" (read, idempotent, write, irreversible))"},
      {second(with(R"(,"ca_file":"ca.pem")")),
       R"(tools[1].ca_file: only allowed with an https:// base_url)"},
      {second(R"({"name":"b","effect":"write","base_url":"ftp://h"})"),
       R"(tools[1].base_url: "ftp://h": expected http(s)://host[:port][/prefix])"},
      {second(R"({"name":"b","effect":"write","base_url":"http://:80/x"})"),
       R"(tools[1].base_url: "http://:80/x": the host is missing)"},
      {second(R"({"name":"b","effect":"write","base_url":"http://h:99999"})"),
       R"(tools[1].base_url: "http://h:99999": the port must be a number in 1..65535)"},
      {second(R"({"name":"b","effect":"write","base_url":"http://u@h"})"),
       R"(tools[1].base_url: "http://u@h": user information is not supported (use "headers"))"},
      {second(R"({"name":"b","effect":"write","base_url":"http://h"})"),
       "tools[1].commit: is required"},
      {second(R"({"name":"b","effect":"write","base_url":"http://h","commit":{"path":"charges"}})"),
       R"(tools[1].commit.path: must start with "/")"},
      {second(
           R"({"name":"b","effect":"write","base_url":"http://h","commit":{"method":"GET","path":"/c"}})"),
       R"(tools[1].commit.method: "GET" is not one of POST, PUT, PATCH, DELETE)"},
      {second(R"({"name":"b","effect":"write","base_url":"http://h","commit":{"path":"/c/{id}"}})"),
       R"(tools[1].commit.path: "/c/{id}": the only placeholder is {key})"},
      {second(
           R"({"name":"b","effect":"write","base_url":"http://h","commit":{"path":"/c","verb":"x"}})"),
       "tools[1].commit.verb: unknown field"},
      {second(with(R"(,"status":{"path":"/status"})")),
       R"(tools[1].status.path: "/status": must contain {key})"},
      {second(with(R"(,"status":{"method":"POST","path":"/s/{key}"})")),
       R"(tools[1].status.method: "POST" is not one of GET)"},
      {second(with(R"(,"preview":{"path":"/p q"})")),
       R"(tools[1].preview.path: "/p q": spaces, "#", control characters and non-ASCII bytes are not allowed)"},
      {second(with(R"(,"honours_keys":"yes")")), "tools[1].honours_keys: expected true or false"},
      {second(with(R"(,"timeout_ms":0)")), "tools[1].timeout_ms: expected an integer in 1..600000"},
      {second(with(R"(,"connect_timeout_ms":1.5)")),
       "tools[1].connect_timeout_ms: expected an integer in 1..60000"},
      {second(with(R"(,"headers":{"Idempotency-Key":"x"})")),
       "tools[1].headers.Idempotency-Key: is set by idem and may not be overridden"},
      {second(with(R"(,"headers":{"X-A":"a\nb"})")),
       "tools[1].headers.X-A: control characters and non-ASCII bytes are not allowed"},
      {second(with(R"(,"comit":{})")), "tools[1].comit: unknown field"},
      {R"({"tools": [)", "tools: invalid JSON: "},
  };
  for (const LoadCase& c : cases) {
    ToolRegistry registry;
    Status s = LoadHttpTools(c.doc, &registry);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.doc;
    if (c.error == "tools: invalid JSON: ") {
      EXPECT_EQ(s.message().rfind(c.error, 0), 0u) << s.message();
    } else {
      EXPECT_EQ(s.message(), c.error) << c.doc;
    }
    EXPECT_TRUE(registry.List().empty()) << c.doc;  // all or nothing
  }
}

TEST(LoadHttpToolsTest, DocumentMustBeAnObject) {
  Result<std::vector<HttpToolConfig>> r = ParseHttpTools(Json::array());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), R"(document: expected a JSON object {"tools": [...]})");
  // Text that does not start with "{" is a file path.
  ToolRegistry registry;
  EXPECT_EQ(LoadHttpTools("[]", &registry).message(), "[]: cannot open the tools file");
}

TEST(LoadHttpToolsTest, RegistersEveryToolWithItsInfo) {
  ToolRegistry registry;
  Status s = LoadHttpTools(R"({"tools": [
      {"name": "payments.charge", "effect": "write", "base_url": "http://127.0.0.1:8091",
       "commit": {"method": "POST", "path": "/charges"},
       "status": {"method": "GET", "path": "/charges/status/{key}"},
       "preview": {"method": "POST", "path": "/charges/preview"}, "honours_keys": true,
       "timeout_ms": 2000, "connect_timeout_ms": 500},
      {"name": "mail.send", "effect": "irreversible", "base_url": "http://localhost:9/api/",
       "commit": {"path": "/send/{key}", "method": "PUT"}, "description": "send a mail"}]})",
                           &registry);
  ASSERT_OK(s);
  Tool* charge = registry.Find("payments.charge");
  ASSERT_NE(charge, nullptr);
  EXPECT_EQ(charge->info().effect, EffectClass::kWrite);
  EXPECT_TRUE(charge->info().honours_keys);
  EXPECT_TRUE(charge->info().has_status);
  EXPECT_TRUE(charge->info().has_preview);
  Tool* mail = registry.Find("mail.send");
  ASSERT_NE(mail, nullptr);
  EXPECT_EQ(mail->info().effect, EffectClass::kIrreversible);
  EXPECT_FALSE(mail->info().honours_keys);
  EXPECT_FALSE(mail->info().has_status);
  EXPECT_FALSE(mail->info().has_preview);
  EXPECT_EQ(mail->info().description, "send a mail");

  Result<std::vector<HttpToolConfig>> configs = ParseHttpTools(Json::parse(R"({"tools": [
      {"name": "m", "effect": "read", "base_url": "http://[::1]:8080/v1//",
       "commit": {"path": "/x"}}]})"));
  ASSERT_OK(configs);
  EXPECT_EQ((*configs)[0].host, "::1");
  EXPECT_EQ((*configs)[0].port, 8080);
  EXPECT_EQ((*configs)[0].base_path, "/v1");
  EXPECT_EQ((*configs)[0].timeout_ms, 10000);
  EXPECT_EQ((*configs)[0].connect_timeout_ms, 1000);
}

TEST(LoadHttpToolsTest, NameAlreadyRegisteredRegistersNothing) {
  ToolRegistry registry;
  ASSERT_TRUE(LoadHttpTools(ToolsDoc(1), &registry).ok());
  Status s = LoadHttpTools(R"({"tools": [
      {"name": "other", "effect": "read", "base_url": "http://h", "commit": {"path": "/o"}},
      {"name": "payments.charge", "effect": "read", "base_url": "http://h", "commit": {"path": "/o"}}]})",
                           &registry);
  EXPECT_EQ(s.code(), Code::kConflict);
  EXPECT_EQ(s.message(), R"(tools[1].name: tool "payments.charge" is already registered)");
  EXPECT_EQ(registry.Find("other"), nullptr);
}

TEST(LoadHttpToolsTest, ReadsAFileAndNamesItInErrors) {
  test::TempDir tmp("idem_http_tools");
  std::string dir = tmp.path();
  std::string good = dir + "/http_tools_good.json";
  std::string bad = dir + "/http_tools_bad.json";
  std::ofstream(good) << ToolsDoc(8091);
  std::ofstream(bad) << R"({"tools": [{"name": "x"}]})";
  ToolRegistry registry;
  ASSERT_OK(LoadHttpTools(good, &registry));
  EXPECT_NE(registry.Find("payments.charge"), nullptr);

  Status s = LoadHttpTools(bad, &registry);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), bad + ": tools[0].effect: is required");

  Status missing = LoadHttpTools(dir + "/no_such_tools.json", &registry);
  EXPECT_EQ(missing.code(), Code::kNotFound);
  EXPECT_EQ(missing.message(), dir + "/no_such_tools.json: cannot open the tools file");
}

// ---- The idempotency layer --------------------------------------------------------------

/// A provider whose POST /charges is wrapped by the layer. The handler counts
/// its runs; with hold_first_, the first run waits for release_.
class IdempotencyLayerTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = dir_.File("keys.db"); }
  void TearDown() override {
    release_.Open();  // never leave a handler waiting on a destroyed gate
    Unmount();
  }

  void Mount(const IdempotencyOptions& options = {}, const WrapOptions& wrap = {}) {
    auto layer = IdempotencyLayer::Open(path_, options);
    ASSERT_OK(layer);
    layer_ = std::move(layer).value();
    server_ = std::make_unique<TestServer>();
    server_->Http().Post("/charges",
                         layer_->Wrap([this](const httplib::Request& req,
                                             httplib::Response& res) { Handle(req, res); },
                                      wrap));
    ASSERT_GT(server_->Start(), 0);
  }

  void Unmount() {
    server_.reset();
    layer_.reset();
  }

  void Handle(const httplib::Request& req, httplib::Response& res) {
    int run = ++runs_;
    entered_.Open();
    if (hold_first_ && run == 1) release_.Wait();
    Json a = Json::parse(req.body, nullptr, false);
    if (a.is_object() && a.contains("throw")) throw std::runtime_error("boom");
    int status = a.is_object() ? a.value("status", 201) : 201;
    res.status = status;
    Json body = {{"id", "ch_" + std::to_string(run)}, {"run", run}};
    res.set_content(body.dump(), status >= 400 ? "application/problem+json" : "application/json");
  }

  httplib::Result Post(const std::string& key, const std::string& body,
                       httplib::Headers extra = {}) {
    httplib::Client cli("127.0.0.1", server_->Port());
    cli.set_read_timeout(10, 0);
    httplib::Headers headers = std::move(extra);
    if (key != "<none>") headers.emplace("Idempotency-Key", key);
    return cli.Post("/charges", headers, body, "application/json");
  }

  static std::string ProblemType(const httplib::Result& r) {
    Json doc = Json::parse(r->body, nullptr, false);
    return doc.is_object() ? doc.value("type", "") : "";
  }

  test::TempDir dir_{"idem_idempotency"};
  std::string path_;
  std::unique_ptr<IdempotencyLayer> layer_;
  std::unique_ptr<TestServer> server_;
  std::atomic<int> runs_{0};
  bool hold_first_ = false;
  Gate entered_;
  Gate release_;
};

TEST_F(IdempotencyLayerTest, MissingOrInvalidKeysAre400AndStoreNothing) {
  Mount();
  struct Bad {
    std::string name;
    httplib::Headers headers;
  };
  const std::vector<Bad> bad = {
      {"missing", {}},
      // httplib drops a header with an empty value: it arrives as missing.
      {"empty", {{"Idempotency-Key", ""}}},
      {"two headers", {{"Idempotency-Key", "a"}, {"Idempotency-Key", "a"}}},
      {"empty sf-string", {{"Idempotency-Key", "\"\""}}},
      {"256 chars", {{"Idempotency-Key", std::string(256, 'k')}}},
      {"control character",
       {{"Idempotency-Key",
         "ab\x01"
         "cd"}}},
      {"non-ASCII", {{"Idempotency-Key", "cl\xc3\xa9"}}},
      {"unterminated sf-string", {{"Idempotency-Key", "\"abc"}}},
      {"bad sf-string escape", {{"Idempotency-Key", R"("a\bc")"}}},
  };
  for (const Bad& b : bad) {
    httplib::Client cli("127.0.0.1", server_->Port());
    auto r = cli.Post("/charges", b.headers, "{}", "application/json");
    ASSERT_TRUE(r) << b.name << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 400) << b.name;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json") << b.name;
    Json doc = Json::parse(r->body);
    EXPECT_EQ(doc["status"], 400) << b.name;
    EXPECT_TRUE(doc.contains("title") && doc.contains("detail")) << b.name;
    const bool missing = b.name == "missing" || b.name == "empty";
    EXPECT_EQ(doc["type"].get<std::string>(),
              missing ? server::kProblemKeyMissing : server::kProblemKeyInvalid)
        << b.name;
  }
  EXPECT_EQ(runs_.load(), 0);
  // 255 characters is the limit, and is accepted.
  auto r = Post(std::string(255, 'k'), "{}");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(layer_->Find("", std::string(256, 'k')).status().code(), Code::kNotFound);
}

TEST_F(IdempotencyLayerTest, ConcurrentSameKeyRunsTheHandlerOnce) {
  hold_first_ = true;
  Mount();
  auto first = std::async(std::launch::async, [&] { return Post("k-1", R"({"amount": 5})"); });
  ASSERT_TRUE(entered_.Wait());

  constexpr int kOthers = 5;
  std::vector<std::future<httplib::Result>> others;
  others.reserve(kOthers);
  for (int i = 0; i < kOthers; ++i) {
    others.push_back(
        std::async(std::launch::async, [&] { return Post("k-1", R"({"amount": 5})"); }));
  }
  for (auto& f : others) {
    httplib::Result r = f.get();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 409);
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
    EXPECT_EQ(ProblemType(r), server::kProblemKeyInFlight);
  }
  release_.Open();
  httplib::Result a = first.get();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 201);
  EXPECT_FALSE(a->has_header("Idempotent-Replayed"));

  httplib::Result retry = Post("k-1", R"({"amount": 5})");
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ(retry->body, a->body);
  EXPECT_EQ(retry->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, SimultaneousFirstRequestsRaceForOneClaim) {
  Mount();
  constexpr int kClients = 6;
  std::atomic<int> ready{0};
  std::vector<std::future<httplib::Result>> all;
  all.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    all.push_back(std::async(std::launch::async, [&] {
      ++ready;
      while (ready.load() < kClients) std::this_thread::yield();
      return Post("race", R"({"amount": 1})");
    }));
  }
  int created = 0;
  for (auto& f : all) {
    httplib::Result r = f.get();
    ASSERT_TRUE(r);
    if (r->status == 201)
      ++created;
    else
      EXPECT_EQ(r->status, 409);  // in flight, or already done and replayed as 201
  }
  EXPECT_GE(created, 1);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, DifferentPayloadIs422AndReorderedJsonIsAReplay) {
  Mount();
  httplib::Result a = Post("k-2", R"({"amount": 5, "currency": "EUR"})");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 201);

  httplib::Result other = Post("k-2", R"({"amount": 6, "currency": "EUR"})");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 422);
  EXPECT_EQ(ProblemType(other), server::kProblemKeyReused);
  EXPECT_EQ(Json::parse(other->body)["title"], "Idempotency-Key is already used");

  httplib::Result reordered = Post("k-2", "{ \"currency\":\"EUR\",\n \"amount\":5 }");
  ASSERT_TRUE(reordered);
  EXPECT_EQ(reordered->status, 201);
  EXPECT_EQ(reordered->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);

  // The record is unchanged by the refused request.
  Result<server::IdempotencyRecord> rec = layer_->Find("", "k-2");
  ASSERT_OK(rec);
  EXPECT_EQ(rec->state, "done");
  EXPECT_EQ(rec->body, a->body);
}

TEST_F(IdempotencyLayerTest, ReplayReturnsStoredStatusBodyAndContentTypeIncludingErrors) {
  Mount();
  for (int status : {201, 402, 500}) {
    std::string key = "k-" + std::to_string(status);
    std::string body = R"({"status": )" + std::to_string(status) + "}";
    httplib::Result a = Post(key, body);
    ASSERT_TRUE(a);
    ASSERT_EQ(a->status, status);
    httplib::Result b = Post(key, body);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->status, status);
    EXPECT_EQ(b->body, a->body);
    EXPECT_EQ(b->get_header_value("Content-Type"), a->get_header_value("Content-Type"));
    EXPECT_EQ(b->get_header_value("Idempotent-Replayed"), "true");
  }
  EXPECT_EQ(runs_.load(), 3);
  // The sf-string form names the same key.
  httplib::Result quoted = Post("\"k-201\"", R"({"status": 201})");
  ASSERT_TRUE(quoted);
  EXPECT_EQ(quoted->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 3);
}

TEST_F(IdempotencyLayerTest, RetryLaterAnswersReleaseTheKey) {
  Mount();
  httplib::Result busy = Post("k-503", R"({"status": 503})");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(layer_->Find("", "k-503").status().code(), Code::kNotFound);
  httplib::Result again = Post("k-503", R"({"status": 503})");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->has_header("Idempotent-Replayed"));
  EXPECT_EQ(runs_.load(), 2);
}

TEST_F(IdempotencyLayerTest, ThrowingHandlerIsStoredAs500) {
  Mount();
  httplib::Result a = Post("k-throw", R"({"throw": true})");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 500);
  EXPECT_EQ(ProblemType(a), server::kProblemHandlerFailed);
  httplib::Result b = Post("k-throw", R"({"throw": true})");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 500);
  EXPECT_EQ(b->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, AnotherCallersKeyIsNeverReplayed) {
  Mount();
  httplib::Result alice = Post("shared", "{}", {{"Authorization", "Bearer alice"}});
  httplib::Result bob = Post("shared", "{}", {{"Authorization", "Bearer bob"}});
  ASSERT_TRUE(alice && bob);
  EXPECT_EQ(alice->status, 201);
  EXPECT_EQ(bob->status, 201);
  EXPECT_FALSE(bob->has_header("Idempotent-Replayed"));
  EXPECT_NE(bob->body, alice->body);
  EXPECT_EQ(runs_.load(), 2);

  httplib::Result alice_again = Post("shared", "{}", {{"Authorization", "Bearer alice"}});
  ASSERT_TRUE(alice_again);
  EXPECT_EQ(alice_again->body, alice->body);
  EXPECT_EQ(alice_again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_OK(layer_->Find("Bearer bob", "shared"));
  EXPECT_EQ(layer_->Find("Bearer carol", "shared").status().code(), Code::kNotFound);
}

TEST_F(IdempotencyLayerTest, ScopeFunctionOverridesTheHeader) {
  WrapOptions wrap;
  wrap.scope = [](const httplib::Request& req) { return req.get_header_value("X-Tenant"); };
  Mount({}, wrap);
  httplib::Result a = Post("k", "{}", {{"X-Tenant", "t1"}, {"Authorization", "same"}});
  httplib::Result b = Post("k", "{}", {{"X-Tenant", "t2"}, {"Authorization", "same"}});
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(b->has_header("Idempotent-Replayed"));
  EXPECT_EQ(runs_.load(), 2);
}

TEST_F(IdempotencyLayerTest, KeyOptionalRunsUnguardedWithoutAKey) {
  WrapOptions wrap;
  wrap.key_required = false;
  Mount({}, wrap);
  for (int i = 0; i < 2; ++i) {
    httplib::Result r = Post("<none>", "{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 201);
  }
  EXPECT_EQ(runs_.load(), 2);
}

TEST_F(IdempotencyLayerTest, StoredResponsesSurviveReopening) {
  Mount();
  httplib::Result a = Post("k-persist", R"({"amount": 9})");
  ASSERT_TRUE(a);
  ASSERT_EQ(a->status, 201);
  Unmount();

  Mount();
  httplib::Result b = Post("k-persist", R"({"amount": 9})");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 201);
  EXPECT_EQ(b->body, a->body);
  EXPECT_EQ(b->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, AbandonedClaimIsTakenOverAfterTheLockTimeoutAndTheOldHolderIsFenced) {
  ManualClock clock;
  IdempotencyOptions options;
  options.clock = &clock;
  options.lock_timeout_ms = 60'000;
  hold_first_ = true;
  Mount(options);
  auto first = std::async(std::launch::async, [&] { return Post("k-hung", "{}"); });
  ASSERT_TRUE(entered_.Wait());

  clock.AdvanceMs(59'000);
  httplib::Result early = Post("k-hung", "{}");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 409);

  clock.AdvanceMs(1'000);
  httplib::Result takeover = Post("k-hung", "{}");
  ASSERT_TRUE(takeover);
  EXPECT_EQ(takeover->status, 201);
  EXPECT_EQ(Json::parse(takeover->body)["run"], 2);

  release_.Open();
  httplib::Result old = first.get();
  ASSERT_TRUE(old);
  EXPECT_EQ(Json::parse(old->body)["run"], 1);

  httplib::Result replay = Post("k-hung", "{}");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->body, takeover->body);  // the late holder did not overwrite it
  EXPECT_EQ(runs_.load(), 2);
}

TEST_F(IdempotencyLayerTest, HandlerRunningPastTheLockTimeoutKeepsItsClaim) {
  IdempotencyOptions options;  // the real clock: the renewer renews the claim
  options.lock_timeout_ms = 300;
  hold_first_ = true;
  Mount(options);
  auto first = std::async(std::launch::async, [&] { return Post("k-slow", "{}"); });
  ASSERT_TRUE(entered_.Wait());
  // Retries for 3x the lock timeout while the handler runs: 409 each time.
  const auto start = std::chrono::steady_clock::now();
  int retries = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(900)) {
    httplib::Result r = Post("k-slow", "{}");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 409) << r->body;
    EXPECT_EQ(ProblemType(r), server::kProblemKeyInFlight);
    ++retries;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(retries, 5);
  release_.Open();
  httplib::Result done = first.get();
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 201);
  EXPECT_EQ(Json::parse(done->body)["run"], 1);
  httplib::Result replay = Post("k-slow", "{}");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->body, done->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, KeysExpireAfterTheTtl) {
  ManualClock clock;
  IdempotencyOptions options;
  options.clock = &clock;
  options.ttl_ms = 24LL * 3600 * 1000;
  Mount(options);
  ASSERT_TRUE(Post("k-ttl", "{}"));
  clock.AdvanceMs(options.ttl_ms - 1'000);
  httplib::Result before = Post("k-ttl", "{}");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs_.load(), 1);
  EXPECT_EQ(*layer_->PurgeExpired(), 0);

  clock.AdvanceMs(2'000);
  ASSERT_TRUE(Post("k-other", "{}"));  // a fresh record, not expired
  EXPECT_EQ(*layer_->PurgeExpired(), 1);
  httplib::Result after = Post("k-ttl", "{}");
  ASSERT_TRUE(after);
  EXPECT_FALSE(after->has_header("Idempotent-Replayed"));
  EXPECT_EQ(runs_.load(), 3);
}

TEST_F(IdempotencyLayerTest, BusyStoreIs503AndRunsNothing) {
  IdempotencyOptions options;
  options.busy_timeout_ms = 0;
  Mount(options);
  // Another connection holds the database's write lock.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  httplib::Result busy = Post("k-busy", "{}");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503);
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  EXPECT_EQ(ProblemType(busy), server::kProblemUnavailable);
  EXPECT_EQ(runs_.load(), 0);

  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  httplib::Result ok = Post("k-busy", "{}");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 201);
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(IdempotencyLayerTest, OpenRefusesBadOptions) {
  EXPECT_EQ(IdempotencyLayer::Open("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(IdempotencyLayer::Open(":memory:").status().code(), Code::kInvalidArgument);
  IdempotencyOptions o;
  o.synchronous = "OFF";
  Result<std::unique_ptr<IdempotencyLayer>> r = IdempotencyLayer::Open(dir_.File("x.db"), o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("synchronous \"OFF\" is not one of NORMAL, FULL, EXTRA"),
            std::string::npos)
      << r.status().message();
}

// ---- End to end: the HTTP tool against a provider behind the layer ------------------------

TEST_F(IdempotencyLayerTest, HttpToolRetriesAreDeduplicatedByTheProvider) {
  hold_first_ = true;
  Mount();
  auto tool = MakeTool(server_->Port(), "", kShortTimeoutMs);
  // The first attempt times out while the handler is held: unknown.
  ToolOutcome first = tool->Invoke(Call("saga_3/charge", {{"amount", 5}}));
  EXPECT_EQ(first.kind, OutcomeKind::kUnknown) << first.error;
  // A retry while it still runs: 409 in flight is unknown, not a failure.
  ToolOutcome during = tool->Invoke(Call("saga_3/charge", {{"amount", 5}}));
  EXPECT_EQ(during.kind, OutcomeKind::kUnknown) << during.error;
  // Other args under the same key: 422 key reused is unknown too.
  ToolOutcome changed = tool->Invoke(Call("saga_3/charge", {{"amount", 6}}));
  EXPECT_EQ(changed.kind, OutcomeKind::kUnknown) << changed.error;

  release_.Open();
  ToolOutcome after;
  for (int i = 0; i < 200; ++i) {  // until the held run has stored its response
    after = tool->Invoke(Call("saga_3/charge", {{"amount", 5}}));
    if (after.kind == OutcomeKind::kSucceeded) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(after.kind, OutcomeKind::kSucceeded) << after.error;
  EXPECT_EQ(after.external_ref, "ch_1");
  EXPECT_EQ(runs_.load(), 1);
}

TEST(LoadHttpToolsTest, KeyRetentionIsADuration) {
  auto one = [](const std::string& retention) {
    return R"({"tools": [{"name": "payments.charge", "effect": "write",
        "base_url": "http://127.0.0.1:8091", "commit": {"path": "/charges"},
        "honours_keys": true, "key_retention": )" +
           retention + "}]}";
  };
  ToolRegistry registry;
  ASSERT_OK(LoadHttpTools(one(R"("24h")"), &registry));
  EXPECT_EQ(registry.Find("payments.charge")->info().key_retention_ms, 24LL * 3600 * 1000);
  ToolRegistry seconds;
  ASSERT_OK(LoadHttpTools(one("90"), &seconds));
  EXPECT_EQ(seconds.Find("payments.charge")->info().key_retention_ms, 90'000);
  ToolRegistry bad;
  EXPECT_EQ(LoadHttpTools(one(R"("a day")"), &bad).message(),
            "tools[0].key_retention: expected a duration like \"30s\", \"15m\", \"2h\" or "
            "\"3d\", got \"a day\"");
  EXPECT_EQ(LoadHttpTools(one("0"), &bad).message(), "tools[0].key_retention: must be positive");
}

}  // namespace
}  // namespace idem
