// The http/ front over real loopback sockets: a Server with a trivial
// handler, and clients as rude as attackers (tests/http_test_client.h).
// Each attack of issue 12 runs at a small size while /healthz is probed: it
// must keep answering within a second, and the process's RSS must stay
// within a stated bound. http_attack (tests/http_attack.cc) runs the same
// attacks at full size.

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/http_attacks.h"

#include "http/server.h"
#include "http/stream.h"

namespace idem::http {
namespace {

using testing::Get;
using testing::NowMs;
using testing::Prober;
using testing::RawClient;
using testing::RssKb;

// Polls `done` every 10 ms for up to `ms`; its last answer.
bool WaitFor(const std::function<bool()>& done, int ms) {
  const int64_t deadline = NowMs() + ms;
  while (!done() && NowMs() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

// Tight limits so that each attack ends fast.
ServerOptions TestOptions() {
  ServerOptions o;
  o.request_timeout_ms = 1000;
  o.keep_alive_idle_ms = 1000;
  o.write_timeout_ms = 1000;
  o.max_body_bytes = size_t{64} * 1024;
  o.max_header_bytes = size_t{8} * 1024;
  o.max_header_fields = 32;
  o.max_connections = 256;
  o.max_connections_per_client = 256;
  o.stop_timeout_ms = 2000;
  return o;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions o = TestOptions(), Handler h = testing::TrivialHandler()) {
    auto s = Server::Create(std::move(o), std::move(h));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  // Sends `request` on a fresh connection and reads one response.
  int Exchange(const std::string& request, std::string* body = nullptr,
               std::string* head = nullptr) {
    RawClient c(port_);
    if (!c.Send(request)) return -1;
    int status = -1;
    if (!c.ReadResponse(2000, &status, body, head)) return -1;
    return status;
  }

  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// /healthz answered every probe within a second.
void ExpectHealthy(Prober& prober) {
  prober.Stop();
  EXPECT_GT(prober.probes(), 0);
  EXPECT_EQ(prober.failures(), 0);
  EXPECT_LT(prober.max_latency_ms(), 1000);
}

// The process may grow this much during one small attack (buffers, thread
// stacks); a server that buffered the attack would grow by its size.
constexpr int64_t kRssBoundKb = int64_t{24} * 1024;

TEST_F(HttpServerTest, ServesAndKeepsAlive) {
  StartServer();
  RawClient c(port_);
  int status = 0;
  std::string body;
  ASSERT_TRUE(
      c.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /big HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(c.ReadResponse(2000, &status, &body));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body, "ok\n");
  ASSERT_TRUE(c.ReadResponse(2000, &status, &body));  // pipelined
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body.size(), 10u * 1024);
  ASSERT_TRUE(c.Send("GET /nope?x=1 HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(c.ReadResponse(2000, &status, &body));
  EXPECT_EQ(status, 404);
}

TEST_F(HttpServerTest, RequestFields) {
  Request seen;
  std::mutex mu;
  StartServer(TestOptions(), [&](const Request& req, Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    seen = req;
    res.SetHeader("X-Reply", "1");
    res.SetContent("{}", "application/json");
  });
  std::string head;
  ASSERT_EQ(Exchange("PUT /v1/specs/a%20b?limit=5&status=needs+attention HTTP/1.1\r\nHost: t\r\n"
                     "content-length: 3\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\nabc",
                     nullptr, &head),
            200);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen.method, "PUT");
  EXPECT_EQ(seen.target, "/v1/specs/a%20b?limit=5&status=needs+attention");
  EXPECT_EQ(seen.path, "/v1/specs/a b");
  EXPECT_EQ(seen.Param("limit"), "5");
  EXPECT_EQ(seen.Param("status"), "needs attention");
  EXPECT_FALSE(seen.HasParam("other"));
  EXPECT_EQ(seen.Header("CONTENT-LENGTH"), "3");
  EXPECT_EQ(seen.headers.count("X-MULTI"), 2u);
  EXPECT_EQ(seen.body, "abc");
  EXPECT_EQ(seen.peer, "127.0.0.1");
  EXPECT_NE(head.find("X-Reply: 1\r\n"), std::string::npos) << head;
  EXPECT_NE(head.find("Content-Type: application/json\r\n"), std::string::npos) << head;
}

TEST_F(HttpServerTest, PostWithoutBodyOrLengthIsAnEmptyBody) {
  StartServer();
  std::string body;
  ASSERT_EQ(Exchange(testing::kPostWithoutBody, &body), 200);
  EXPECT_EQ(body, "empty");
}

TEST_F(HttpServerTest, ConflictingContentLengthIs400) {
  StartServer();
  EXPECT_EQ(Exchange(testing::kConflictingLengths), 400);
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 4\r\n\r\nabcd"), 400);
  // Content-Length beside chunked is a conflict too (request smuggling).
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            400);
  // The same value twice is one length (RFC 9112 6.3).
  std::string body;
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                     "Content-Length: 3\r\n\r\nabc",
                     &body),
            200);
  EXPECT_EQ(body, "3");
}

TEST_F(HttpServerTest, DuplicateAuthorizationIs400) {
  StartServer();
  EXPECT_EQ(Exchange(testing::kTwoAuthorizations), 400);
  EXPECT_EQ(Exchange("GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer a\r\n"
                     "authorization: Bearer b\r\n\r\n"),
            400);
  EXPECT_EQ(Exchange("GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer a\r\n\r\n"), 200);
}

TEST_F(HttpServerTest, MalformedRequestIs400) {
  StartServer();
  EXPECT_EQ(Exchange("GET /healthz HTTP/1.1\r\nHost: t\r\nNo colon here\r\n\r\n"), 400);
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "zz\r\nabc\r\n0\r\n\r\n"),
            400);
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413BeforeItIsSent) {
  StartServer();
  RawClient c(port_);
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 65537\r\n\r\n"));
  int status = 0;
  ASSERT_TRUE(c.ReadResponse(1000, &status));  // no body byte sent
  EXPECT_EQ(status, 413);
  EXPECT_TRUE(c.WaitClosed(2000));
  std::string body;
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 65536\r\n\r\n" +
                         std::string(65536, 'a'),
                     &body),
            200);
  EXPECT_EQ(body, "65536");
}

TEST_F(HttpServerTest, ChunkedBodyUnderTheLimitIsRead) {
  StartServer();
  std::string body;
  EXPECT_EQ(Exchange("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n",
                     &body),
            200);
  EXPECT_EQ(body, "7");
}

// Attack 2: a chunked body that never ends is refused once past the limit,
// without being buffered.
TEST_F(HttpServerTest, EndlessChunkedBodyIs413AndNotBuffered) {
  StartServer();
  Prober prober(port_);
  const int64_t rss0 = RssKb();
  testing::FloodResult r = testing::ChunkedBody(port_, 32u << 20);
  EXPECT_EQ(r.status, 413);
  EXPECT_LT(r.sent, 8u << 20) << "the server kept reading";
  EXPECT_LT(RssKb() - rss0, kRssBoundKb);
  ExpectHealthy(prober);
}

// Attack 3: header lines without end, four requests at once.
TEST_F(HttpServerTest, EndlessHeaderLinesAre431) {
  StartServer();
  Prober prober(port_);
  const int64_t rss0 = RssKb();
  EXPECT_EQ(testing::HeaderLines(port_, 4, 4u << 20), std::vector<int>(4, 431));
  EXPECT_LT(RssKb() - rss0, kRssBoundKb);
  ExpectHealthy(prober);
}

TEST_F(HttpServerTest, TooManyHeaderFieldsIs431) {
  StartServer();
  std::string many = "GET /healthz HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 40; ++i) many += "X-F" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Exchange(many + "\r\n"), 431);
  std::string some = "GET /healthz HTTP/1.1\r\nHost: t\r\n";
  for (int i = 0; i < 20; ++i) some += "X-F" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Exchange(some + "\r\n"), 200);
}

// Attack 4: Range is never honoured, so many ranges cannot amplify.
TEST_F(HttpServerTest, RangeIsIgnored) {
  StartServer();
  int status = 0;
  const int64_t bytes = testing::Ranges(port_, 700, &status);
  EXPECT_EQ(status, 200);
  EXPECT_GT(bytes, 10 * 1024);
  EXPECT_LT(bytes, 11 * 1024) << "one whole body, not one per range";
  std::string body;
  EXPECT_EQ(Exchange("GET /big HTTP/1.1\r\nHost: t\r\nRange: bytes=0-1\r\n\r\n", &body), 200);
  EXPECT_EQ(body.size(), 10u * 1024);
}

// Attack 1: slowloris, header and body, with and without a token.
TEST_F(HttpServerTest, SlowClientsCannotHoldConnections) {
  ServerOptions o = TestOptions();
  o.max_connections_per_client = 16;
  StartServer(o);
  Prober prober(port_);
  const int64_t rss0 = RssKb();
  // One byte every 200 ms (an idle timer would never fire), for 4 s; the
  // request deadline is 1 s.
  testing::SlowResult r = testing::Slowloris(port_, 8, 4000, 200);
  EXPECT_GE(r.cuts, 16) << "every slow connection is closed at the request deadline";
  EXPECT_LT(r.longest_hold_ms, 2500);
  EXPECT_LT(RssKb() - rss0, kRssBoundKb);
  ExpectHealthy(prober);
  EXPECT_GT(prober.probes(), 10);
  EXPECT_TRUE(WaitFor([&] { return server_->stats().connections == 0; }, 2000));
}

TEST_F(HttpServerTest, IdleKeepAliveIsClosed) {
  StartServer();
  RawClient c(port_);
  int status = 0;
  ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(c.ReadResponse(1000, &status));
  const int64_t start = NowMs();
  EXPECT_TRUE(c.WaitClosed(3000));
  EXPECT_GE(NowMs() - start, 800);
}

TEST_F(HttpServerTest, ClientThatDoesNotReadIsClosed) {
  ServerOptions o = TestOptions();
  o.write_timeout_ms = 500;
  StartServer(o, [](const Request&, Response& res) {
    res.SetContent(std::string(32 << 20, 'z'), "text/plain");
  });
  {
    RawClient c(port_, 4096);
    ASSERT_TRUE(c.Send("GET /huge HTTP/1.1\r\nHost: t\r\n\r\n"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(server_->stats().connections, 1u);
    EXPECT_TRUE(WaitFor([&] { return server_->stats().connections == 0; }, 3000))
        << "still writing to a client that never reads";
  }
}

TEST_F(HttpServerTest, ConnectionsOverTheLimitsAre503) {
  ServerOptions o = TestOptions();
  o.max_connections_per_client = 3;
  o.request_timeout_ms = 5000;
  StartServer(o);
  std::vector<std::unique_ptr<RawClient>> held;
  held.reserve(3);
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawClient>(port_));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  RawClient over(port_);
  int status = 0;
  ASSERT_TRUE(over.ReadResponse(1000, &status));
  EXPECT_EQ(status, 503);
  EXPECT_TRUE(over.WaitClosed(1000));
  EXPECT_EQ(server_->stats().refused, 1u);
  held.clear();
  EXPECT_TRUE(WaitFor([&] { return server_->stats().connections == 0; }, 2000));
  EXPECT_EQ(Get(port_, "/healthz"), 200);
}

TEST_F(HttpServerTest, TotalConnectionLimit) {
  ServerOptions o = TestOptions();
  o.max_connections = 2;
  o.request_timeout_ms = 5000;
  StartServer(o);
  RawClient a(port_), b(port_);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  RawClient over(port_);
  int status = 0;
  ASSERT_TRUE(over.ReadResponse(2000, &status));
  EXPECT_EQ(status, 503);
}

TEST_F(HttpServerTest, SlowHandlerDoesNotStallOthers) {
  ServerOptions o = TestOptions();
  o.worker_threads = 2;
  o.io_threads = 1;
  StartServer(o);
  std::thread slow([&] { EXPECT_EQ(Get(port_, "/slow?ms=1500", 3000), 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  int64_t latency = 0;
  EXPECT_EQ(Get(port_, "/healthz", 1000, &latency), 200);
  EXPECT_LT(latency, 1000);
  slow.join();
}

TEST_F(HttpServerTest, HandlerExceptionIs500) {
  StartServer(TestOptions(), [](const Request&, Response&) { throw std::runtime_error("boom"); });
  EXPECT_EQ(Exchange("GET / HTTP/1.1\r\nHost: t\r\n\r\n"), 500);
}

TEST_F(HttpServerTest, HooksWriteRefusalsAndSeeEveryStatus) {
  std::mutex mu;
  std::vector<int> statuses;
  ServerHooks hooks;
  hooks.refusal = [](Response& res) {
    res.SetContent("{\"status\":" + std::to_string(res.status) + "}", "application/problem+json");
  };
  hooks.exception = [](const std::string& what, Response& res) {
    res.SetContent(R"({"detail":")" + what + R"("})", "application/problem+json");
  };
  hooks.responded = [&](int status) {
    std::lock_guard<std::mutex> lock(mu);
    statuses.push_back(status);
  };
  auto s = Server::Create(
      TestOptions(),
      [](const Request& req, Response& res) {
        if (req.path == "/throw") throw std::runtime_error("boom");
        res.SetContent("ok", "text/plain");
      },
      hooks);
  ASSERT_TRUE(s.ok());
  server_ = std::move(s).value();
  ASSERT_TRUE(server_->Start().ok());
  port_ = server_->port();
  std::string body, head;
  EXPECT_EQ(Exchange("GET / HTTP/1.1\r\nHost: t\r\n\r\n"), 200);
  EXPECT_EQ(Exchange("GET /throw HTTP/1.1\r\nHost: t\r\n\r\n", &body), 500);
  EXPECT_EQ(body, "{\"detail\":\"boom\"}");
  EXPECT_EQ(Exchange(testing::kConflictingLengths, &body, &head), 400);
  EXPECT_EQ(body, "{\"status\":400}");
  EXPECT_NE(head.find("Content-Type: application/problem+json\r\n"), std::string::npos);
  server_->Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(statuses, (std::vector<int>{200, 500, 400}));
}

TEST_F(HttpServerTest, ExpectContinue) {
  StartServer();
  RawClient c(port_);
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
             "Expect: 100-continue\r\n\r\n"));
  int status = 0;
  ASSERT_TRUE(c.ReadResponse(1000, &status));
  EXPECT_EQ(status, 100);
  ASSERT_TRUE(c.Send("hello"));
  std::string body;
  ASSERT_TRUE(c.ReadResponse(1000, &status, &body));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body, "5");
}

TEST_F(HttpServerTest, GracefulStopFinishesInFlightResponses) {
  StartServer();
  RawClient idle(port_);
  RawClient busy(port_);
  ASSERT_TRUE(busy.Send("GET /slow?ms=500 HTTP/1.1\r\nHost: t\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int64_t start = NowMs();
  server_->Stop();
  EXPECT_LT(NowMs() - start, 2000);
  int status = 0;
  std::string body, head;
  ASSERT_TRUE(busy.ReadResponse(1000, &status, &body, &head));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body, "slow\n");
  EXPECT_NE(head.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(idle.WaitClosed(1000));
  RawClient after(port_);
  EXPECT_FALSE(after.connected());
}

TEST_F(HttpServerTest, StopClosesWhatOutlivesTheBound) {
  ServerOptions o = TestOptions();
  o.stop_timeout_ms = 200;
  StartServer(o);
  RawClient busy(port_);
  ASSERT_TRUE(busy.Send("GET /slow?ms=1000 HTTP/1.1\r\nHost: t\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->Stop();  // waits for the handler, not for its client
  EXPECT_TRUE(busy.WaitClosed(1000));
  int status = 0;
  EXPECT_FALSE(busy.ReadResponse(100, &status));
}

// ---- Server-sent events

// Keeps every open stream; the test pushes to them.
class Hub {
 public:
  void Add(Stream s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
    // The count outlives the hub: a stream may close after the test body
    // ends (the server stops in TearDown), so the callback must not hold
    // `this`.
    s.OnClose([closed = closed_] { ++*closed; });
  }
  int Broadcast(const std::string& data) {
    std::lock_guard<std::mutex> lock(mu_);
    int sent = 0;
    for (auto& s : streams_) sent += s.Send(data, "tick", "1") ? 1 : 0;
    return sent;
  }
  void CloseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : streams_) s.Close();
  }
  size_t Size() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_.size();
  }
  int closed() const { return *closed_; }

 private:
  std::shared_ptr<std::atomic<int>> closed_ = std::make_shared<std::atomic<int>>(0);
  std::mutex mu_;
  std::vector<Stream> streams_;
};

Handler StreamHandler(Hub* hub) {
  return [hub](const Request& req, Response& res) {
    if (req.path != "/events") return testing::TrivialHandler()(req, res);
    res.SetHeader("X-Stream", "yes");
    res.on_stream = [hub](Stream s) {
      s.Comment("hello");
      hub->Add(s);
    };
  };
}

TEST(FormatEventTest, WireForm) {
  EXPECT_EQ(FormatEvent("a\nb", "tick", "7"), "event: tick\nid: 7\ndata: a\ndata: b\n\n");
  EXPECT_EQ(FormatEvent("x", "bad\nname", ""), "event: badname\ndata: x\n\n");
  EXPECT_EQ(FormatEvent("", "", ""), "data: \n\n");
}

TEST_F(HttpServerTest, TwoHundredStreamsOnOneIoThread) {
  Hub hub;
  ServerOptions o = TestOptions();
  o.io_threads = 1;
  o.max_streams = 300;
  o.max_streams_per_client = 300;
  StartServer(o, StreamHandler(&hub));
  constexpr int kStreams = 200;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(clients.back()->Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  }
  ASSERT_TRUE(WaitFor([&] { return hub.Size() == kStreams; }, 5000)) << hub.Size();
  EXPECT_EQ(server_->stats().streams, static_cast<size_t>(kStreams));
  // The request deadline does not apply to a stream.
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_EQ(hub.Broadcast("first"), kStreams);
  EXPECT_EQ(hub.Broadcast("second"), kStreams);
  int64_t latency = 0;
  EXPECT_EQ(Get(port_, "/healthz", 1000, &latency), 200);
  EXPECT_LT(latency, 1000);
  for (auto& c : clients) {
    const int64_t deadline = NowMs() + 3000;
    while (c->buffer().find("data: second\n\n") == std::string::npos && NowMs() < deadline) {
      c->Receive(100);
    }
    const std::string& got = c->buffer();
    ASSERT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
    EXPECT_NE(got.find("Content-Type: text/event-stream\r\n"), std::string::npos);
    EXPECT_NE(got.find("X-Stream: yes\r\n"), std::string::npos);
    EXPECT_NE(got.find(": hello\n\n"), std::string::npos);
    EXPECT_NE(got.find("event: tick\nid: 1\ndata: first\n\n"), std::string::npos);
    EXPECT_NE(got.find("data: second\n\n"), std::string::npos) << got;
  }
  // Clients that go away end their streams.
  for (int i = 0; i < 50; ++i) clients[i]->Close();
  EXPECT_TRUE(WaitFor([&] { return hub.closed() == 50; }, 2000)) << hub.closed();
  EXPECT_TRUE(WaitFor([&] { return server_->stats().streams == kStreams - 50; }, 2000));
  EXPECT_EQ(hub.Broadcast("third"), kStreams - 50);
  // Stop ends the rest.
  server_->Stop();
  EXPECT_EQ(hub.closed(), kStreams);
  EXPECT_EQ(hub.Broadcast("after"), 0);
  for (int i = 50; i < kStreams; ++i) EXPECT_TRUE(clients[i]->WaitClosed(1000));
}

TEST_F(HttpServerTest, StreamLimitsAnswer503) {
  Hub hub;
  ServerOptions o = TestOptions();
  o.max_streams_per_client = 2;
  StartServer(o, StreamHandler(&hub));
  RawClient a(port_), b(port_), c(port_);
  ASSERT_TRUE(a.Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(b.Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(WaitFor([&] { return hub.Size() == 2; }, 2000));
  ASSERT_TRUE(c.Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  int status = 0;
  ASSERT_TRUE(c.ReadResponse(1000, &status));
  EXPECT_EQ(status, 503);
  EXPECT_EQ(hub.Size(), 2u);
}

TEST_F(HttpServerTest, HandlerClosesItsStream) {
  Hub hub;
  StartServer(TestOptions(), StreamHandler(&hub));
  RawClient a(port_);
  ASSERT_TRUE(a.Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(WaitFor([&] { return hub.Size() == 1; }, 2000));
  EXPECT_EQ(hub.Broadcast("bye"), 1);
  hub.CloseAll();  // from the test's thread, through a copy of the handle
  EXPECT_TRUE(WaitFor([&] { return hub.closed() == 1; }, 1000));
  EXPECT_TRUE(a.WaitClosed(1000));
  EXPECT_NE(a.buffer().find("data: bye\n\n"), std::string::npos) << a.buffer();
  EXPECT_EQ(hub.Broadcast("late"), 0);
  Stream s;
  EXPECT_FALSE(s.open());
  EXPECT_FALSE(s.Send("x"));
  {
    std::atomic<bool> ran{false};
    s.OnClose([&] { ran = true; });
    EXPECT_TRUE(ran);
  }
  EXPECT_TRUE(WaitFor([&] { return server_->stats().streams == 0; }, 1000));
}

TEST_F(HttpServerTest, SlowStreamReaderIsClosed) {
  Hub hub;
  ServerOptions o = TestOptions();
  o.max_stream_queue_bytes = size_t{64} * 1024;
  o.write_timeout_ms = 500;
  StartServer(o, StreamHandler(&hub));
  RawClient a(port_, 4096);
  ASSERT_TRUE(a.Send("GET /events HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(WaitFor([&] { return hub.Size() == 1; }, 2000));
  const std::string big(size_t{16} * 1024, 'e');
  int sent = 0;
  for (int i = 0; i < 10000 && hub.Broadcast(big) == 1; ++i) ++sent;
  EXPECT_LT(sent, 10000) << "the queue is bounded";
  EXPECT_TRUE(WaitFor([&] { return hub.closed() == 1; }, 3000));
  EXPECT_TRUE(WaitFor([&] { return server_->stats().connections == 0; }, 3000));
}

TEST(HttpServerOptionsTest, BadOptionsAreRefused) {
  ServerOptions o;
  o.io_threads = 0;
  auto s = Server::Create(o, testing::TrivialHandler());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("io_threads"), std::string::npos);
  EXPECT_FALSE(Server::Create(ServerOptions(), nullptr).ok());
}

TEST(HttpServerOptionsTest, PortInUseIsUnavailable) {
  auto a = Server::Create(ServerOptions(), testing::TrivialHandler());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Start().ok());
  ServerOptions o;
  o.port = (*a)->port();
  auto b = Server::Create(o, testing::TrivialHandler());
  ASSERT_TRUE(b.ok());
  Status st = (*b)->Start();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
}

}  // namespace
}  // namespace idem::http
