// The sweep's HTTP path (chaos/runner.h): `idem serve` processes and the
// travel providers as an HTTP process, killed and restarted; the runner as
// the agent that submits with an Idempotency-Key and retries with it.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include <httplib.h>

#include "storage/store.h"

#include "chaos/checker.h"
#include "chaos/runner.h"
#include "common/json_util.h"
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem::chaos {

namespace {

// The principals of the auth file: the agent submits (the server keys its
// saga "<principal>:<Idempotency-Key>"); a person approves, rejects,
// cancels and resolves (a caller may not approve its own saga's commit).
constexpr const char* kPrincipal = "chaos-agent";
constexpr const char* kPerson = "chaos-person";
// The providers' read timeout for idem (the tools file) and how long they
// withhold a lost response (past it).
constexpr int kToolTimeoutMs = 1500;
constexpr int kLostResponseHoldMs = 2000;
// The agent's retries, as clients/typescript's defaults: 6 attempts in all,
// waits of 250 ms doubled each time up to 4 s (no jitter: the sweep's
// timing is noisy enough). A person's decision is retried longer.
constexpr int kAgentAttempts = 6;
constexpr int kPersonAttempts = 12;
int64_t BackoffMs(int attempt) { return std::min<int64_t>(4000, 250LL << std::min(attempt, 5)); }

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

bool HealthOk(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(0, 200'000);
  c.set_read_timeout(1, 0);
  auto r = c.Get("/healthz");
  return r && r->status == 200;
}

// Whether an answer ends the agent's retries: a 2xx or a refusal that a
// retry cannot change (4xx but 408, 409 in flight and 429).
bool Final(int status) {
  if (status >= 200 && status < 300) return true;
  return status >= 400 && status < 500 && status != 408 && status != 409 && status != 429;
}

}  // namespace

bool Runner::ApiSaga(const std::string& saga_id) const { return api_sagas_.count(saga_id) > 0; }

Status Runner::SetUpHttp() {
  if (config_.idem.empty() || config_.travel_providers.empty()) return Status::Ok();
  const std::string tools_src = config_.source_dir + "/examples/travel_booking/tools.http.json";
  auto doc = ParseJson(ReadFileText(tools_src), tools_src);
  if (!doc.ok()) return doc.status();
  provider_port_ = FreePort();
  if (provider_port_ == 0) return Status::Internal("chaos: no free port for the providers");
  for (auto& t : (*doc)["tools"]) {
    t["base_url"] = "http://127.0.0.1:" + std::to_string(provider_port_);
    t["timeout_ms"] = kToolTimeoutMs;
  }
  tools_file_ = config_.work_dir + "/tools.http.json";
  std::ofstream(tools_file_) << doc->dump(2);
  // A token of this run only (the throwaway server's), stored hashed.
  const std::string salt = config_.work_dir + std::to_string(NowMs()) + std::to_string(getpid());
  token_ = Sha256Hex("agent" + salt);
  person_token_ = Sha256Hex("person" + salt);
  auth_file_ = config_.work_dir + "/auth.json";
  Json auth = Json::array();
  auth.push_back({{"name", kPrincipal}, {"token_sha256", Sha256Hex(token_)}, {"roles", {"agent"}}});
  auth.push_back({{"name", kPerson},
                  {"token_sha256", Sha256Hex(person_token_)},
                  {"roles", {"approver", "operator"}}});
  std::ofstream(auth_file_) << auth.dump();
  chmod(auth_file_.c_str(), 0600);
  http_locator_ = plan_.settings.postgres ? locator_ : config_.work_dir + "/journal-http.db";
  Status s = StartProvider({}, 0);
  if (!s.ok()) return s;
  servers_.resize(plan_.settings.postgres ? 2 : 1);
  for (size_t i = 0; i < servers_.size(); ++i) {
    servers_[i].port = FreePort();
    StartServer(static_cast<int>(i));
  }
  for (size_t i = 0; i < servers_.size(); ++i) {
    const int64_t deadline = NowMs() + 30'000;
    while (!HealthOk(servers_[i].port)) {
      if (NowMs() > deadline) {
        return Status::Internal("chaos: idem serve did not answer on port " +
                                std::to_string(servers_[i].port) + ": " +
                                ReadFileText(LogPath("serve" + std::to_string(i) + ".err")));
      }
      MaintainHttp();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return Status::Ok();
}

void Runner::StartServer(int i) {
  std::vector<std::string> argv = {
      config_.idem, "--store",  http_locator_, "--keys",
      keys_,        "serve",    "--listen",    "127.0.0.1:" + std::to_string(servers_[i].port),
      "--auth",     auth_file_, "--tools",     tools_file_,
      "--workers",  "4"};
  const std::string name = "serve" + std::to_string(i);
  servers_[i].child =
      Child::Spawn(argv, LogPath(name + ".out"), LogPath(name + ".err"), /*append=*/true);
  servers_[i].start_after_ms = 0;
  stats_.commands["serve"] += 1;
}

void Runner::KillServer(int i) {
  if (i < 0 || i >= static_cast<int>(servers_.size())) return;
  if (servers_[i].start_after_ms != 0) return;  // already down
  if (servers_[i].child.Kill()) stats_.kills["serve"] += 1;
  // As a supervisor restarts it (the same port: the agent's URL).
  servers_[i].start_after_ms = NowMs() + 50;
}

Status Runner::StartProvider(const std::vector<std::string>& faults, int latency_ms) {
  std::vector<std::string> argv = {config_.travel_providers,
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(provider_port_),
                                   "--ledger",
                                   ledger_,
                                   "--keys",
                                   config_.work_dir + "/provider-keys.sqlite",
                                   "--lost-response-hold-ms",
                                   std::to_string(kLostResponseHoldMs)};
  if (latency_ms > 0) {
    argv.push_back("--latency-ms");
    argv.push_back(std::to_string(latency_ms));
  }
  for (const auto& f : faults) {
    argv.push_back("--fault");
    argv.push_back(f);
  }
  provider_ = Child::Spawn(argv, LogPath("providers.out"), LogPath("providers.err"), true);
  provider_faults_ = faults;
  provider_latency_ms_ = latency_ms;
  provider_start_after_ms_ = 0;
  stats_.commands["provider"] += 1;
  const int64_t deadline = NowMs() + 20'000;
  while (!HealthOk(provider_port_)) {
    Exit e = provider_.Poll();
    if (!e.running || NowMs() > deadline) {
      return Status::Internal("chaos: travel-providers did not start: " +
                              ReadFileText(LogPath("providers.err")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Ok();
}

void Runner::KillProvider() {
  if (!provider_.started() || provider_start_after_ms_ != 0) return;
  if (provider_.Kill()) stats_.kills["provider"] += 1;
  provider_start_after_ms_ = NowMs() + 100;  // restarted on its ledger and key store
}

void Runner::MaintainHttp() {
  const int64_t now = NowMs();
  for (int i = 0; i < static_cast<int>(servers_.size()); ++i) {
    Server& s = servers_[i];
    if (s.start_after_ms != 0) {
      if (now >= s.start_after_ms) StartServer(i);
      continue;
    }
    if (now - s.child.started_ms() < 250) continue;
    Exit e = s.child.Poll();
    if (e.running) continue;
    // It ended by itself (its port still taken, the database restarting).
    stats_.worker_exits["serve " + (e.killed ? "signal " + std::to_string(e.signal)
                                             : "exit " + std::to_string(e.code))] += 1;
    s.start_after_ms = now + 100;
  }
  if (provider_start_after_ms_ != 0 && now >= provider_start_after_ms_) {
    Status st = StartProvider(provider_faults_, provider_latency_ms_);
    if (!st.ok()) provider_start_after_ms_ = NowMs() + 200;
  }
}

Runner::HttpAnswer Runner::Request(int i, const std::string& method, const std::string& path,
                                   const std::string& body, const std::string& idempotency_key) {
  HttpAnswer a;
  if (servers_.empty()) return a;
  httplib::Client c("127.0.0.1", servers_[i % servers_.size()].port);
  c.set_connection_timeout(0, 300'000);
  c.set_read_timeout(15, 0);
  const bool submit = path == "/v1/sagas";
  httplib::Headers h = {{"Authorization", "Bearer " + (submit ? token_ : person_token_)}};
  if (!idempotency_key.empty()) {
    h.emplace("Idempotency-Key", idempotency_key);
    h.emplace("Prefer", "wait=5");
  }
  httplib::Result r = method == "GET" ? c.Get(path, h) : c.Post(path, h, body, "application/json");
  if (r) {
    a.status = r->status;
    a.body = r->body;
  }
  return a;
}

int Runner::Retrying(const std::string& path, const std::string& body) {
  int status = 0;
  for (int attempt = 0; attempt < kPersonAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(BackoffMs(attempt - 1)));
    status = Request(attempt, "POST", path, body, "").status;
    if (Final(status)) break;
  }
  return status;
}

int64_t Runner::WhileRunning(const std::string& kind, double kill_at,
                             const std::vector<Event>& during, const std::string& saga_id,
                             const std::function<int()>& fn) {
  stats_.commands[kind] += 1;
  const int64_t start = NowMs();
  const int64_t typ = Typical(kind);
  const int64_t scale = typ >= 0 ? std::max<int64_t>(typ, 5) : 200;
  const int64_t kill_ms = (kill_at >= 0 && typ >= 0) ? start + int64_t(kill_at * scale) : -1;
  std::vector<std::pair<int64_t, const Event*>> events;
  for (const auto& e : during) events.push_back({start + int64_t(e.at * scale), &e});
  std::sort(events.begin(), events.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Aux> aux;
  auto fire = [&](const Event& e) {
    if (e.what == "kill_server") {
      KillServer(static_cast<int>(static_cast<uint64_t>(e.at * 1e6) % servers_.size()));
    } else if (e.what == "kill_provider") {
      KillProvider();
    } else if (e.what == "cancel") {
      // The saga as the journal has it (the submit may not have answered).
      std::string id = saga_id;
      if (id.empty() && !current_journal_key_.empty()) {
        id = SagaIdFor(current_journal_key_, http_locator_);
      }
      if (!id.empty()) {
        (void)Request(0, "POST", "/v1/sagas/" + id + "/cancel", R"({"reason": "chaos sweep"})", "");
      }
    } else {
      Fire(e, saga_id, &aux);
    }
  };
  std::future<int> done = std::async(std::launch::async, fn);
  size_t next = 0;
  bool killed = false;
  while (done.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    const int64_t now = NowMs();
    while (next < events.size() && events[next].first <= now) fire(*events[next++].second);
    if (!killed && kill_ms >= 0 && now >= kill_ms && !servers_.empty()) {
      // The server the request most likely went to (any of them: the agent
      // goes round them).
      KillServer(static_cast<int>(static_cast<uint64_t>(kill_at * 1e6) % servers_.size()));
      killed = true;
    }
    Maintain();
  }
  const int status = done.get();
  const int64_t ms = NowMs() - start;
  stats_.http_answers[kind + " " + std::to_string(status)] += 1;
  for (; next < events.size(); ++next) fire(*events[next].second);
  for (auto& a : aux) {
    Exit e;
    while ((e = a.child.WaitFor(2)).running) Maintain();
    if (a.kind == "pg_restart") stats_.pg_restarts_by_outcome[e.code == 0 ? "ok" : "failed"] += 1;
  }
  if (!killed) {
    durations_[kind].first += ms;
    durations_[kind].second += 1;
  }
  if (config_.verbose) {
    std::printf("  %-12s %s HTTP %d%s (%lld ms)\n", kind.c_str(), saga_id.c_str(), status,
                killed ? ", a server killed" : "", static_cast<long long>(ms));
  }
  return ms;
}

void Runner::RunHttpCommand(const SagaPlan& saga, const Command& cmd) {
  if (servers_.empty()) return;
  const std::string journal_key = std::string(kPrincipal) + ":" + saga.intent_key;
  if (cmd.verb == "http_submit") {
    if (cmd.faults != provider_faults_ || cmd.latency_ms != provider_latency_ms_) {
      // The provider process restarted with this saga's faults (a kill:
      // other sagas' calls may be in flight).
      KillProvider();
      Status s = StartProvider(cmd.faults, cmd.latency_ms);
      if (!s.ok()) provider_start_after_ms_ = NowMs() + 200;
    }
    Json body = {{"spec", *ParseJson(ReadFileText(config_.source_dir + "/" +
                                                  FindScenario(saga.scenario)->spec),
                                     "spec")},
                 {"input", *ParseJson(ReadFileText(input_.substr(1)), "input")}};
    const std::string text = body.dump();
    std::string id;
    current_journal_key_ = journal_key;
    int status = 0;
    WhileRunning("http_submit", cmd.kill_at, cmd.during, "", [&] {
      id = SubmitOverApi(saga.intent_key, text, &status);
      return status;
    });
    current_journal_key_.clear();
    if (!id.empty()) {
      saga_ids_[saga.intent_key] = id;
      api_sagas_.insert(id);
    } else if (status == 409) {
      // The key is still claimed by a server killed while it answered: the
      // claim, no longer renewed, is taken over after the key layer's lock
      // timeout (5 s), which can outlast the client's retries. The agent
      // tries once more then (Settle).
      given_up_.push_back({saga.intent_key, text, NowMs()});
      stats_.worker_exits["agent gave up on a submit (409 in flight)"] += 1;
    } else {
      stats_.worker_exits["agent gave up on a submit (HTTP " + std::to_string(status) + ")"] += 1;
    }
    return;
  }
  // http_approve / http_reject: once the saga waits for a person.
  std::string id = saga_ids_.count(saga.intent_key) ? saga_ids_[saga.intent_key]
                                                    : SagaIdFor(journal_key, http_locator_);
  if (id.empty()) return;
  api_sagas_.insert(id);
  std::string token;
  const int64_t wait_until = NowMs() + 20'000;
  while (NowMs() < wait_until) {
    token = TokenFor(id, http_locator_);
    if (!token.empty()) break;
    auto store = storage::OpenStore(http_locator_);
    if (store.ok()) {
      auto rec = (*store)->LoadSaga(id);
      if (rec.ok() && rec->summary.state != "running" && rec->summary.state != "pending") break;
    }
    for (int i = 0; i < 5; ++i) {
      Maintain();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (token.empty()) return;
  const bool approve = cmd.verb == "http_approve";
  const std::string path = "/v1/approvals/" + token + (approve ? "/approve" : "/reject");
  const std::string body = approve ? R"({"note": "chaos"})" : R"({"reason": "chaos sweep"})";
  WhileRunning(cmd.verb, cmd.kill_at, cmd.during, id, [&] { return Retrying(path, body); });
}

std::string Runner::SubmitOverApi(const std::string& key, const std::string& text, int* status) {
  const std::string journal_key = std::string(kPrincipal) + ":" + key;
  for (int attempt = 0; attempt < kAgentAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(BackoffMs(attempt - 1)));
    HttpAnswer a = Request(attempt, "POST", "/v1/sagas", text, key);
    *status = a.status;
    if (a.status >= 200 && a.status < 300) {
      std::string id;
      auto doc = ParseJson(a.body, "answer");
      if (doc.ok() && doc->is_object()) id = doc->value("saga_id", "");
      // Acknowledged: recorded before anything else happens.
      if (!id.empty()) (void)AppendAcked(acked_, {id, journal_key});
      return id;
    }
    if (Final(a.status)) return "";
  }
  return "";
}

void Runner::RetryGivenUp() {
  for (const auto& g : given_up_) {
    // Past the key layer's lock timeout (IdempotencyOptions: 5 s).
    while (NowMs() < g.at_ms + 6'000) {
      Maintain();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int status = 0;
    std::string id;
    WhileRunning("http_late_submit", -1, {}, "", [&] {
      id = SubmitOverApi(g.key, g.body, &status);
      return status;
    });
    if (!id.empty()) {
      saga_ids_[g.key] = id;
      api_sagas_.insert(id);
    }
  }
  given_up_.clear();
}

void Runner::ApiDecision(const std::vector<std::string>& d) {
  // d is the CLI form: {"resume", ID, ...}, {"approve", TOKEN, ...},
  // {"resolve", ID, STEP, "--decision", D, "--as", WHO[, "--result", JSON]}.
  std::string path, body;
  if (d[0] == "resume") {
    path = "/v1/sagas/" + d[1] + "/resume";
    body = "{}";
  } else if (d[0] == "approve") {
    path = "/v1/approvals/" + d[1] + "/approve";
    body = R"({"note": "person"})";
  } else if (d[0] == "resolve" && d.size() >= 5) {
    Json b = {{"step", d[2]}, {"decision", d[4]}, {"note", "person, from the ledger"}};
    if (d.size() >= 9 && d[7] == "--result") {
      auto r = ParseJson(d[8], "result");
      if (r.ok()) b["result"] = *r;
    }
    path = "/v1/sagas/" + d[1] + "/resolve";
    body = b.dump();
  } else {
    return;
  }
  WhileRunning("api_" + d[0], NextPersonKill(), {}, "", [&] { return Retrying(path, body); });
}

}  // namespace idem::chaos
