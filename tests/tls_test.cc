// HTTPS: HTTP tools over TLS (tools/http_tls.h) against loopback
// httplib::SSLServer providers, and `idem serve --tls-cert/--tls-key` (the
// http/ front over TLS) with a real HTTPS client. Every certificate is made
// at test time by tests/tls_certs.sh (openssl) in a temporary folder.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "examples/travel_booking/http_providers.h"
#include "tests/test_util.h"
#include "tools/http_tool.h"

#include "common/json_util.h"
#include "http/server.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {
namespace {

using test::TempDir;

[[maybe_unused]] const bool sigpipe_ignored = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

// ---- Certificates, made once per test binary ---------------------------------------

/// The folder tests/tls_certs.sh filled (see its header for the files).
const std::string& Certs() {
  static TempDir* dir = [] {
    auto* d = new TempDir("idem_tls");
    const std::string cmd =
        "bash " IDEM_SOURCE_DIR "/tests/tls_certs.sh '" + d->path() + "' >/dev/null";
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "tests/tls_certs.sh failed";
    return d;
  }();
  return dir->path();
}
std::string Cert(const std::string& name) { return Certs() + "/" + name; }

// ---- A loopback HTTPS provider with a ledger ---------------------------------------

/// An httplib::SSLServer on 127.0.0.1 that counts the requests it handles:
/// POST /charges (200 {"id": "ch_N"}) and GET /charges/status/{key}.
class TlsProvider {
 public:
  /// `cert` names a pair in Certs() ("server"); `client_ca` non-empty makes
  /// client certificates required, signed by that CA.
  explicit TlsProvider(const std::string& cert, const std::string& client_ca = "")
      : svr_(Cert(cert + ".pem").c_str(), Cert(cert + ".key").c_str(),
             client_ca.empty() ? nullptr : Cert(client_ca + ".pem").c_str()) {
    svr_.Post("/charges", [this](const httplib::Request& req, httplib::Response& res) {
      int n = ++calls_;
      last_key_ = req.get_header_value("Idempotency-Key");
      Note(req);
      res.set_content(R"({"id": "ch_)" + std::to_string(n) + "\"}", "application/json");
    });
    svr_.Get(
        R"(/charges/status/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
          ++lookups_;
          Note(req);
          res.set_content(R"({"status": "applied", "result": {"id": "ch_1"}})", "application/json");
        });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    for (int i = 0; i < 2000 && !svr_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~TlsProvider() {
    svr_.stop();
    if (thread_.joinable()) thread_.join();
  }
  TlsProvider(const TlsProvider&) = delete;
  TlsProvider& operator=(const TlsProvider&) = delete;

  bool valid() const { return svr_.is_valid() && port_ > 0; }
  int port() const { return port_; }
  int calls() const { return calls_; }
  int lookups() const { return lookups_; }
  std::string last_key() const { return last_key_; }
  /// The connections the requests came on (one client port each).
  size_t connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::set<int>(ports_.begin(), ports_.end()).size();
  }

 private:
  void Note(const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mu_);
    ports_.push_back(req.remote_port);
  }

  httplib::SSLServer svr_;
  std::mutex mu_;
  std::vector<int> ports_;  // GUARDED_BY(mu_)
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> calls_{0};
  std::atomic<int> lookups_{0};
  std::string last_key_;
};

/// A tools document with one https tool on `port`; `extra` adds fields.
std::string ToolsDoc(int port, const std::string& extra, const std::string& host = "127.0.0.1") {
  return R"({"tools": [{"name": "payments.charge", "effect": "write",
    "base_url": "https://)" +
         host + ":" + std::to_string(port) + R"(",
    "commit": {"method": "POST", "path": "/charges"},
    "status": {"method": "GET", "path": "/charges/status/{key}"},
    "honours_keys": true, "connect_timeout_ms": 3000, "timeout_ms": 3000)" +
         extra + "}]}";
}

std::string Field(const std::string& name, const std::string& path) {
  return ", \"" + name + "\": \"" + path + "\"";
}

/// The tool of `doc`, registered through LoadHttpTools (so every file is
/// checked as at load).
Tool* Load(const std::string& doc, ToolRegistry* registry) {
  Status s = LoadHttpTools(doc, registry);
  EXPECT_TRUE(s.ok()) << s.message();
  return registry->Find("payments.charge");
}

ToolCall Call(const std::string& key) {
  ToolCall c;
  c.tool = "payments.charge";
  c.key = key;
  c.args = Json{{"amount", 100}};
  return c;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- (1) a valid chain ----------------------------------------------------------------

TEST(HttpsToolTest, ValidChainWithCaFileCallsOnce) {
  TlsProvider provider("server");
  ASSERT_TRUE(provider.valid());
  ToolRegistry registry;
  Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem"))), &registry);
  ASSERT_NE(tool, nullptr);
  ToolOutcome o = tool->Invoke(Call("saga_1/charge"));
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  EXPECT_EQ(o.external_ref, "ch_1");
  EXPECT_EQ(provider.calls(), 1);
  EXPECT_EQ(provider.last_key(), "saga_1/charge");
  LookupOutcome l = tool->Lookup("saga_1/charge");
  EXPECT_EQ(l.kind, LookupKind::kApplied) << l.error;
  EXPECT_EQ(provider.lookups(), 1);
}

// Calls in a row go on the connection the first one opened: one handshake.
TEST(HttpsToolTest, CallsInARowShareOneConnectionAndItsHandshake) {
  TlsProvider provider("server");
  ASSERT_TRUE(provider.valid());
  ToolRegistry registry;
  Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem"))), &registry);
  ASSERT_NE(tool, nullptr);
  for (const char* key : {"saga_1/a", "saga_1/b", "saga_1/c"}) {
    ToolOutcome o = tool->Invoke(Call(key));
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  }
  EXPECT_EQ(tool->Lookup("saga_1/a").kind, LookupKind::kApplied);
  EXPECT_EQ(provider.calls(), 3);
  EXPECT_EQ(provider.lookups(), 1);
  EXPECT_EQ(provider.connections(), 1u);
}

TEST(HttpsToolTest, LocalhostNameMatchesTheCertificateToo) {
  TlsProvider provider("server");
  ASSERT_TRUE(provider.valid());
  ToolRegistry registry;
  Tool* tool =
      Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem")), "localhost"), &registry);
  ASSERT_NE(tool, nullptr);
  ToolOutcome o = tool->Invoke(Call("k"));
  EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
  EXPECT_EQ(provider.calls(), 1);
}

// ---- (2) a wrong host name ------------------------------------------------------------

TEST(HttpsToolTest, WrongHostNameIsRefusedAndNothingIsSent) {
  TlsProvider provider("wrong-host");  // a certificate for example.invalid, from our CA
  ASSERT_TRUE(provider.valid());
  ToolRegistry registry;
  Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem"))), &registry);
  ASSERT_NE(tool, nullptr);
  ToolOutcome o = tool->Invoke(Call("k"));
  EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
  EXPECT_FALSE(o.retryable) << o.error;
  const std::string peer = "127.0.0.1:" + std::to_string(provider.port());
  EXPECT_TRUE(Has(o.error, "payments.charge POST /charges: ")) << o.error;
  EXPECT_TRUE(Has(o.error, "the TLS certificate of " + peer +
                               " is not trusted: it does not name "
                               "the host 127.0.0.1; the request was not sent"))
      << o.error;
  EXPECT_EQ(provider.calls(), 0);
  LookupOutcome l = tool->Lookup("k");
  EXPECT_EQ(l.kind, LookupKind::kError);
  EXPECT_TRUE(Has(l.error, "does not name the host")) << l.error;
  EXPECT_EQ(provider.lookups(), 0);
}

// ---- (3) an unknown CA ----------------------------------------------------------------

TEST(HttpsToolTest, UnknownCaIsRefusedAndNothingIsSent) {
  TlsProvider provider("server");
  ASSERT_TRUE(provider.valid());
  const std::string peer = "127.0.0.1:" + std::to_string(provider.port());
  {  // No ca_file: the system store does not know the test CA.
    ToolRegistry registry;
    Tool* tool = Load(ToolsDoc(provider.port(), ""), &registry);
    ASSERT_NE(tool, nullptr);
    ToolOutcome o = tool->Invoke(Call("k"));
    EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
    EXPECT_FALSE(o.retryable);
    EXPECT_TRUE(Has(o.error, "the TLS certificate of " + peer +
                                 " is not trusted: unable to get local issuer certificate (not in "
                                 "the system CA store; name its CA in \"ca_file\")"))
        << o.error;
  }
  {  // Another CA.
    ToolRegistry registry;
    Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("other-ca.pem"))), &registry);
    ASSERT_NE(tool, nullptr);
    ToolOutcome o = tool->Invoke(Call("k"));
    EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
    EXPECT_FALSE(o.retryable);
    EXPECT_TRUE(Has(o.error,
                    "is not trusted: unable to get local issuer certificate (not signed "
                    "by the CA of " +
                        Cert("other-ca.pem") + ")"))
        << o.error;
  }
  EXPECT_EQ(provider.calls(), 0);
}

// ---- (4) client certificates ----------------------------------------------------------

TEST(HttpsToolTest, ClientCertificateRequiredWorksWithOneAndIsRefusedWithout) {
  TlsProvider provider("server", /*client_ca=*/"ca");
  ASSERT_TRUE(provider.valid());
  {
    ToolRegistry registry;
    Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem")) +
                                                    Field("client_cert", Cert("client.pem")) +
                                                    Field("client_key", Cert("client.key"))),
                      &registry);
    ASSERT_NE(tool, nullptr);
    ToolOutcome o = tool->Invoke(Call("k1"));
    EXPECT_EQ(o.kind, OutcomeKind::kSucceeded) << o.error;
    EXPECT_EQ(provider.calls(), 1);
  }
  {  // Without: the server refuses the handshake (in TLS 1.3 after the
     // client's side ended: still refused, never "unknown").
    ToolRegistry registry;
    Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem"))), &registry);
    ASSERT_NE(tool, nullptr);
    ToolOutcome o = tool->Invoke(Call("k2"));
    EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
    EXPECT_FALSE(o.retryable) << o.error;
    EXPECT_TRUE(Has(o.error, "127.0.0.1:" + std::to_string(provider.port()))) << o.error;
    EXPECT_TRUE(Has(o.error, "was refused by the server: ")) << o.error;
    EXPECT_TRUE(Has(o.error, "client certificate") || Has(o.error, "certificate required"))
        << o.error;
    EXPECT_TRUE(Has(o.error, "the request was not sent")) << o.error;
  }
  {  // A client certificate from a CA the provider does not trust.
    ToolRegistry registry;
    Tool* tool = Load(ToolsDoc(provider.port(), Field("ca_file", Cert("ca.pem")) +
                                                    Field("client_cert", Cert("other.pem")) +
                                                    Field("client_key", Cert("other.key"))),
                      &registry);
    ASSERT_NE(tool, nullptr);
    ToolOutcome o = tool->Invoke(Call("k3"));
    EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
    EXPECT_FALSE(o.retryable) << o.error;
    EXPECT_TRUE(Has(o.error, "was refused by the server: ")) << o.error;
  }
  EXPECT_EQ(provider.calls(), 1);
}

// ---- handshakes that never finish --------------------------------------------------------

/// A loopback listener that accepts and then either closes at once or says
/// nothing (a TLS server that stalls).
class SilentListener {
 public:
  explicit SilentListener(bool close_at_once) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on a loopback port";
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, close_at_once] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      if (!close_at_once) {
        char buf[4096];
        while (!done_ && ::recv(c, buf, sizeof buf, MSG_DONTWAIT) != 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      ::close(c);
    });
  }
  ~SilentListener() {
    done_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    if (thread_.joinable()) thread_.join();
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(HttpsToolTest, HandshakeCutOrStalledWithoutAnAlertIsFailedRetryable) {
  for (bool close_at_once : {true, false}) {
    SilentListener listener(close_at_once);
    ToolRegistry registry;
    std::string doc = ToolsDoc(listener.port(), Field("ca_file", Cert("ca.pem")));
    doc.replace(doc.find("\"connect_timeout_ms\": 3000"), 26, "\"connect_timeout_ms\": 300");
    Tool* tool = Load(doc, &registry);
    ASSERT_NE(tool, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    ToolOutcome o = tool->Invoke(Call("k"));
    EXPECT_EQ(o.kind, OutcomeKind::kFailed) << o.error;
    EXPECT_TRUE(o.retryable) << o.error;
    EXPECT_TRUE(Has(
        o.error, "the TLS handshake with 127.0.0.1:" + std::to_string(listener.port()) + " failed"))
        << o.error;
    EXPECT_TRUE(Has(o.error, "the request was not sent")) << o.error;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  }
}

// ---- the tools file's TLS fields -------------------------------------------------------------

TEST(HttpsToolTest, TlsFieldsAreCheckedAtLoadNamingThePlace) {
  TempDir dir("idem_tls_load");
  auto copy = [&](const std::string& from, const std::string& to, mode_t mode) {
    {
      std::ifstream in(Cert(from), std::ios::binary);
      std::ofstream out(dir.File(to), std::ios::binary);
      out << in.rdbuf();
    }
    ::chmod(dir.File(to).c_str(), mode);
    return dir.File(to);
  };
  const std::string loose_key = copy("client.key", "loose.key", 0644);
  const std::string cert_as_key = copy("client.pem", "cert-as-key.pem", 0600);
  struct Case {
    std::string extra;
    Code code;
    std::string error;
  };
  const std::vector<Case> cases = {
      {Field("ca_file", dir.File("none.pem")), Code::kNotFound,
       "tools[0].ca_file: " + dir.File("none.pem") +
           ": cannot read the certificate file (no such file)"},
      {Field("ca_file", Cert("ca.key")), Code::kInvalidArgument,
       "tools[0].ca_file: " + Cert("ca.key") + ": no PEM certificate in the file"},
      {Field("client_cert", Cert("client.pem")), Code::kInvalidArgument,
       "tools[0].client_key: client_cert and client_key go together (mutual TLS needs both)"},
      {Field("client_key", Cert("client.key")), Code::kInvalidArgument,
       "tools[0].client_cert: client_cert and client_key go together (mutual TLS needs both)"},
      {Field("client_cert", Cert("client.pem")) + Field("client_key", loose_key),
       Code::kFailedPrecondition,
       "tools[0].client_key: " + loose_key +
           ": the private key file is readable or writable by group or others; chmod 600 it"},
      {Field("client_cert", Cert("client.pem")) + Field("client_key", Cert("server.key")),
       Code::kInvalidArgument,
       "tools[0].client_key: " + Cert("server.key") +
           ": the private key does not belong to the certificate " + Cert("client.pem")},
      {Field("client_cert", Cert("client.key")) + Field("client_key", Cert("client.key")),
       Code::kInvalidArgument,
       "tools[0].client_cert: " + Cert("client.key") + ": no PEM certificate in the file"},
      {Field("client_cert", Cert("client.pem")) + Field("client_key", cert_as_key),
       Code::kInvalidArgument,
       "tools[0].client_key: " + cert_as_key + ": no unencrypted PEM private key in the file"},
      {", \"ca_file\": 3", Code::kInvalidArgument, "tools[0].ca_file: expected a file path"},
  };
  for (const Case& c : cases) {
    ToolRegistry registry;
    Status s = LoadHttpTools(ToolsDoc(8443, c.extra), &registry);
    EXPECT_EQ(s.code(), c.code) << c.extra << ": " << s.message();
    EXPECT_EQ(s.message(), c.error) << c.extra;
    EXPECT_FALSE(Has(s.message(), "BEGIN")) << "no key content in a message";
    EXPECT_TRUE(registry.List().empty());
  }
  // Only with https.
  ToolRegistry registry;
  std::string plain = ToolsDoc(8443, Field("ca_file", Cert("ca.pem")));
  plain.replace(plain.find("https://"), 8, "http://");
  Status s = LoadHttpTools(plain, &registry);
  EXPECT_EQ(s.message(), "tools[0].ca_file: only allowed with an https:// base_url");
}

TEST(HttpsToolTest, RelativePathsAreTakenFromTheToolsFilesFolder) {
  TlsProvider provider("server");
  ASSERT_TRUE(provider.valid());
  TempDir dir("idem_tls_rel");
  ::mkdir(dir.File("certs").c_str(), 0700);
  {
    std::ifstream in(Cert("ca.pem"), std::ios::binary);
    std::ofstream out(dir.File("certs/ca.pem"), std::ios::binary);
    out << in.rdbuf();
  }
  std::ofstream(dir.File("tools.json"))
      << ToolsDoc(provider.port(), Field("ca_file", "certs/ca.pem"));
  ToolRegistry registry;
  Tool* tool = Load(dir.File("tools.json"), &registry);
  ASSERT_NE(tool, nullptr);
  EXPECT_EQ(tool->Invoke(Call("k")).kind, OutcomeKind::kSucceeded);
  EXPECT_EQ(provider.calls(), 1);
  // The default port of https is 443.
  Result<Json> doc = ParseJson(R"({"tools": [{"name": "a", "effect": "read",
      "base_url": "https://api.example", "commit": {"path": "/x"}}]})",
                               "test");
  ASSERT_TRUE(doc.ok());
  Result<std::vector<HttpToolConfig>> configs = ParseHttpTools(*doc);
  ASSERT_TRUE(configs.ok()) << configs.status().message();
  EXPECT_EQ((*configs)[0].port, 443);
  EXPECT_TRUE((*configs)[0].tls);
}

// ---- (5) `idem serve --tls-cert/--tls-key` --------------------------------------------------

constexpr const char* kBinary = IDEM_BINARY_DIR "/examples/travel_booking/travel-booking";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// An HTTPS client that trusts the test CA.
std::unique_ptr<httplib::SSLClient> HttpsClient(int port) {
  auto cli = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
  cli->set_ca_cert_path(Cert("ca.pem"));
  cli->enable_server_certificate_verification(true);
  cli->set_connection_timeout(5, 0);
  cli->set_read_timeout(10, 0);
  return cli;
}

/// A TCP connection to 127.0.0.1:port, or -1.
int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Reads from `fd` until the peer closes (true) or `limit` passes (false).
bool ClosedWithin(int fd, std::chrono::milliseconds limit) {
  timeval tv{0, 100'000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

class ServeTlsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      Wait(pid_);
    }
  }
  static int Wait(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::vector<std::string> Args(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--db",     dir_.File("trip.db"), "serve",
                                     "--listen", "127.0.0.1:0",        "--insecure-no-auth"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  /// Starts serve with `extra`; its port, or 0.
  int Serve(const std::vector<std::string>& extra) {
    out_ = dir_.File("serve" + std::to_string(++runs_) + ".out");
    err_ = dir_.File("serve" + std::to_string(runs_) + ".err");
    pid_ = test::SpawnProcess(kBinary, Args(extra), out_, err_);
    for (int i = 0; i < 500; ++i) {
      std::string out = Slurp(out_);
      size_t at = out.find("listening on 127.0.0.1:");
      if (at != std::string::npos) return std::atoi(out.c_str() + at + 23);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "serve did not start: " << Slurp(err_);
    return 0;
  }
  /// Runs serve with `extra` to its end: {exit code, stderr}.
  std::pair<int, std::string> RunServe(const std::vector<std::string>& extra) {
    const std::string out = dir_.File("bad" + std::to_string(++runs_) + ".out");
    const std::string err = dir_.File("bad" + std::to_string(runs_) + ".err");
    pid_t pid = test::SpawnProcess(kBinary, Args(extra), out, err);
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      int status = 0;
      pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) {
        return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), Slurp(err)};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid, SIGKILL);
    Wait(pid);
    return {-1, "serve did not exit: " + Slurp(out)};
  }
  std::vector<std::string> Tls() {
    return {"--tls-cert", Cert("server.pem"), "--tls-key", Cert("server.key")};
  }

  TempDir dir_{"idem_serve_tls"};
  pid_t pid_ = -1;
  int runs_ = 0;
  std::string out_, err_;
};

TEST_F(ServeTlsTest, HttpsClientSubmitsASagaAndReadsIt) {
  int port = Serve(Tls());
  ASSERT_GT(port, 0);
  EXPECT_TRUE(Has(Slurp(out_), "(HTTPS, ")) << Slurp(out_);
  auto cli = HttpsClient(port);
  auto health = cli->Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);

  Json body = {
      {"spec", Json::parse(Slurp(IDEM_SOURCE_DIR "/examples/travel_booking/trip.json"))},
      {"input", Json::parse(Slurp(IDEM_SOURCE_DIR "/examples/travel_booking/input.json"))}};
  httplib::Headers headers = {{"Idempotency-Key", "trip-tls-1"}};
  auto created = cli->Post("/v1/sagas", headers, body.dump(), "application/json");
  ASSERT_TRUE(created) << httplib::to_string(created.error());
  ASSERT_EQ(created->status, 201) << created->body;
  const std::string id = Json::parse(created->body).value("saga_id", "");
  ASSERT_FALSE(id.empty()) << created->body;
  // The retry under the same key is the same saga.
  auto again = cli->Post("/v1/sagas", headers, body.dump(), "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(Json::parse(again->body).value("saga_id", ""), id) << again->body;
  auto read = cli->Get(("/v1/sagas/" + id).c_str());
  ASSERT_TRUE(read) << httplib::to_string(read.error());
  EXPECT_EQ(read->status, 200) << read->body;
  EXPECT_EQ(Json::parse(read->body).value("saga_id", ""), id);

  // A client that does not trust the CA is refused by its own check.
  httplib::SSLClient untrusting("127.0.0.1", port);
  untrusting.enable_server_certificate_verification(true);
  auto refused = untrusting.Get("/healthz");
  EXPECT_FALSE(refused);
  EXPECT_EQ(refused.error(), httplib::Error::SSLServerVerification);
}

TEST_F(ServeTlsTest, TheWebUiSessionCookieIsSecureOverHttps) {
  const std::string auth = dir_.File("auth.json");
  {
    std::ofstream out(auth);
    out << Json::array({{{"name", "maria"},
                         {"token_sha256", Sha256Hex("tok-maria")},
                         {"roles", {"approver"}}}})
               .dump();
  }
  ASSERT_EQ(::chmod(auth.c_str(), 0600), 0);
  std::vector<std::string> extra = Tls();
  extra.insert(extra.end(), {"--auth", auth});
  int port = Serve(extra);
  ASSERT_GT(port, 0);
  auto cli = HttpsClient(port);
  auto signed_in =
      cli->Post("/ui/api/session", Json{{"token", "tok-maria"}}.dump(), "application/json");
  ASSERT_TRUE(signed_in) << httplib::to_string(signed_in.error());
  ASSERT_EQ(signed_in->status, 200) << signed_in->body;
  const std::string cookie = signed_in->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("; Secure"), std::string::npos) << cookie;
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos) << cookie;
}

TEST_F(ServeTlsTest, PlainHttpToTheTlsPortIsClosedAndTheServerLivesOn) {
  int port = Serve(Tls());
  ASSERT_GT(port, 0);
  for (int i = 0; i < 3; ++i) {
    httplib::Client plain("127.0.0.1", port);
    plain.set_read_timeout(5, 0);
    auto r = plain.Get("/healthz");
    EXPECT_FALSE(r) << "a plain request got an answer: " << r->status;
  }
  auto cli = HttpsClient(port);
  auto health = cli->Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "serve is still running";
}

TEST_F(ServeTlsTest, StalledHandshakeIsCutAtTheRequestDeadlineWhileHealthzAnswers) {
  std::vector<std::string> flags = Tls();
  flags.insert(flags.end(), {"--request-timeout-ms", "1500"});
  int port = Serve(flags);
  ASSERT_GT(port, 0);
  // One connection that says nothing, one that stops half way through its
  // ClientHello (a TLS record header announcing 512 bytes, then 5 of them).
  int silent = Connect(port);
  int partial = Connect(port);
  ASSERT_GE(silent, 0);
  ASSERT_GE(partial, 0);
  const char hello[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03";
  ASSERT_EQ(::send(partial, hello, sizeof hello - 1, 0), static_cast<ssize_t>(sizeof hello - 1));
  auto t0 = std::chrono::steady_clock::now();
  // Meanwhile /healthz over TLS answers at once.
  auto cli = HttpsClient(port);
  auto health = cli->Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1200));
  EXPECT_TRUE(ClosedWithin(silent, std::chrono::seconds(6)));
  EXPECT_TRUE(ClosedWithin(partial, std::chrono::seconds(6)));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(1200)) << "cut at the deadline, not before";
  EXPECT_LT(took, std::chrono::seconds(6));
  ::close(silent);
  ::close(partial);
}

// ---- (6) bad flags ---------------------------------------------------------------------------

TEST_F(ServeTlsTest, BadTlsFlagsExit2NamingTheFlag) {
  const std::string loose = dir_.File("loose.key");
  {
    std::ifstream in(Cert("server.key"), std::ios::binary);
    std::ofstream out(loose, std::ios::binary);
    out << in.rdbuf();
  }
  ::chmod(loose.c_str(), 0644);
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--tls-cert", Cert("server.pem")}, "error: --tls-cert needs --tls-key (both or neither)"},
      {{"--tls-key", Cert("server.key")}, "error: --tls-key needs --tls-cert (both or neither)"},
      {{"--tls-cert", dir_.File("none.pem"), "--tls-key", Cert("server.key")},
       "error: --tls-cert: " + dir_.File("none.pem") +
           ": cannot read the certificate file (no such file)"},
      {{"--tls-cert", Cert("server.pem"), "--tls-key", dir_.File("none.key")},
       "error: --tls-key: " + dir_.File("none.key") +
           ": cannot read the private key file (no such file)"},
      {{"--tls-cert", Cert("server.pem"), "--tls-key", loose},
       "error: --tls-key: " + loose +
           ": the private key file is readable or writable by group or others; chmod 600 it"},
      {{"--tls-cert", Cert("server.key"), "--tls-key", Cert("server.key")},
       "error: --tls-cert: " + Cert("server.key") + ": no PEM certificate in the file"},
      {{"--tls-cert", Cert("server.pem"), "--tls-key", Cert("client.key")},
       "error: --tls-key: " + Cert("client.key") +
           ": the private key does not belong to the certificate " + Cert("server.pem")},
  };
  for (const Case& c : cases) {
    auto [code, err] = RunServe(c.flags);
    EXPECT_EQ(code, 2) << err;
    EXPECT_TRUE(Has(err, c.error)) << "want: " << c.error << "\ngot: " << err;
    EXPECT_FALSE(Has(err, "BEGIN")) << err;
  }
}

// ---- event streams over TLS (the http/ front itself) -------------------------------------------

TEST(HttpFrontTlsTest, EventStreamsAndLimitsWorkOverTls) {
  http::ServerOptions o;
  o.tls_cert_file = Cert("server.pem");
  o.tls_key_file = Cert("server.key");
  o.max_body_bytes = 1024;
  auto server = http::Server::Create(o, [](const http::Request& req, http::Response& res) {
    if (req.target == "/events") {
      res.on_stream = [](http::Stream s) {
        s.Send("one", "tick", "1");
        s.Send("two", "tick", "2");
        // (Close drops what is still queued: give the writes a moment.)
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        s.Close();
      };
      return;
    }
    res.SetContent("ok\n", "text/plain");
  });
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_TRUE((*server)->Start().ok());
  auto cli = HttpsClient((*server)->port());
  std::string events;
  auto r = cli->Get("/events", [&](const char* data, size_t n) {
    events.append(data, n);
    return true;
  });
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_TRUE(Has(events, "event: tick\nid: 1\ndata: one\n\n")) << events;
  EXPECT_TRUE(Has(events, "data: two")) << events;
  // The body limit holds under TLS.
  auto big = cli->Post("/x", std::string(4096, 'x'), "text/plain");
  ASSERT_TRUE(big) << httplib::to_string(big.error());
  EXPECT_EQ(big->status, 413);
  (*server)->Stop();
}

/// A raw TLS client (OpenSSL) on a TCP connection, for what httplib will not
/// do: trickle a request byte by byte.
class RawTlsClient {
 public:
  explicit RawTlsClient(int port) : fd_(Connect(port)) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx_, Cert("ca.pem").c_str(), nullptr);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    ok_ = fd_ >= 0 && SSL_connect(ssl_) == 1;
  }
  ~RawTlsClient() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    if (fd_ >= 0) ::close(fd_);
  }
  RawTlsClient(const RawTlsClient&) = delete;
  RawTlsClient& operator=(const RawTlsClient&) = delete;
  bool ok() const { return ok_; }
  bool Write(const std::string& bytes) {
    return SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) > 0;
  }
  /// Everything the server sends until it closes (or 10 s pass).
  std::string ReadAll() {
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string in;
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl_, buf, sizeof buf)) > 0) in.append(buf, static_cast<size_t>(n));
    return in;
  }

 private:
  int fd_;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  bool ok_ = false;
};

TEST(HttpFrontTlsTest, SlowlorisAndHeaderLimitsHoldOverTls) {
  http::ServerOptions o;
  o.tls_cert_file = Cert("server.pem");
  o.tls_key_file = Cert("server.key");
  o.request_timeout_ms = 1000;
  o.max_header_bytes = 1024;
  auto server = http::Server::Create(
      o, [](const http::Request&, http::Response& res) { res.SetContent("ok\n", "text/plain"); });
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_TRUE((*server)->Start().ok());
  const int port = (*server)->port();
  {  // One byte every 100 ms, after a quick handshake: cut at the deadline.
    RawTlsClient slow(port);
    ASSERT_TRUE(slow.ok());
    const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaa\r\n";
    auto t0 = std::chrono::steady_clock::now();
    bool cut = false;
    for (char c : request) {
      if (!slow.Write(std::string(1, c))) {
        cut = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!cut) slow.ReadAll();  // the close
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, std::chrono::milliseconds(3000));
    EXPECT_GE(took, std::chrono::milliseconds(800));
  }
  {  // A header over max_header_bytes: 431, over TLS.
    RawTlsClient big(port);
    ASSERT_TRUE(big.ok());
    ASSERT_TRUE(
        big.Write("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'b') + "\r\n\r\n"));
    std::string answer = big.ReadAll();
    EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
  }
  auto cli = HttpsClient(port);
  auto health = cli->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_GE((*server)->stats().rejected_requests, 2u);
  (*server)->Stop();
}

TEST(HttpFrontTlsTest, TlsOptionsAreCheckedNamingTheOption) {
  http::ServerOptions o;
  o.tls_cert_file = Cert("server.pem");
  auto one = http::Server::Create(o, [](const http::Request&, http::Response&) {});
  EXPECT_EQ(one.status().message(), "tls_cert_file, tls_key_file: both or neither");
  o.tls_key_file = Cert("client.key");
  auto other = http::Server::Create(o, [](const http::Request&, http::Response&) {});
  EXPECT_EQ(other.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(other.status().message(), "tls_key_file: " + Cert("client.key") +
                                          ": the private key does not belong to the certificate " +
                                          Cert("server.pem"));
}

// ---- the example providers over HTTPS ---------------------------------------------------------

TEST(TravelProvidersTlsTest, ServeHttpsToTheToolsFileWithTheCa) {
  TempDir dir("idem_providers_tls");
  travel::HttpProviderOptions o;
  o.ledger_path = dir.File("ledger.sqlite");
  o.tls_cert_file = Cert("server.pem");
  o.tls_key_file = Cert("server.key");
  auto providers = travel::HttpProviders::Create(o);
  ASSERT_TRUE(providers.ok()) << providers.status().message();
  Result<int> port = (*providers)->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().message();

  // examples/travel_booking/tools.http.json, pointed at https and the CA.
  Json doc = Json::parse(Slurp(IDEM_SOURCE_DIR "/examples/travel_booking/tools.http.json"));
  for (Json& t : doc["tools"]) {
    std::string url = t["base_url"];
    url.replace(0, std::string("http://127.0.0.1:8091").size(),
                "https://127.0.0.1:" + std::to_string(*port));
    t["base_url"] = url;
    t["ca_file"] = Cert("ca.pem");
  }
  ToolRegistry registry;
  ASSERT_TRUE(LoadHttpTools(doc.dump(), &registry).ok());
  Tool* flights = registry.Find("flights.reserve");
  ASSERT_NE(flights, nullptr);
  ToolCall call;
  call.tool = "flights.reserve";
  call.key = "saga_tls/reserve_flight";
  call.args = Json::parse(Slurp(IDEM_SOURCE_DIR "/examples/travel_booking/input.json"));
  ToolOutcome o1 = flights->Invoke(call);
  EXPECT_EQ(o1.kind, OutcomeKind::kSucceeded) << o1.error;
  ToolOutcome o2 = flights->Invoke(call);  // the key layer replays it
  EXPECT_EQ(o2.kind, OutcomeKind::kSucceeded) << o2.error;
  EXPECT_TRUE(o2.replayed);
  EXPECT_EQ(flights->Lookup(call.key).kind, LookupKind::kApplied);
  registry = ToolRegistry();  // its kept connections closed before the server stops
  (*providers)->Stop();

  // Both files or neither; the key owner-only.
  travel::HttpProviderOptions half = o;
  half.tls_key_file.clear();
  EXPECT_EQ(travel::HttpProviders::Create(half).status().code(), Code::kInvalidArgument);
  const std::string loose = dir.File("loose.key");
  {
    std::ifstream in(Cert("server.key"), std::ios::binary);
    std::ofstream out(loose, std::ios::binary);
    out << in.rdbuf();
  }
  ::chmod(loose.c_str(), 0640);
  travel::HttpProviderOptions readable = o;
  readable.tls_key_file = loose;
  auto refused = travel::HttpProviders::Create(readable);
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Has(refused.status().message(), "--tls-key: " + loose)) << refused.status().message();
}

}  // namespace
}  // namespace idem
