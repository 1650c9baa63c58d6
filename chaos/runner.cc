#include "chaos/runner.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>

#include "examples/travel_booking/providers.h"
#include "storage/store.h"

#include "chaos/checker.h"
#include "common/json_util.h"
#include <sys/stat.h>

namespace idem::chaos {

int RunStats::TotalKills() const {
  int n = 0;
  for (const auto& [kind, k] : kills) n += k;
  return n;
}

namespace {

constexpr int kWorkers = 2;

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// The saga id a `run` ("saga ID (new, ...)"), a `submit` ("ID new") or an
// `open begin` ({"saga_id": ID, ...}) printed.
std::string PrintedSagaId(const std::string& out) {
  if (out.find("\"saga_id\"") != std::string::npos) {
    auto doc = ParseJson(out, "output");
    if (doc.ok() && doc->is_object() && (*doc)["saga_id"].is_string()) {
      return (*doc)["saga_id"].get<std::string>();
    }
  }
  for (const auto& line : Lines(out)) {
    if (StartsWith(line, "saga ") && line.find(" (") != std::string::npos) {
      return line.substr(5, line.find(" (") - 5);
    }
    size_t sp = line.find(' ');
    if (sp != std::string::npos && (line.substr(sp) == " new" || line.substr(sp) == " existing")) {
      return line.substr(0, sp);
    }
  }
  return "";
}

// Milliseconds of the wall clock (the ledger's timestamps are wall time).
int64_t WallMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// "YYYY-MM-DDTHH:MM:SS.mmmZ" (FormatTimeMs) as ms since the epoch; -1 if not.
int64_t ParseTimeMs(const std::string& text) {
  std::tm tm{};
  int ms = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return -1;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm)) * 1000 + ms;
}

// The arguments of an open saga's call of `tool` (the trip's input).
std::string OpenCallArgs(const std::string& tool) {
  if (tool == "flights.reserve") {
    return R"({"traveller": "Ana", "from": "LIS", "to": "NRT", "date": "2026-12-01",)"
           R"( "return_date": "2026-12-08", "currency": "EUR"})";
  }
  if (tool == "hotels.book") {
    return R"({"traveller": "Ana", "city": "Tokyo", "check_in": "2026-12-01",)"
           R"( "check_out": "2026-12-08", "currency": "EUR"})";
  }
  return R"({"traveller": "Ana", "city": "Tokyo", "from": "2026-12-01", "until": "2026-12-08"})";
}

}  // namespace

void Runner::MeasureBranches(const std::string& saga_id, int64_t wall0) {
  if (saga_id.empty() || durations_["branches"].second >= 5) return;
  auto ledger = travel::Ledger::Open(ledger_, /*create=*/false);
  if (!ledger.ok()) return;
  auto calls = (*ledger)->Calls();
  if (!calls.ok()) return;
  int64_t first = -1;
  for (const auto& c : *calls) {
    if (c.operation == "lookup" || c.idempotency_key.rfind(saga_id + "/", 0) != 0) continue;
    if (c.provider != "flights" && c.provider != "hotels" && c.provider != "cars") continue;
    int64_t at = ParseTimeMs(c.at);
    if (at >= 0 && (first < 0 || at < first)) first = at;
  }
  if (first < wall0) return;
  durations_["branches"].first += first - wall0;
  durations_["branches"].second += 1;
}

void Runner::RunOpenCommand(const SagaPlan& saga, const Command& cmd,
                            std::vector<std::string> argv) {
  std::string out;
  if (cmd.verb == "open_begin") {
    for (const char* a : {"open", "begin", "--intent-key", saga.intent_key.c_str(), "--tool",
                          "flights.reserve", "--tool", "hotels.book", "--tool", "cars.rent"}) {
      argv.push_back(a);
    }
    Exit e = Supervise("open_begin", argv, cmd.kill_at, cmd.during, "", &out);
    NoteAck(out, saga.intent_key);
    if (e.killed && PrintedSagaId(out).empty()) {  // the agent begins again, same intent key
      Supervise("open_begin", argv, -1, {}, "", &out);
      NoteAck(out, saga.intent_key);
    }
    return;
  }
  const std::string id = SagaIdFor(saga.intent_key);
  if (id.empty()) return;
  if (cmd.verb == "open_call") {
    for (const std::string& a :
         {std::string("open"), std::string("call"), id, std::string("--call-id"), cmd.call_id,
          std::string("--tool"), cmd.tool, std::string("--args"), OpenCallArgs(cmd.tool)}) {
      argv.push_back(a);
    }
  } else if (cmd.verb == "open_commit") {
    for (const std::string& a : {std::string("open"), std::string("commit"), id,
                                 std::string("--as"), std::string("chaos")}) {
      argv.push_back(a);
    }
  } else {
    for (const std::string& a :
         {std::string("open"), std::string("rollback"), id, std::string("--as"),
          std::string("chaos"), std::string("--reason"), std::string("chaos sweep")}) {
      argv.push_back(a);
    }
  }
  Exit e = Supervise(cmd.verb, argv, cmd.kill_at, cmd.during, id, &out);
  // Killed mid-call: the agent (its loop restarted) sends the same call
  // again, with the same call id; a commit or rollback likewise.
  if (e.killed) {
    std::vector<std::string> again(argv.begin(), argv.end());
    Supervise(cmd.verb, again, -1, {}, id, &out);
  }
}

std::vector<std::string> Runner::locators() const {
  std::vector<std::string> out = {locator_};
  if (!http_locator_.empty() && http_locator_ != locator_) out.push_back(http_locator_);
  return out;
}

Runner::Runner(RunnerConfig config, Plan plan)
    : config_(std::move(config)), plan_(std::move(plan)) {}

Runner::~Runner() { Shutdown(); }

std::string Runner::LogPath(const std::string& name) const {
  return config_.work_dir + "/logs/" + name;
}

std::vector<std::string> Runner::Base() const {
  // The slow provider (transfers.book, trip_async) confirms a job 300 ms
  // after it took it: long enough for kills while it is pending, short
  // enough for the end phase's checks.
  return {config_.travel_booking, "--store", locator_, "--keys", keys_, "--ledger", ledger_,
          "--confirm-delay-ms",   "300"};
}

int64_t Runner::Typical(const std::string& kind) const {
  auto it = durations_.find(kind);
  if (it == durations_.end() || it->second.second == 0) return -1;
  return it->second.first / it->second.second;
}

Status Runner::SetUp() {
  mkdir(config_.work_dir.c_str(), 0755);
  mkdir((config_.work_dir + "/logs").c_str(), 0755);
  ledger_ = config_.work_dir + "/ledger.sqlite";
  keys_ = config_.work_dir + "/keys.json";
  acked_ = config_.work_dir + "/acked.txt";
  input_ = "@" + config_.source_dir + "/examples/travel_booking/input.json";
  std::remove(acked_.c_str());
  if (!plan_.settings.postgres) {
    locator_ = config_.work_dir + "/journal.db";
    return SetUpHttp();
  }
  Status s;
  pg_dir_ = config_.work_dir + "/pg";
  Child c = Child::Spawn(
      {"/bin/bash", config_.source_dir + "/scripts/pg-test-server.sh", "start", pg_dir_},
      LogPath("pg-start.out"), LogPath("pg-start.err"));
  Exit e = c.WaitFor(180'000);
  if (e.running || e.killed || e.code != 0) {
    return Status::Internal("chaos: could not start PostgreSQL in " + pg_dir_ + ": " +
                            ReadFileText(LogPath("pg-start.err")));
  }
  locator_ = ReadFileText(pg_dir_ + "/url");
  while (!locator_.empty() && (locator_.back() == '\n' || locator_.back() == ' ')) {
    locator_.pop_back();
  }
  if (locator_.empty()) return Status::Internal("chaos: no URL in " + pg_dir_ + "/url");
  workers_.resize(kWorkers);
  stopped_until_.assign(kWorkers, 0);
  s = InstallAudit();
  if (!s.ok()) return s;
  for (int i = 0; i < kWorkers; ++i) StartWorker(i);
  return SetUpHttp();
}

void Runner::StartWorker(int i) {
  auto argv = Base();
  for (const char* a : {"worker", "--owner"}) argv.push_back(a);
  const std::string owner = "chaos-w" + std::to_string(i) + "-" + std::to_string(worker_spawns_++);
  argv.push_back(owner);
  for (const std::string& a : {std::string("--concurrency"), std::string("2"),
                               std::string("--lease-ms"), std::to_string(config_.lease_ms)}) {
    argv.push_back(a);
  }
  // Its connections name it (libpq's application_name): the journal audit
  // records which worker wrote each entry.
  workers_[i] = Child::Spawn(argv, LogPath("worker" + std::to_string(i) + ".out"),
                             LogPath("worker" + std::to_string(i) + ".err"), /*append=*/true,
                             {"PGAPPNAME=" + owner});
  stopped_until_[i] = 0;
  stats_.commands["worker"] += 1;
}

void Runner::KillWorker(int i) {
  if (workers_[i].Kill()) stats_.kills["worker"] += 1;
  StartWorker(i);
}

void Runner::StopWorker(int i) {
  if (stopped_until_[i] != 0) return;
  workers_[i].Stop();
  // Past its lease (and a renewal period), so another takes its sagas over;
  // then SIGCONT: its late writes must be refused at the fence.
  stopped_until_[i] = NowMs() + 2 * config_.lease_ms + 200;
  stats_.worker_stops += 1;
}

void Runner::Maintain() {
  MaintainHttp();
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    if (stopped_until_[i] != 0 && NowMs() >= stopped_until_[i]) {
      workers_[i].Continue();
      stopped_until_[i] = 0;
    }
    if (stopped_until_[i] != 0) continue;
    // As a supervisor would: not again within 250 ms (a worker that cannot
    // reach a restarting server exits at once).
    if (NowMs() - workers_[i].started_ms() < 250) continue;
    Exit e = workers_[i].Poll();
    if (e.running) continue;
    // It ended by itself: say how (a worker should run until stopped).
    stats_.worker_exits[e.killed ? "signal " + std::to_string(e.signal)
                                 : "exit " + std::to_string(e.code)] += 1;
    StartWorker(i);
  }
}

void Runner::RestartPostgres(std::vector<Aux>* aux) {
  Aux a;
  a.kind = "pg_restart";
  a.child = Child::Spawn(
      {"/bin/bash", config_.source_dir + "/scripts/pg-test-server.sh", "restart", pg_dir_},
      LogPath("pg-restart.out"), LogPath("pg-restart.err"));
  stats_.pg_restarts += 1;
  aux->push_back(std::move(a));
}

void Runner::NoteAck(const std::string& out, const std::string& intent_key) {
  std::string id = PrintedSagaId(out);
  if (id.empty()) return;
  if (saga_ids_.count(intent_key) == 0) {
    saga_ids_[intent_key] = id;
  }
  (void)AppendAcked(acked_, {id, intent_key});
}

std::string Runner::SagaIdFor(const std::string& intent_key, const std::string& locator) {
  auto it = saga_ids_.find(intent_key);
  if (it != saga_ids_.end()) return it->second;
  // Killed before it printed: the journal may still have it.
  auto store = storage::OpenStore(locator.empty() ? locator_ : locator);
  if (!store.ok()) return "";
  storage::SagaFilter f;
  f.limit = 1 << 30;
  auto list = (*store)->ListSagas(f);
  if (!list.ok()) return "";
  for (const auto& s : *list) {
    if (s.intent_key == intent_key) {
      saga_ids_[intent_key] = s.saga_id;
      return s.saga_id;
    }
  }
  return "";
}

std::string Runner::TokenFor(const std::string& saga_id, const std::string& locator) {
  auto store = storage::OpenStore(locator.empty() ? locator_ : locator);
  if (!store.ok()) return "";
  auto rec = (*store)->LoadSaga(saga_id);
  if (!rec.ok()) return "";
  for (const auto& st : rec->steps) {
    if (st.state == "awaiting_approval" && st.phase.is_object() && st.phase.contains("token") &&
        st.phase["token"].is_string()) {
      return st.phase["token"].get<std::string>();
    }
  }
  return "";
}

void Runner::Fire(const Event& e, const std::string& saga_id, std::vector<Aux>* aux) {
  if (e.what == "kill_worker" && !workers_.empty()) {
    KillWorker(static_cast<int>(static_cast<uint64_t>(e.at * 1e6) % workers_.size()));
  } else if (e.what == "stop_worker" && !workers_.empty()) {
    StopWorker(static_cast<int>(static_cast<uint64_t>(e.at * 1e6) % workers_.size()));
  } else if (e.what == "pg_restart" && !pg_dir_.empty()) {
    RestartPostgres(aux);
  } else if ((e.what == "cancel" || e.what == "pause") && !saga_id.empty()) {
    auto argv = Base();
    for (const std::string& a : {e.what, saga_id, std::string("--as"), std::string("chaos"),
                                 std::string("--reason"), std::string("chaos sweep")}) {
      argv.push_back(a);
    }
    Aux a;
    a.kind = e.what;
    a.child = Child::Spawn(argv, LogPath(e.what + ".out"), LogPath(e.what + ".err"));
    stats_.commands[e.what] += 1;
    int64_t typ = Typical(e.what);
    if (e.kill_at >= 0 && typ >= 0) a.kill_ms = a.child.started_ms() + int64_t(e.kill_at * typ);
    aux->push_back(std::move(a));
  }
}

Exit Runner::Supervise(const std::string& kind, const std::vector<std::string>& argv,
                       double kill_at, const std::vector<Event>& during, const std::string& saga_id,
                       std::string* out, int64_t kill_offset_ms) {
  const std::string out_path = LogPath(kind + ".out");
  Child child = Child::Spawn(argv, out_path, LogPath(kind + ".err"));
  stats_.commands[kind] += 1;
  const int64_t start = child.started_ms();
  const int64_t typ = Typical(kind);
  // Unmeasured yet: nothing is timed against it; this run measures.
  const int64_t scale = typ >= 0 ? std::max<int64_t>(typ, 5) : 200;
  int64_t kill_ms = (kill_at >= 0 && typ >= 0) ? start + int64_t(kill_at * scale) : -1;
  if (kill_offset_ms >= 0) kill_ms = start + kill_offset_ms;
  std::vector<std::pair<int64_t, const Event*>> events;
  for (const auto& e : during) events.push_back({start + int64_t(e.at * scale), &e});
  std::sort(events.begin(), events.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t next = 0;
  std::vector<Aux> aux;
  bool killed = false;
  Exit ended;
  std::string known_id = saga_id;
  while (true) {
    int64_t now = NowMs();
    while (next < events.size() && events[next].first <= now) {
      if (known_id.empty()) known_id = PrintedSagaId(ReadFileText(out_path));
      Fire(*events[next].second, known_id, &aux);
      ++next;
    }
    for (auto& a : aux) {
      if (a.kill_ms >= 0 && now >= a.kill_ms) {
        if (a.child.Kill()) stats_.kills[a.kind] += 1;
        a.kill_ms = -1;
      }
    }
    if (!killed && kill_ms >= 0 && now >= kill_ms) {
      killed = child.Kill();
      if (killed) stats_.kills[kind] += 1;
    }
    ended = child.WaitFor(1);
    if (!ended.running) break;
    Maintain();
  }
  // Events planned past the end come right after it.
  for (; next < events.size(); ++next) {
    if (known_id.empty()) known_id = PrintedSagaId(ReadFileText(out_path));
    Fire(*events[next].second, known_id, &aux);
  }
  for (auto& a : aux) {
    while (true) {
      int64_t now = NowMs();
      if (a.kill_ms >= 0 && now >= a.kill_ms) {
        if (a.child.Kill()) stats_.kills[a.kind] += 1;
        a.kill_ms = -1;
      }
      Exit e = a.child.WaitFor(2);
      if (!e.running) {
        if (!e.killed && a.kind != "pg_restart") {
          durations_[a.kind].first += e.ms;
          durations_[a.kind].second += 1;
        }
        if (a.kind == "pg_restart") {
          stats_.pg_restarts_by_outcome[e.code == 0 ? "ok" : "failed"] += 1;
        }
        break;
      }
      Maintain();
    }
  }
  if (!ended.killed) {
    durations_[kind].first += ended.ms;
    durations_[kind].second += 1;
  }
  *out = ReadFileText(out_path);
  if (config_.verbose) {
    std::printf("  %-8s %s %s (%lld ms)\n", kind.c_str(), saga_id.c_str(),
                ended.killed ? "killed" : ("exit " + std::to_string(ended.code)).c_str(),
                static_cast<long long>(ended.ms));
  }
  return ended;
}

void Runner::RunCommand(const SagaPlan& saga, const Command& cmd) {
  if (StartsWith(cmd.verb, "http_")) return RunHttpCommand(saga, cmd);
  const Scenario* sc = FindScenario(saga.scenario);
  auto argv = Base();
  for (const auto& f : cmd.faults) {
    argv.push_back("--fault");
    argv.push_back(f);
  }
  if (cmd.latency_ms > 0) {
    argv.push_back("--latency-ms");
    argv.push_back(std::to_string(cmd.latency_ms));
  }
  std::string out;
  if (StartsWith(cmd.verb, "open_")) return RunOpenCommand(saga, cmd, argv);
  if (cmd.verb == "run" || cmd.verb == "submit") {
    for (const std::string& a :
         {cmd.verb, config_.source_dir + "/" + sc->spec, std::string("--input"), input_,
          std::string("--intent-key"), saga.intent_key}) {
      argv.push_back(a);
    }
    // A kill in the parallel branches' window: from the measured moment the
    // first branch reaches its provider, uniformly across the providers'
    // latency (the time all three are in flight). Unmeasured: this run
    // measures, unkilled.
    const int64_t branches = Typical("branches");
    int64_t offset = -1;
    double kill_at = cmd.kill_at;
    if (cmd.kill_in_branches) {
      kill_at = -1;
      if (branches >= 0) offset = branches + int64_t(cmd.kill_at / 1.2 * cmd.latency_ms);
    }
    const int64_t wall0 = WallMs();
    Exit e = Supervise(cmd.verb, argv, kill_at, cmd.during, "", &out, offset);
    if (cmd.kill_in_branches && !e.killed) MeasureBranches(PrintedSagaId(out), wall0);
    if (cmd.kill_in_branches && offset >= 0 && e.killed) stats_.branch_kills += 1;
    NoteAck(out, saga.intent_key);
    if (e.killed && PrintedSagaId(out).empty()) {
      // Killed before it answered: the agent submits again with the same
      // intent key (the same saga if it was recorded).
      auto again = Base();
      for (size_t i = Base().size(); i < argv.size(); ++i) again.push_back(argv[i]);
      Supervise(cmd.verb, again, -1, {}, "", &out);
      NoteAck(out, saga.intent_key);
    }
    return;
  }
  if (cmd.verb == "recover") {
    argv.push_back("recover");
    Supervise("recover", argv, cmd.kill_at, {}, "", &out);
    return;
  }
  const std::string id = SagaIdFor(saga.intent_key);
  if (id.empty()) return;
  if (cmd.verb == "resume") {
    for (const std::string& a :
         {std::string("resume"), id, std::string("--as"), std::string("chaos")}) {
      argv.push_back(a);
    }
    Supervise("resume", argv, cmd.kill_at, {}, id, &out);
    return;
  }
  if (cmd.verb == "approve" || cmd.verb == "reject") {
    const std::string token = TokenFor(id);
    if (token.empty()) return;  // not waiting (killed earlier, rolled back, ...)
    for (const std::string& a : {cmd.verb, token, std::string("--as"), std::string("chaos")}) {
      argv.push_back(a);
    }
    if (cmd.verb == "reject") {
      argv.push_back("--reason");
      argv.push_back("chaos sweep");
    }
    Supervise(cmd.verb, argv, cmd.kill_at, {}, id, &out);
  }
}

double Runner::NextPersonKill() {
  if (plan_.person_kills.empty()) return -1;
  double k = plan_.person_kills[person_kill_next_ % plan_.person_kills.size()];
  ++person_kill_next_;
  return k;
}

bool Runner::RecoverUntilQuiet(int64_t deadline_ms) {
  while (NowMs() < deadline_ms) {
    auto argv = Base();
    argv.push_back("recover");
    std::string out;
    Exit e = Supervise("recover", argv, -1, {}, "", &out);
    bool moved = out.find("recovery: 0 saga(s) resumed") == std::string::npos;
    // Sagas still moving (leased by a process that died, or driven by a
    // worker) show as pending/running/compensating in the store.
    bool busy = false;
    for (const auto& locator : locators()) {
      auto store = storage::OpenStore(locator);
      if (store.ok()) {
        storage::SagaFilter f;
        // A saga waiting for its provider is checked by a later recover
        // once due: not quiet yet.
        f.states = {"pending", "running", "compensating", "awaiting_completion"};
        f.limit = 1;
        auto list = (*store)->ListSagas(f);
        busy = busy || !list.ok() || !list->empty();
      } else {
        busy = true;
      }
    }
    if (!moved && !busy && !e.killed) return true;
    if (!moved) {
      for (int i = 0; i < 50; ++i) {  // a lease to run out, a worker to finish
        Maintain();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  return false;
}

int Runner::PersonPass() {
  int acted = 0;
  for (const auto& locator : locators()) acted += PersonPass(locator);
  return acted;
}

int Runner::PersonPass(const std::string& locator) {
  auto store_r = storage::OpenStore(locator);
  if (!store_r.ok()) return 0;
  auto& store = *store_r;
  auto ledger_r = travel::Ledger::Open(ledger_, /*create=*/true);
  if (!ledger_r.ok()) return 0;
  auto effects = (*ledger_r)->Effects();
  if (!effects.ok()) return 0;
  std::map<std::string, Json> applied;  // key -> the first result
  for (const auto& e : *effects) applied.emplace(e.idempotency_key, e.result);
  storage::SagaFilter f;
  f.states = {"needs_attention", "awaiting_approval", "paused", "open"};
  f.limit = 1 << 30;
  auto list = store->ListSagas(f);
  if (!list.ok()) return 0;
  int acted = 0;
  // On SQLite the servers' journal holds only sagas submitted over the API.
  const bool api_journal = locator != locator_;
  for (const auto& sum : *list) {
    auto rec = store->LoadSaga(sum.saga_id);
    if (!rec.ok()) continue;
    std::vector<std::vector<std::string>> decisions;
    if (sum.state == "open") {
      // The agent is gone (its last command killed, or it never committed):
      // the person rolls the open saga back.
      decisions.push_back(
          {"open", "rollback", sum.saga_id, "--as", "person", "--reason", "the agent is gone"});
    } else if (sum.state == "paused") {
      decisions.push_back({"resume", sum.saga_id, "--as", "person"});
    } else if (sum.state == "awaiting_approval") {
      std::string token = TokenFor(sum.saga_id, locator);
      if (!token.empty()) decisions.push_back({"approve", token, "--as", "person"});
    } else {
      for (const auto& st : rec->steps) {
        if (st.state == "needs_attention") {
          auto it = applied.find(st.step_key);
          if (it != applied.end()) {
            decisions.push_back({"resolve", sum.saga_id, st.step_id, "--decision", "applied",
                                 "--as", "person", "--result", it->second.dump()});
          } else {
            decisions.push_back({"resolve", sum.saga_id, st.step_id, "--decision", "not_applied",
                                 "--as", "person"});
          }
        } else if (st.state == "compensation_failed") {
          bool undone = applied.count(st.step_key + ":compensate") > 0;
          decisions.push_back({"resolve", sum.saga_id, st.step_id, "--decision",
                               undone ? "undone" : "retry_undo", "--as", "person"});
        }
      }
    }
    for (const auto& d : decisions) {
      stats_.person_decisions += 1;
      if (api_journal || ApiSaga(sum.saga_id)) {
        ApiDecision(d);
        ++acted;
        break;
      }
      auto argv = Base();
      argv.insert(argv.end(), d.begin(), d.end());
      std::string out;
      Supervise(d[0], argv, NextPersonKill(), {}, sum.saga_id, &out);
      ++acted;
      break;  // one decision per saga per pass: the saga moves on after it
    }
  }
  return acted;
}

Status Runner::Settle() {
  const int64_t deadline = NowMs() + int64_t(config_.settle_timeout_s) * 1000;
  for (int i = 0; i < static_cast<int>(workers_.size()); ++i) {
    if (stopped_until_[i] != 0) {
      workers_[i].Continue();
      stopped_until_[i] = 0;
    }
  }
  RetryGivenUp();
  // Until nothing waits for the person, or the deadline. A decision can find
  // the saga busy: the lease of a process SIGKILLed while it held it (a CLI's
  // lease is 30 s) is still running, so the decision is refused or recorded
  // for later. The next round comes after a pause, and comes again until
  // that lease has run out; a fixed number of quick rounds could end inside
  // it and leave a saga waiting that was about to move.
  while (NowMs() < deadline) {
    stats_.settle_rounds += 1;
    RecoverUntilQuiet(deadline);
    if (PersonPass() == 0) break;
    for (int i = 0; i < 25 && NowMs() < deadline; ++i) {  // about 0.5 s
      Maintain();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  RecoverUntilQuiet(deadline);
  return Status::Ok();
}

Status Runner::Execute() {
  const int64_t t0 = NowMs();
  Status s = SetUp();
  if (!s.ok()) return s;
  for (const auto& saga : plan_.sagas) {
    for (const auto& cmd : saga.commands) RunCommand(saga, cmd);
    Maintain();
  }
  s = Settle();
  DumpAudit();
  for (const auto& [kind, d] : durations_) {
    stats_.typical_ms[kind] = d.second ? d.first / d.second : 0;
  }
  stats_.elapsed_ms = NowMs() - t0;
  return s;
}

void Runner::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& w : workers_) w.Kill();
  workers_.clear();
  for (auto& sv : servers_) sv.child.Kill();
  servers_.clear();
  provider_.Kill();
  if (!pg_dir_.empty()) {
    Child c = Child::Spawn(
        {"/bin/bash", config_.source_dir + "/scripts/pg-test-server.sh", "stop", pg_dir_},
        LogPath("pg-stop.out"), LogPath("pg-stop.err"));
    c.WaitFor(120'000);
  }
}

}  // namespace idem::chaos
