#include "tests/test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <system_error>

#include <pqxx/pqxx>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

extern char** environ;

#ifndef IDEM_PG_URL_FILE
#error "IDEM_PG_URL_FILE must name the file holding the test server's URL"
#endif

namespace idem::test {
namespace {

// Every test binary links this file: a server that answers early (413 on a
// large body) and closes while a test's client still writes must fail that
// write, not kill the test with SIGPIPE (cpp-httplib sends with flags 0).
[[maybe_unused]] const bool kSigpipeIgnored = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

}  // namespace

// ---- Files and ports -------------------------------------------------------

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    return;
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty() || keep_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int SpawnProcess(const std::string& binary, const std::vector<std::string>& args,
                 const std::string& out, const std::string& err,
                 const std::vector<std::string>& extra_env) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (auto& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string var = *e;
    if (var.rfind("IDEM_", 0) == 0 || var.rfind("TRAVEL_", 0) == 0) continue;
    env.push_back(var);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> cenv;
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT, 0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, binary.c_str(), &fa, nullptr, cargs.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << binary << ": " << std::strerror(rc);
    return -1;
  }
  return pid;
}

int UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot find an unused port";
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// ---- SQLite ----------------------------------------------------------------

SqliteTestStore::SqliteTestStore(const std::string& file)
    : dir_("idem_store"), path_(dir_.File(file)) {}

Result<std::unique_ptr<storage::Store>> SqliteTestStore::Open(storage::SqliteOptions options) {
  options.path = path_;
  Result<std::unique_ptr<storage::SqliteStore>> store = storage::SqliteStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<storage::Store>(std::move(store).value());
}

// ---- PostgreSQL ------------------------------------------------------------

Result<std::string> PgServerUrl() {
  if (const char* env = std::getenv("IDEM_PG_TEST_URL"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  std::ifstream in(IDEM_PG_URL_FILE);
  std::string url;
  if (!in || !std::getline(in, url) || url.empty()) {
    return Status::FailedPrecondition(
        std::string("no PostgreSQL test server: cannot read its URL from ") + IDEM_PG_URL_FILE +
        ". Run the tests through ctest (its pg_server_start fixture starts a server), or start "
        "one with `scripts/pg-test-server.sh start DIR`, which writes DIR/url");
  }
  return url;
}

PgUrlParts SplitPgUrl(const std::string& url) {
  PgUrlParts p;
  size_t at = url.find('@');
  size_t host_start = at == std::string::npos ? url.find("://") + 3 : at + 1;
  size_t slash = url.find('/', host_start);
  size_t colon = url.find(':', host_start);
  p.prefix = url.substr(0, host_start);
  p.host = url.substr(host_start, colon - host_start);
  p.port = std::stoi(url.substr(colon + 1, slash - colon - 1));
  p.database = url.substr(slash + 1);
  return p;
}

std::string RandomName(const std::string& prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  static constexpr char kHex[] = "0123456789abcdef";  // NOLINT(modernize-avoid-c-arrays)
  std::string name = prefix;
  for (uint64_t bits = rng(), i = 0; i < 16; ++i, bits >>= 4) name += kHex[bits & 0xf];
  return name;
}

PgTestDatabase::PgTestDatabase() {
  Result<std::string> server = PgServerUrl();
  if (!server.ok()) {
    status_ = server.status();
    return;
  }
  server_ = SplitPgUrl(*server);
  name_ = RandomName("t_");
  try {
    pqxx::connection admin(server_.Url());
    pqxx::nontransaction tx(admin);
    tx.exec("CREATE DATABASE " + tx.quote_name(name_));  // a generated name, never input
  } catch (const std::exception& e) {
    status_ = Status::Unavailable("cannot create test database " + name_ + " on " + server_.Url() +
                                  ": " + e.what());
  }
}

PgTestDatabase::~PgTestDatabase() {
  if (!status_.ok()) return;
  try {
    pqxx::connection admin(server_.Url());
    pqxx::nontransaction tx(admin);
    tx.exec("DROP DATABASE IF EXISTS " + tx.quote_name(name_) + " WITH (FORCE)");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "dropping test database " << name_ << ": " << e.what();
  }
}

Result<std::unique_ptr<storage::Store>> PgTestStore::Open(storage::PgOptions options) {
  if (!db_.status().ok()) return db_.status();
  options.url = db_.Url();
  Result<std::unique_ptr<storage::PgStore>> store = storage::PgStore::Open(options);
  if (!store.ok()) return store.status();
  return std::unique_ptr<storage::Store>(std::move(store).value());
}

}  // namespace idem::test
