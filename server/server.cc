#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <httplib.h>

#include "observability/observability.h"
#include "saga/engine.h"
#include "saga/machines.h"
#include "saga/spec.h"
#include "saga/states.h"
#include "saga/views.h"
#include "server/idempotency.h"
#include "server/spec_registry.h"

#include "common/json_util.h"
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace idem::server {
namespace {

using storage::SagaRecord;

constexpr const char* kProblemJson = "application/problem+json";
constexpr const char* kAnonymous = "anonymous";
constexpr const char* kRoleAgent = "agent";
constexpr const char* kRoleApprover = "approver";
constexpr size_t kMaxBearerBytes = 4096;
constexpr int kDefaultListLimit = 100;
constexpr int kMaxListLimit = 1000;
constexpr int kListenBacklog = 1024;

// ---- problems (RFC 9457)

void Problem(httplib::Response& res, int status, const std::string& type, const std::string& title,
             const std::string& detail) {
  Json p = {{"type", "urn:idem:problem:" + type},
            {"title", title},
            {"status", status},
            {"detail", PrintableText(detail)}};
  res.status = status;
  res.set_content(p.dump(), kProblemJson);
}

void SendJson(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

// The one mapping of engine and store statuses to HTTP.
void ProblemFor(httplib::Response& res, const Status& s) {
  switch (s.code()) {
    case Code::kInvalidArgument:
      return Problem(res, 400, "invalid-request", "Invalid request", s.message());
    case Code::kNotFound:
      return Problem(res, 404, "not-found", "Not found", s.message());
    case Code::kConflict:
      return Problem(res, 409, "conflict", "Conflict", s.message());
    case Code::kFailedPrecondition:
    case Code::kIllegalTransition:
    case Code::kAborted:
      return Problem(res, 409, "conflict", "Not possible in the current state", s.message());
    case Code::kUnavailable:
      res.set_header("Retry-After", "1");
      return Problem(res, 503, "store-unavailable", "Store unavailable", s.message());
    default:
      return Problem(res, 500, "internal", "Internal error", s.message());
  }
}

// ---- input checks

// RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    unsigned cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = p[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

bool ValidName(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "::1" || host == "localhost" || host.rfind("127.", 0) == 0;
}

// The Idempotency-Key as the layer reads it: an RFC 8941 sf-string is
// unquoted, anything else is taken as sent.
std::string IdempotencyKeyOf(const httplib::Request& req) {
  std::string v = req.get_header_value("Idempotency-Key");
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
    std::string out;
    for (size_t i = 1; i + 1 < v.size(); ++i) {
      if (v[i] == '\\' && i + 2 < v.size()) ++i;
      out += v[i];
    }
    return out;
  }
  return v;
}

// "<owner>:<client key>": the owner is the part before the first ':'.
std::string OwnerOf(const std::string& intent_key) {
  size_t colon = intent_key.find(':');
  return colon == std::string::npos ? "" : intent_key.substr(0, colon);
}
std::string ClientKeyOf(const std::string& intent_key) {
  size_t colon = intent_key.find(':');
  return colon == std::string::npos ? intent_key : intent_key.substr(colon + 1);
}

Json SummaryView(const storage::SagaSummary& s) {
  return {{"saga_id", s.saga_id},
          {"intent_key", ClientKeyOf(s.intent_key)},
          {"spec", s.spec_name},
          {"state", s.state},
          {"reason", s.reason},
          {"created_at", FormatTimeMs(s.created_ms)},
          {"updated_at", FormatTimeMs(s.updated_ms)}};
}

Json SagaView(const SagaRecord& rec, const std::vector<storage::EffectRecord>& effects) {
  Json out = SummaryView(rec.summary);
  Json steps = Json::array();
  for (const auto& st : rec.steps) steps.push_back(StepView(st));
  Json effs = Json::array();
  for (const auto& e : effects) effs.push_back(EffectView(e));
  out["input"] = rec.input;
  out["steps"] = std::move(steps);
  out["effects"] = std::move(effs);
  return out;
}

// ---- metrics (Prometheus text format 0.0.4, written by hand)

class Metrics {
 public:
  static constexpr std::array<double, 14> kBuckets = {0.01, 0.05, 0.1, 0.5,  1,    5,     10,
                                                      30,   60,   300, 1800, 3600, 21600, 86400};

  void Observe(const storage::JournalEntry& e, storage::Store* store) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string step = e.saga_id + "/" + e.step_id;
    if (!e.step_id.empty()) {
      bool was_unknown = unknown_.count(step) > 0;
      if (e.event == "succeeded" || e.event == "failed" || e.event == "needs_attention") {
        ++steps_[e.event];
      }
      if (e.event == "unknown") {
        ++steps_["unknown"];
        ++unknown_total_;
        unknown_.insert(step);
      } else if (was_unknown) {
        std::string how;
        if (e.event == "succeeded") {
          how = e.data.is_object() && e.data.contains("resolved_by") ? "status_lookup"
                                                                     : "same_key_retry";
        } else if (e.event == "submitted") {
          how = "same_key_retry";
        } else if (e.event == "failed") {
          how = "not_applied";
        } else if (e.event == "needs_attention") {
          how = "needs_attention";
        } else if (e.event == "operator_resolved") {
          how = "operator";
        }
        if (!how.empty()) {
          ++unknown_resolved_[how];
          if (how != "needs_attention") unknown_.erase(step);
        }
      }
      if (e.event == "submitted" && e.data.is_object() && e.data.contains("retry_after_ms")) {
        ++retries_;
      }
      if (e.event == "compensated") ++compensations_["compensated"];
      if (e.event == "compensation_failed") ++compensations_["failed"];
      return;
    }
    static const std::set<std::string> kTerminal = {"saga_succeeded", "saga_compensated",
                                                    "saga_failed", "saga_cancelled"};
    if (kTerminal.count(e.event) == 0) return;
    auto rec = store->LoadSaga(e.saga_id);
    if (!rec.ok()) return;
    ObserveTerminalLocked(static_cast<double>(e.at_ms - rec->summary.created_ms) / 1000.0);
    for (auto it = unknown_.begin(); it != unknown_.end();) {
      it = it->rfind(e.saga_id + "/", 0) == 0 ? unknown_.erase(it) : std::next(it);
    }
  }

  void ObserveTerminal(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    ObserveTerminalLocked(seconds);
  }

  void Duplicate(const std::string& how) {
    std::lock_guard<std::mutex> lock(mu_);
    ++duplicates_[how];
  }

  void Request(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[status];
  }

  std::string Render(storage::Store* store) {
    std::ostringstream o;
    storage::SagaFilter f;
    f.limit = 100'000'000;
    std::map<std::string, int64_t> by_state;
    for (int s = 0; s <= static_cast<int>(SagaState::kNeedsAttention); ++s) {
      by_state[SagaStateName(static_cast<SagaState>(s))] = 0;
    }
    auto list = store->ListSagas(f);
    bool store_ok = list.ok();
    if (store_ok) {
      for (const auto& s : *list) ++by_state[s.state];
    }
    o << "# HELP idem_store_up Whether the last scrape could read the journal.\n"
      << "# TYPE idem_store_up gauge\nidem_store_up " << (store_ok ? 1 : 0) << "\n";
    if (store_ok) {
      o << "# HELP idem_sagas Sagas in the journal by state.\n# TYPE idem_sagas gauge\n";
      for (const auto& [state, n] : by_state) {
        o << "idem_sagas{state=\"" << state << "\"} " << n << "\n";
      }
      o << "# HELP idem_sagas_needing_attention Sagas parked for a person.\n"
        << "# TYPE idem_sagas_needing_attention gauge\n"
        << "idem_sagas_needing_attention " << by_state["needs_attention"] << "\n";
    }
    std::lock_guard<std::mutex> lock(mu_);
    o << "# HELP idem_step_outcomes_total Step outcomes journaled by this process.\n"
      << "# TYPE idem_step_outcomes_total counter\n";
    for (const char* k : {"succeeded", "failed", "unknown", "needs_attention"}) {
      o << "idem_step_outcomes_total{outcome=\"" << k << "\"} " << Get(steps_, k) << "\n";
    }
    o << "# HELP idem_duplicates_absorbed_total Intent replays answered without a new saga.\n"
      << "# TYPE idem_duplicates_absorbed_total counter\n";
    for (const char* k : {"stored_response", "existing_intent", "in_flight"}) {
      o << "idem_duplicates_absorbed_total{how=\"" << k << "\"} " << Get(duplicates_, k) << "\n";
    }
    o << "# HELP idem_unknown_outcomes_total Tool calls whose outcome was unknown.\n"
      << "# TYPE idem_unknown_outcomes_total counter\n"
      << "idem_unknown_outcomes_total " << unknown_total_ << "\n";
    o << "# HELP idem_unknown_resolved_total How unknown outcomes were resolved.\n"
      << "# TYPE idem_unknown_resolved_total counter\n";
    for (const char* k :
         {"status_lookup", "same_key_retry", "not_applied", "needs_attention", "operator"}) {
      o << "idem_unknown_resolved_total{how=\"" << k << "\"} " << Get(unknown_resolved_, k) << "\n";
    }
    o << "# HELP idem_retries_total Keyed retries of tool calls.\n"
      << "# TYPE idem_retries_total counter\nidem_retries_total " << retries_ << "\n";
    o << "# HELP idem_compensations_total Compensations by outcome.\n"
      << "# TYPE idem_compensations_total counter\n";
    for (const char* k : {"compensated", "failed"}) {
      o << "idem_compensations_total{outcome=\"" << k << "\"} " << Get(compensations_, k) << "\n";
    }
    o << "# HELP idem_saga_time_to_terminal_seconds From submission to a terminal state.\n"
      << "# TYPE idem_saga_time_to_terminal_seconds histogram\n";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += buckets_[i];
      o << "idem_saga_time_to_terminal_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << cumulative
        << "\n";
    }
    o << "idem_saga_time_to_terminal_seconds_bucket{le=\"+Inf\"} " << terminal_count_ << "\n"
      << "idem_saga_time_to_terminal_seconds_sum " << terminal_sum_ << "\n"
      << "idem_saga_time_to_terminal_seconds_count " << terminal_count_ << "\n";
    o << "# HELP idem_http_requests_total HTTP responses by status code.\n"
      << "# TYPE idem_http_requests_total counter\n";
    for (const auto& [code, n] : requests_) {
      o << "idem_http_requests_total{code=\"" << code << "\"} " << n << "\n";
    }
    return o.str();
  }

 private:
  template <typename K>
  static uint64_t Get(const std::map<K, uint64_t>& m, const K& k) {
    auto it = m.find(k);
    return it == m.end() ? 0 : it->second;
  }
  static uint64_t Get(const std::map<std::string, uint64_t>& m, const char* k) {
    return Get(m, std::string(k));
  }
  void ObserveTerminalLocked(double seconds) {
    seconds = std::max(0.0, seconds);
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      if (seconds <= kBuckets[i]) {
        ++buckets_[i];
        break;
      }
    }
    ++terminal_count_;
    terminal_sum_ += seconds;
  }

  std::mutex mu_;
  std::map<std::string, uint64_t> steps_;             // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> duplicates_;        // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> unknown_resolved_;  // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> compensations_;     // GUARDED_BY(mu_)
  std::map<int, uint64_t> requests_;                  // GUARDED_BY(mu_)
  std::set<std::string> unknown_;                     // GUARDED_BY(mu_) "saga/step"
  uint64_t unknown_total_ = 0;
  uint64_t retries_ = 0;
  std::array<uint64_t, kBuckets.size()> buckets_{};
  uint64_t terminal_count_ = 0;
  double terminal_sum_ = 0;
};

}  // namespace

// ---- principals

Result<std::vector<Principal>> ParsePrincipals(const std::string& json_text) {
  auto doc = ParseJson(json_text, "auth", 8);
  if (!doc.ok()) return doc.status();
  if (!doc->is_array()) return Status::InvalidArgument("auth: expected a JSON array");
  std::vector<Principal> out;
  std::set<std::string> names, hashes;
  for (size_t i = 0; i < doc->size(); ++i) {
    const Json& e = (*doc)[i];
    std::string at = "auth[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::InvalidArgument(at + ": expected an object");
    for (const auto& [k, v] : e.items()) {
      if (k != "name" && k != "token_sha256" && k != "roles") {
        return Status::InvalidArgument(at + ": unknown field \"" + PrintableText(k) + "\"");
      }
    }
    Principal p;
    if (!e.contains("name") || !e["name"].is_string() ||
        !ValidName(p.name = e["name"].get<std::string>(), 64)) {
      return Status::InvalidArgument(at + ".name: expected [A-Za-z0-9._-]{1,64}");
    }
    if (!e.contains("token_sha256") || !e["token_sha256"].is_string() ||
        !IsHex64(p.token_sha256 = e["token_sha256"].get<std::string>())) {
      return Status::InvalidArgument(at + ".token_sha256: expected 64 lower-case hex digits");
    }
    if (!e.contains("roles") || !e["roles"].is_array() || e["roles"].empty()) {
      return Status::InvalidArgument(at + ".roles: expected a non-empty array");
    }
    for (size_t r = 0; r < e["roles"].size(); ++r) {
      const Json& role = e["roles"][r];
      if (!role.is_string() || (role != kRoleAgent && role != kRoleApprover)) {
        return Status::InvalidArgument(at + ".roles[" + std::to_string(r) +
                                       "]: expected \"agent\" or \"approver\"");
      }
      p.roles.push_back(role.get<std::string>());
    }
    if (!names.insert(p.name).second) {
      return Status::InvalidArgument(at + ".name: \"" + p.name + "\" appears twice");
    }
    if (!hashes.insert(p.token_sha256).second) {
      return Status::InvalidArgument(at + ".token_sha256: the same token appears twice");
    }
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<Principal>> LoadPrincipals(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": cannot read the auth file");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Status::FailedPrecondition(path + ": group or others may write the auth file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot read the auth file");
  std::stringstream ss;
  ss << in.rdbuf();
  auto out = ParsePrincipals(ss.str());
  if (!out.ok()) return Status::InvalidArgument(path + ": " + out.status().message());
  return out;
}

// ---- the server

struct Server::Impl {
  storage::Store* store;
  const ToolRegistry* tools;
  ServerOptions options;
  Clock* clock;
  std::atomic<bool> stop_flag{false};
  std::unique_ptr<Engine> engine;
  std::unique_ptr<IdempotencyLayer> keys;
  std::unique_ptr<SpecRegistry> specs;
  Metrics metrics;
  httplib::Server http;
  httplib::Server::Handler submit_guarded;
  std::thread http_thread;
  int port = 0;
  bool started = false;
  bool stopped = false;

  // Driving (SQLite): one thread per saga at a time, in this process.
  std::mutex mu;
  std::condition_variable cv;                  // drivers: a saga was queued, or stopping
  std::condition_variable sweep_cv;            // the sweeper: stopping
  std::deque<std::string> queue;               // GUARDED_BY(mu)
  std::set<std::string> queued;                // GUARDED_BY(mu)
  std::set<std::string> driving;               // GUARDED_BY(mu)
  std::map<std::string, std::string> cancels;  // saga -> reason; GUARDED_BY(mu)
  bool stopping = false;                       // GUARDED_BY(mu)
  std::vector<std::thread> drivers;
  std::thread sweeper;
  std::thread work_thread;

  // ---- driving

  void Enqueue(const std::string& id) {
    if (options.use_leases) return;  // Engine::Work claims it
    std::lock_guard<std::mutex> lock(mu);
    if (stopping || queued.count(id) > 0 || driving.count(id) > 0) return;
    queued.insert(id);
    queue.push_back(id);
    cv.notify_one();
  }
  bool BeginDrive(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    return driving.insert(id).second;
  }
  void EndDrive(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    driving.erase(id);
  }

  void DriverLoop() {
    for (;;) {
      std::string id;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        id = queue.front();
        queue.pop_front();
        queued.erase(id);
      }
      if (!BeginDrive(id)) continue;  // driven elsewhere; the sweeper comes back
      auto r = engine->Run(id);
      (void)r;  // the journal says where it stands; the sweeper retries errors
      EndDrive(id);
    }
  }

  void SweepOnce() {
    storage::SagaFilter f;
    f.limit = 1'000'000;
    f.states = {SagaStateName(SagaState::kAwaitingApproval)};
    if (!options.use_leases) {
      f.states.push_back(SagaStateName(SagaState::kPending));
      f.states.push_back(SagaStateName(SagaState::kRunning));
      f.states.push_back(SagaStateName(SagaState::kCompensating));
    }
    auto list = store->ListSagas(f);
    if (!list.ok()) return;
    int64_t now = clock->NowMs();
    for (auto it = list->rbegin(); it != list->rend(); ++it) {  // oldest first
      if (it->state != SagaStateName(SagaState::kAwaitingApproval)) {
        Enqueue(it->saga_id);
        continue;
      }
      // Waiting: only an expired approval has anything to drive.
      auto rec = store->LoadSaga(it->saga_id);
      if (!rec.ok()) continue;
      bool due = false;
      for (const auto& st : rec->steps) {
        if (st.state == StepStateName(StepState::kAwaitingApproval) && st.phase.is_object() &&
            (st.phase.contains("approval") || now >= st.phase.value("expires_ms", int64_t{0}))) {
          due = true;
        }
      }
      if (!due) continue;
      if (options.use_leases) {
        (void)engine->Run(it->saga_id);  // leased: another holder answers kAborted
      } else {
        Enqueue(it->saga_id);
      }
    }
  }

  void SweeperLoop() {
    for (;;) {
      SweepOnce();
      std::unique_lock<std::mutex> lock(mu);
      if (sweep_cv.wait_for(lock, std::chrono::milliseconds(options.sweep_ms),
                            [&] { return stopping; })) {
        return;
      }
    }
  }

  // ---- auth

  // The principal named by the bearer token; nullptr when absent or bad.
  const Principal* Identify(const httplib::Request& req) const {
    static const Principal anonymous{kAnonymous, "", {kRoleAgent, kRoleApprover}};
    if (options.principals.empty()) return &anonymous;  // insecure_no_auth
    const std::string h = req.get_header_value("Authorization");
    if (h.size() < 8 || h.size() > kMaxBearerBytes) return nullptr;
    std::string scheme = h.substr(0, 7);
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (scheme != "bearer ") return nullptr;
    std::string token = h.substr(7);
    while (!token.empty() && token.front() == ' ') token.erase(0, 1);
    if (token.empty()) return nullptr;
    const std::string hash = Sha256Hex(token);
    const Principal* found = nullptr;
    for (const Principal& p : options.principals) {  // every entry: no early exit
      if (CRYPTO_memcmp(p.token_sha256.data(), hash.data(), hash.size()) == 0) found = &p;
    }
    return found;
  }

  // 401 / 403, or the principal.
  const Principal* Authorize(const httplib::Request& req, httplib::Response& res,
                             std::initializer_list<const char*> roles) const {
    const Principal* p = Identify(req);
    if (p == nullptr) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"idem\"");
      Problem(res, 401, "unauthorized", "Unauthorized",
              "a valid bearer token is required (Authorization: Bearer <token>)");
      return nullptr;
    }
    for (const char* role : roles) {
      if (std::find(p->roles.begin(), p->roles.end(), role) != p->roles.end()) return p;
    }
    std::string want;
    for (const char* role : roles) want += (want.empty() ? "" : " or ") + std::string(role);
    Problem(res, 403, "forbidden", "Forbidden", "this operation needs the role " + want);
    return nullptr;
  }

  // ---- bodies

  // The JSON body, or a 400/415 problem. An empty body is `empty`.
  std::optional<Json> ReadBody(const httplib::Request& req, httplib::Response& res,
                               std::optional<Json> empty = std::nullopt) const {
    if (req.body.empty() && empty) return empty;
    if (req.has_header("Content-Type")) {
      std::string ct = req.get_header_value("Content-Type");
      ct = ct.substr(0, ct.find(';'));
      std::transform(ct.begin(), ct.end(), ct.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      while (!ct.empty() && ct.back() == ' ') ct.pop_back();
      if (ct != "application/json" && !(ct.size() > 5 && ct.substr(ct.size() - 5) == "+json")) {
        Problem(res, 415, "unsupported-media-type", "Unsupported media type",
                "send the body as application/json");
        return std::nullopt;
      }
    }
    if (!IsValidUtf8(req.body)) {
      Problem(res, 400, "invalid-utf8", "Body is not UTF-8",
              "the body must be UTF-8 (RFC 8259 section 8.1)");
      return std::nullopt;
    }
    auto doc = ParseJson(req.body, "body", options.max_json_depth);
    if (!doc.ok()) {
      bool deep = doc.status().message().find("nested deeper") != std::string::npos;
      Problem(res, 400, deep ? "json-too-deep" : "malformed-json",
              deep ? "JSON nested too deep" : "Malformed JSON", doc.status().message());
      return std::nullopt;
    }
    return std::move(doc).value();
  }

  // The spec and input of a submission, or a 400/422 problem.
  std::optional<std::pair<SagaSpec, Json>> ReadSubmission(const Json& body,
                                                          httplib::Response& res) const {
    if (!body.is_object()) {
      Problem(res, 400, "invalid-request", "Invalid request", "body: expected a JSON object");
      return std::nullopt;
    }
    for (const auto& [k, v] : body.items()) {
      if (k != "spec" && k != "input") {
        Problem(res, 400, "invalid-request", "Invalid request",
                "body: unknown field \"" + k + "\" (expected spec, input)");
        return std::nullopt;
      }
    }
    if (!body.contains("spec") || !(body["spec"].is_object() || body["spec"].is_string())) {
      Problem(res, 400, "invalid-request", "Invalid request",
              "spec: required, a spec object or the name of a registered spec (\"name\" or "
              "\"name@version\")");
      return std::nullopt;
    }
    Json input = body.value("input", Json::object());
    if (!input.is_object()) {
      Problem(res, 400, "invalid-request", "Invalid request", "input: expected a JSON object");
      return std::nullopt;
    }
    Json doc = body["spec"];
    if (doc.is_string()) {
      std::string ref = doc.get<std::string>();
      std::string name = ref;
      int version = 0;
      size_t at = ref.find('@');
      if (at != std::string::npos) {
        name = ref.substr(0, at);
        try {
          size_t used = 0;
          version = std::stoi(ref.substr(at + 1), &used);
          if (used != ref.size() - at - 1 || version < 1) version = -1;
        } catch (const std::exception&) {
          version = -1;
        }
      }
      auto found = version < 0 ? Result<SpecVersion>(Status::NotFound("bad version"))
                               : specs->Get(name, version);
      if (!found.ok()) {
        if (found.status().code() == Code::kNotFound) {
          Problem(res, 422, "unknown-spec", "Unknown spec",
                  "spec: no registered spec \"" + ref + "\" (PUT /v1/specs/{name} first)");
        } else {
          ProblemFor(res, found.status());
        }
        return std::nullopt;
      }
      doc = found->doc;
    }
    auto spec = ParseSpec(doc, *tools);
    if (!spec.ok()) {
      Problem(res, 422, "invalid-spec", "Invalid saga spec", spec.status().message());
      return std::nullopt;
    }
    return std::make_pair(std::move(spec).value(), std::move(input));
  }

  // The saga if `p` owns it, else a 404 (also for another caller's saga).
  std::optional<SagaRecord> OwnedSaga(const Principal& p, const std::string& id,
                                      httplib::Response& res) const {
    auto rec = store->LoadSaga(id);
    if (!rec.ok() && rec.status().code() != Code::kNotFound) {
      ProblemFor(res, rec.status());
      return std::nullopt;
    }
    if (!rec.ok() || OwnerOf(rec->summary.intent_key) != p.name) {
      Problem(res, 404, "not-found", "Not found", "no saga " + id);
      return std::nullopt;
    }
    return std::move(rec).value();
  }

  void SendSaga(httplib::Response& res, int status, const SagaRecord& rec) const {
    auto effects = store->ListEffects(rec.summary.saga_id);
    if (!effects.ok()) return ProblemFor(res, effects.status());
    SendJson(res, status, SagaView(rec, *effects));
  }

  // ---- handlers

  void PostSaga(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Authorize(req, res, {kRoleAgent});
    if (p == nullptr) return;
    // Validated before the key layer: a malformed request stores nothing.
    auto body = ReadBody(req, res);
    if (!body) return;
    if (!ReadSubmission(*body, res)) return;
    if (req.has_header("Idempotency-Key") &&
        p->name.size() + 1 + IdempotencyKeyOf(req).size() > kMaxIdempotencyKeyLength) {
      Problem(res, 400, "idempotency-key-invalid", "Invalid Idempotency-Key",
              "Idempotency-Key: at most " +
                  std::to_string(kMaxIdempotencyKeyLength - p->name.size() - 1) +
                  " characters for this caller");
      return;
    }
    submit_guarded(req, res);
    if (res.get_header_value("Idempotent-Replayed") == "true") {
      metrics.Duplicate("stored_response");
    } else if (res.status == 409) {
      metrics.Duplicate("in_flight");
    }
  }

  // Runs once per (caller, key), under the key layer.
  void Submit(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Identify(req);
    if (p == nullptr) return Problem(res, 401, "unauthorized", "Unauthorized", "token changed");
    auto body = ReadBody(req, res);
    if (!body) return;
    auto sub = ReadSubmission(*body, res);
    if (!sub) return;
    const std::string key = p->name + ":" + IdempotencyKeyOf(req);
    auto out = engine->Submit(sub->first, sub->second, key);
    if (!out.ok()) {
      if (out.status().code() == Code::kConflict) {
        return Problem(res, 422, "idempotency-key-reused", "Idempotency-Key reused",
                       "this Idempotency-Key was used with another request");
      }
      return ProblemFor(res, out.status());
    }
    if (!out->created) metrics.Duplicate("existing_intent");
    auto rec = store->LoadSaga(out->saga_id);
    if (!rec.ok()) return ProblemFor(res, rec.status());
    res.set_header("Location", "/v1/sagas/" + out->saga_id);
    SendSaga(res, out->created ? 201 : 200, *rec);
    if (!stop_flag.load()) Enqueue(out->saga_id);
  }

  void GetSaga(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Authorize(req, res, {kRoleAgent});
    if (p == nullptr) return;
    auto rec = OwnedSaga(*p, req.matches[1], res);
    if (!rec) return;
    SendSaga(res, 200, *rec);
  }

  void ListSagas(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Authorize(req, res, {kRoleAgent});
    if (p == nullptr) return;
    storage::SagaFilter f;
    if (req.has_param("status")) {
      std::string s = req.get_param_value("status");
      if (!ParseSagaState(s)) {
        return Problem(res, 400, "invalid-request", "Invalid request",
                       "status: unknown saga state \"" + s + "\"");
      }
      f.states.push_back(s);
    }
    int limit = kDefaultListLimit;
    if (req.has_param("limit")) {
      std::string l = req.get_param_value("limit");
      bool digits = !l.empty() && l.size() <= 4 &&
                    std::all_of(l.begin(), l.end(), [](char c) { return c >= '0' && c <= '9'; });
      limit = digits ? std::stoi(l) : -1;
      if (limit < 1 || limit > kMaxListLimit) {
        return Problem(res, 400, "invalid-request", "Invalid request",
                       "limit: expected 1.." + std::to_string(kMaxListLimit));
      }
    }
    f.limit = 100'000'000;
    auto list = store->ListSagas(f);
    if (!list.ok()) return ProblemFor(res, list.status());
    Json sagas = Json::array();
    for (const auto& s : *list) {
      if (OwnerOf(s.intent_key) != p->name) continue;
      sagas.push_back(SummaryView(s));
      if (static_cast<int>(sagas.size()) >= limit) break;
    }
    SendJson(res, 200, {{"sagas", sagas}});
  }

  void Cancel(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Authorize(req, res, {kRoleAgent});
    if (p == nullptr) return;
    const std::string id = req.matches[1];
    if (!OwnedSaga(*p, id, res)) return;
    if (!BeginDrive(id)) {
      // This server is driving it: the driver rolls it back after the step
      // in progress (EngineOptions::cancel_requested).
      {
        std::lock_guard<std::mutex> lock(mu);
        cancels[id] = "cancelled by " + p->name;
      }
      auto rec = store->LoadSaga(id);
      if (!rec.ok()) return ProblemFor(res, rec.status());
      return SendSaga(res, 202, *rec);
    }
    CancelOwned(*p, id, res);
    EndDrive(id);
  }

  std::optional<std::string> CancelRequested(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cancels.find(id);
    if (it == cancels.end()) return std::nullopt;
    std::string why = it->second;
    cancels.erase(it);
    return why;
  }

  void CancelOwned(const Principal& p, const std::string& id, httplib::Response& res) {
    auto rec = store->LoadSaga(id);
    if (!rec.ok()) return ProblemFor(res, rec.status());
    auto state = ParseSagaState(rec->summary.state);
    if (!state) return Problem(res, 500, "internal", "Internal error", "unknown saga state");
    const std::string why = "cancelled by " + p.name;
    switch (*state) {
      case SagaState::kPending: {
        SagaMachine m(SagaState::kPending);
        auto cmds = m.Fire(SagaEvent::kCancelRequested);
        if (!cmds.ok()) return ProblemFor(res, cmds.status());
        storage::WriteBatch b;
        b.saga_id = id;
        b.saga_state = SagaStateName(m.state());
        b.saga_reason = why;
        storage::JournalEntry je;
        je.saga_id = id;
        je.event = std::string("saga_") + SagaStateName(m.state());
        je.data = {{"reason", why}, {"by", p.name}};
        je.at_ms = clock->NowMs();
        b.journal.push_back(je);
        std::optional<storage::Lease> lease;
        if (options.use_leases) {
          auto l = store->ClaimSaga(id, options.owner, options.lease_ms);
          if (!l.ok()) {
            res.set_header("Retry-After", "1");
            return Problem(res, 409, "saga-busy", "Saga is being driven",
                           "another worker holds the saga: " + l.status().message());
          }
          lease = *l;
          b.fence_epoch = l->epoch;
          // Claimed: the state cannot move under us any more; check it again.
          auto again = store->LoadSaga(id);
          if (!again.ok() || again->summary.state != SagaStateName(SagaState::kPending)) {
            (void)store->ReleaseLease(*lease);
            res.set_header("Retry-After", "1");
            return Problem(res, 409, "saga-busy", "Saga is being driven",
                           "the saga left the pending state; ask again");
          }
        }
        Status s = store->Commit(b);
        if (lease) (void)store->ReleaseLease(*lease);
        if (!s.ok()) return ProblemFor(res, s);
        metrics.Observe(je, store);
        auto done = store->LoadSaga(id);
        if (!done.ok()) return ProblemFor(res, done.status());
        return SendSaga(res, 200, *done);
      }
      case SagaState::kAwaitingApproval: {
        // Rolling back a waiting saga is what rejecting its commit does.
        std::string token;
        for (const auto& st : rec->steps) {
          if (st.state == StepStateName(StepState::kAwaitingApproval) && st.phase.is_object()) {
            token = st.phase.value("token", "");
          }
        }
        if (token.empty()) {
          return Problem(res, 409, "cancel-not-possible", "Cannot cancel",
                         "the saga waits, but no step holds a commit token");
        }
        ApprovalDecision d;
        d.approve = false;
        d.who = p.name;
        d.note = why;
        d.expected_saga_id = id;
        auto out = engine->Decide(token, d);
        if (!out.ok()) return ProblemFor(res, out.status());
        return SendSaga(res, 200, *out);
      }
      case SagaState::kRunning: {
        // Not driven by this process right now (a worker elsewhere, or
        // between two drives here): the next drive here rolls it back.
        {
          std::lock_guard<std::mutex> lock(mu);
          cancels[id] = why;
        }
        Enqueue(id);
        return SendSaga(res, 202, *rec);
      }
      case SagaState::kCompensating:
      case SagaState::kCancelled:
        return SendSaga(res, 200, *rec);  // already rolling back, or cancelled
      default:
        return Problem(res, 409, "cancel-not-possible", "Cannot cancel",
                       "the saga is " + rec->summary.state +
                           "; only a pending saga or one awaiting approval can be cancelled");
    }
  }

  void PutSpec(const httplib::Request& req, httplib::Response& res) {
    const Principal* p = Authorize(req, res, {kRoleAgent});
    if (p == nullptr) return;
    const std::string name = req.matches[1];
    auto body = ReadBody(req, res);
    if (!body) return;
    if (!body->is_object()) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "body: expected a spec object");
    }
    Json doc = *body;
    if (!doc.contains("name")) doc["name"] = name;
    if (doc["name"] != name) {
      return Problem(res, 422, "invalid-spec", "Invalid saga spec",
                     "name: the spec is named " + doc["name"].dump() + ", the path " + name);
    }
    if (!doc.contains("version")) {
      auto latest = specs->Get(name, 0);
      if (!latest.ok() && latest.status().code() != Code::kNotFound) {
        return ProblemFor(res, latest.status());
      }
      doc["version"] = latest.ok() ? latest->version + 1 : 1;
    }
    auto spec = ParseSpec(doc, *tools);
    if (!spec.ok())
      return Problem(res, 422, "invalid-spec", "Invalid saga spec", spec.status().message());
    auto put = specs->Put(name, spec->version, doc, p->name);
    if (!put.ok()) {
      if (put.status().code() == Code::kConflict) {
        return Problem(res, 409, "spec-version-exists", "Spec version exists",
                       put.status().message());
      }
      return ProblemFor(res, put.status());
    }
    res.set_header("Location",
                   "/v1/specs/" + name + "?version=" + std::to_string(put->version.version));
    SendJson(res, put->created ? 201 : 200, SpecView(put->version, true));
  }

  static Json SpecView(const SpecVersion& v, bool with_doc) {
    Json out = {{"name", v.name},
                {"version", v.version},
                {"fingerprint", v.fingerprint},
                {"created_at", FormatTimeMs(v.created_ms)},
                {"created_by", v.created_by}};
    if (with_doc) out["spec"] = v.doc;
    return out;
  }

  void ListSpecs(const httplib::Request& req, httplib::Response& res) {
    if (Authorize(req, res, {kRoleAgent, kRoleApprover}) == nullptr) return;
    auto all = specs->List();
    if (!all.ok()) return ProblemFor(res, all.status());
    std::map<std::string, Json> by_name;
    for (const SpecVersion& v : *all) {
      Json& e = by_name[v.name];
      if (e.is_null()) e = {{"name", v.name}, {"latest_version", 0}, {"versions", Json::array()}};
      e["versions"].push_back(SpecView(v, false));
      e["latest_version"] = std::max(e["latest_version"].get<int>(), v.version);
    }
    Json list = Json::array();
    for (auto& [n, e] : by_name) list.push_back(std::move(e));
    SendJson(res, 200, {{"specs", list}});
  }

  void GetSpec(const httplib::Request& req, httplib::Response& res) {
    if (Authorize(req, res, {kRoleAgent, kRoleApprover}) == nullptr) return;
    int version = 0;
    if (req.has_param("version")) {
      std::string v = req.get_param_value("version");
      bool digits = !v.empty() && v.size() <= 9 &&
                    std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
      version = digits ? std::stoi(v) : 0;
      if (version < 1) {
        return Problem(res, 400, "invalid-request", "Invalid request",
                       "version: expected a positive integer");
      }
    }
    auto found = specs->Get(req.matches[1], version);
    if (!found.ok()) return ProblemFor(res, found.status());
    SendJson(res, 200, SpecView(*found, true));
  }

  void ListApprovals(const httplib::Request& req, httplib::Response& res) {
    if (Authorize(req, res, {kRoleApprover}) == nullptr) return;
    storage::SagaFilter f;
    f.states = {SagaStateName(SagaState::kAwaitingApproval)};
    f.limit = 100'000;
    auto list = store->ListSagas(f);
    if (!list.ok()) return ProblemFor(res, list.status());
    Json out = Json::array();
    for (const auto& sum : *list) {
      auto rec = store->LoadSaga(sum.saga_id);
      if (!rec.ok()) return ProblemFor(res, rec.status());
      for (const auto& st : rec->steps) {
        auto view = ApprovalView(sum.saga_id, st);
        if (!view) continue;
        (*view)["requested_by"] = OwnerOf(sum.intent_key);
        (*view)["spec"] = sum.spec_name;
        out.push_back(std::move(*view));
      }
    }
    SendJson(res, 200, {{"approvals", out}});
  }

  // Token errors: forged and tampered 403 (one answer for all), expired or
  // mis-bound 403 with their own types, a step no longer waiting 409.
  void TokenProblem(httplib::Response& res, const Status& s) {
    const std::string& m = s.message();
    if (s.code() == Code::kInvalidArgument && m == preview_commit::kInvalidTokenMessage) {
      return Problem(res, 403, "invalid-commit-token", "Invalid commit token", m);
    }
    if (s.code() == Code::kFailedPrecondition) {
      if (m == preview_commit::kExpiredTokenMessage) {
        return Problem(res, 403, "commit-token-expired", "Commit token expired", m);
      }
      if (m == preview_commit::kMismatchedTokenMessage ||
          m == preview_commit::kNotYetValidTokenMessage) {
        return Problem(res, 403, "commit-token-mismatch", "Commit token refused", m);
      }
      return Problem(res, 409, "approval-not-pending", "Approval not pending", m);
    }
    ProblemFor(res, s);
  }

  void Decide(const httplib::Request& req, httplib::Response& res, bool approve) {
    const Principal* p = Authorize(req, res, {kRoleApprover});
    if (p == nullptr) return;
    auto body = ReadBody(req, res, Json::object());
    if (!body) return;
    const char* field = approve ? "note" : "reason";
    if (!body->is_object()) {
      return Problem(res, 400, "invalid-request", "Invalid request", "body: expected an object");
    }
    for (const auto& [k, v] : body->items()) {
      if (k != field || !v.is_string()) {
        return Problem(res, 400, "invalid-request", "Invalid request",
                       std::string("body: expected {\"") + field + "\": \"...\"}");
      }
    }
    const std::string note = body->value(field, "");
    if (!approve && note.empty()) {
      return Problem(res, 400, "invalid-request", "Invalid request",
                     "reason: required to reject a commit");
    }
    if (options.signer == nullptr) {
      return Problem(res, 503, "approvals-unavailable", "Approvals unavailable",
                     "the server has no commit-token keys");
    }
    const std::string token = req.matches[1];
    auto claims = options.signer->Open(token);
    if (!claims.ok()) return TokenProblem(res, claims.status());
    auto rec = store->LoadSaga(claims->saga_id);
    if (!rec.ok()) return TokenProblem(res, rec.status());
    if (!options.principals.empty() && OwnerOf(rec->summary.intent_key) == p->name) {
      return Problem(res, 403, "self-approval", "Forbidden",
                     "a caller cannot decide on a commit of its own saga");
    }
    if (!BeginDrive(claims->saga_id)) {
      res.set_header("Retry-After", "1");
      return Problem(res, 409, "saga-busy", "Saga is being driven",
                     "the saga is busy; decide again in a moment");
    }
    ApprovalDecision d;
    d.approve = approve;
    d.who = p->name;
    d.note = note;
    auto out = engine->Decide(token, d);
    EndDrive(claims->saga_id);
    if (!out.ok()) return TokenProblem(res, out.status());
    SendSaga(res, 200, *out);
  }

  // ---- wiring

  using Fn = void (Impl::*)(const httplib::Request&, httplib::Response&);
  httplib::Server::Handler H(Fn fn) {
    return
        [this, fn](const httplib::Request& req, httplib::Response& res) { (this->*fn)(req, res); };
  }

  void Routes() {
    http.Post("/v1/sagas", H(&Impl::PostSaga));
    http.Get("/v1/sagas", H(&Impl::ListSagas));
    http.Get(R"(/v1/sagas/([A-Za-z0-9_-]{1,128}))", H(&Impl::GetSaga));
    http.Post(R"(/v1/sagas/([A-Za-z0-9_-]{1,128})/cancel)", H(&Impl::Cancel));
    http.Put(R"(/v1/specs/([a-z0-9_.-]{1,64}))", H(&Impl::PutSpec));
    http.Get("/v1/specs", H(&Impl::ListSpecs));
    http.Get(R"(/v1/specs/([a-z0-9_.-]{1,64}))", H(&Impl::GetSpec));
    http.Get("/v1/approvals", H(&Impl::ListApprovals));
    http.Post(
        R"(/v1/approvals/([A-Za-z0-9_.-]{1,1024})/approve)",
        [this](const httplib::Request& req, httplib::Response& res) { Decide(req, res, true); });
    http.Post(
        R"(/v1/approvals/([A-Za-z0-9_.-]{1,1024})/reject)",
        [this](const httplib::Request& req, httplib::Response& res) { Decide(req, res, false); });
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      SendJson(res, 200, {{"status", "ok"}});
    });
    http.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      storage::SagaFilter f;
      f.limit = 1;
      auto list = store->ListSagas(f);
      if (!list.ok()) {
        res.set_header("Retry-After", "1");
        return Problem(res, 503, "not-ready", "Not ready",
                       "the store is not reachable: " + list.status().message());
      }
      if (stop_flag.load()) {
        return Problem(res, 503, "not-ready", "Not ready", "the server is stopping");
      }
      SendJson(res, 200, {{"status", "ready"}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.Render(store), "text/plain; version=0.0.4; charset=utf-8");
    });
    // Errors httplib answers itself (404 route, 413 body, 400 request line).
    http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&,
                                                                   httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      switch (res.status) {
        case 404:
          Problem(res, 404, "not-found", "Not found", "no such endpoint");
          break;
        case 413:
          Problem(res, 413, "payload-too-large", "Payload too large",
                  "the body exceeds the server's limit");
          break;
        case 414:
          Problem(res, 414, "uri-too-long", "URI too long", "the request target is too long");
          break;
        case 405:
          Problem(res, 405, "method-not-allowed", "Method not allowed", "not allowed here");
          break;
        default:
          Problem(res, res.status, "bad-request", "Bad request", "the request could not be read");
      }
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unexpected error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          Problem(res, 500, "internal", "Internal error", what);
        });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      metrics.Request(res.status);
    });
  }
};

Result<std::unique_ptr<Server>> Server::Create(storage::Store* store, const ToolRegistry* tools,
                                               ServerOptions options) {
  if (store == nullptr || tools == nullptr) {
    return Status::InvalidArgument("server: a store and a tool registry are required");
  }
  if (options.principals.empty()) {
    if (!options.insecure_no_auth) {
      return Status::FailedPrecondition(
          "server: no --auth file; refusing to serve without authentication (pass "
          "--insecure-no-auth to serve on loopback without it)");
    }
    if (!IsLoopback(options.host)) {
      return Status::FailedPrecondition(
          "server: --insecure-no-auth is allowed on loopback only, "
          "not on " +
          options.host);
    }
  }
  if (options.workers < 1 || options.workers > 256) {
    return Status::InvalidArgument("server: workers must be 1..256");
  }
  if (options.port < 0 || options.port > 65535) {
    return Status::InvalidArgument("server: port must be 0..65535");
  }
  if (options.state_path.empty()) {
    return Status::InvalidArgument("server: a state file (keys, specs) is required");
  }
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->tools = tools;
  impl->clock = options.clock != nullptr ? options.clock : SystemClock::Get();
  if (options.owner.empty()) options.owner = NewId("srv_");
  impl->options = std::move(options);
  IdempotencyOptions io;
  io.ttl_ms = impl->options.idempotency_ttl_ms;
  io.clock = impl->clock;
  auto keys = IdempotencyLayer::Open(impl->options.state_path, io);
  if (!keys.ok()) return keys.status();
  impl->keys = std::move(keys).value();
  auto specs = SpecRegistry::Open(impl->options.state_path, impl->clock);
  if (!specs.ok()) return specs.status();
  impl->specs = std::move(specs).value();

  EngineOptions eo;
  eo.clock = impl->clock;
  eo.signer = impl->options.signer;
  eo.use_leases = impl->options.use_leases;
  eo.owner = impl->options.owner;
  eo.lease_ms = impl->options.lease_ms;
  eo.stop = &impl->stop_flag;
  Impl* raw = impl.get();
  eo.cancel_requested = [raw](const std::string& id) { return raw->CancelRequested(id); };
  eo.observer = observability::WithJournalLog(
      [raw](const storage::JournalEntry& e) { raw->metrics.Observe(e, raw->store); });
  impl->engine = std::make_unique<Engine>(store, tools, eo);

  WrapOptions wo;
  wo.key_required = true;
  wo.scope = [raw](const httplib::Request& req) {
    const Principal* p = raw->Identify(req);
    return p == nullptr ? std::string() : p->name;
  };
  impl->submit_guarded = impl->keys->Wrap(
      [raw](const httplib::Request& req, httplib::Response& res) { raw->Submit(req, res); }, wo);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

int Server::port() const { return impl_->port; }

Status Server::Start() {
  Impl& s = *impl_;
  if (s.started) return Status::FailedPrecondition("server: already started");
  const ServerOptions& o = s.options;
  s.Routes();
  s.http.set_payload_max_length(o.max_body_bytes);
  s.http.set_read_timeout(o.read_timeout_s, 0);
  s.http.set_write_timeout(o.write_timeout_s, 0);
  s.http.set_keep_alive_timeout(o.keep_alive_timeout_s);
  s.http.set_keep_alive_max_count(static_cast<size_t>(o.keep_alive_max_count));
  int threads = o.http_threads;
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // cpp-httplib listens with a backlog of 5 (compiled in): a burst of
  // clients would overflow it and see resets. Keep the socket, listen again.
  std::atomic<int> listen_fd{-1};
  s.http.set_socket_options([&listen_fd](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = fd;
  });
  if (o.port == 0) {
    s.port = s.http.bind_to_any_port(o.host);
  } else {
    s.port = s.http.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (s.port > 0 && listen_fd >= 0) (void)::listen(listen_fd, kListenBacklog);
  if (s.port <= 0) {
    return Status::Unavailable("server: cannot listen on " + o.host + ":" + std::to_string(o.port));
  }
  s.started = true;
  if (o.use_leases) {
    s.work_thread = std::thread([&s] {
      WorkerOptions wo;
      wo.concurrency = s.options.workers;
      wo.poll_ms = s.options.poll_ms;
      (void)s.engine->Work(wo);
    });
  } else {
    for (int i = 0; i < o.workers; ++i) s.drivers.emplace_back([&s] { s.DriverLoop(); });
  }
  s.sweeper = std::thread([&s] { s.SweeperLoop(); });
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  for (int i = 0; i < 5000 && !s.http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::Ok();
}

void Server::Stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.stop_flag.store(true);  // drives stop between steps
  for (int i = 0; i < 5000 && s.http_thread.joinable() && !s.http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // stop() needs a running loop
  }
  s.http.stop();
  if (s.http_thread.joinable()) s.http_thread.join();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  s.sweep_cv.notify_all();
  for (auto& t : s.drivers) t.join();
  if (s.sweeper.joinable()) s.sweeper.join();
  if (s.work_thread.joinable()) s.work_thread.join();
}

}  // namespace idem::server
