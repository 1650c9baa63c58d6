#include "server/idempotency.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <exception>
#include <utility>

#include "storage/sqlite_store.h"
#include "storage/store.h"

#include "common/json_util.h"

namespace idem::server {
namespace {

// The synchronous modes the layer accepts (OFF loses a stored response).
constexpr std::array<const char*, 3> kSyncModes = {"NORMAL", "FULL", "EXTRA"};

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string Quote(const std::string& s) { return "\"" + PrintableText(s) + "\""; }

// ---- Requests ------------------------------------------------------------------

void Problem(IdempotentResponse& res, int status, const char* type, const std::string& title,
             const std::string& detail) {
  Json doc = {{"type", type}, {"title", title}, {"status", status}, {"detail", detail}};
  res = IdempotentResponse();
  res.status = status;
  res.content_type = "application/problem+json";
  res.body = doc.dump();
}

// The key from the header value: an RFC 8941 sf-string is unescaped, any
// other value is taken as sent. Every byte must be printable ASCII.
Result<std::string> ParseKey(const std::string& value) {
  std::string key;
  if (!value.empty() && value.front() == '"') {
    bool closed = false;
    for (size_t i = 1; i < value.size(); ++i) {
      char c = value[i];
      if (c == '\\') {
        if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
          return Status::InvalidArgument(
              "the Idempotency-Key is a malformed sf-string (bad escape)");
        }
        key.push_back(value[++i]);
      } else if (c == '"') {
        if (i + 1 != value.size()) {
          return Status::InvalidArgument(
              "the Idempotency-Key is a malformed sf-string (text after the closing quote)");
        }
        closed = true;
      } else {
        key.push_back(c);
      }
    }
    if (!closed) {
      return Status::InvalidArgument(
          "the Idempotency-Key is a malformed sf-string (no closing quote)");
    }
  } else {
    key = value;
  }
  if (key.empty()) return Status::InvalidArgument("the Idempotency-Key is empty");
  if (key.size() > kMaxIdempotencyKeyLength) {
    return Status::InvalidArgument("the Idempotency-Key is longer than " +
                                   std::to_string(kMaxIdempotencyKeyLength) + " characters");
  }
  for (char c : key) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      return Status::InvalidArgument(
          "the Idempotency-Key holds a control character or a byte outside printable ASCII");
    }
  }
  return key;
}

// Method, path, sorted query parameters and the body (canonical JSON when it
// parses, raw bytes otherwise).
std::string RequestFingerprint(const IdempotentRequest& req) {
  std::vector<std::pair<std::string, std::string>> params(req.params.begin(), req.params.end());
  std::sort(params.begin(), params.end());
  std::string text = req.method;
  text.append("\n").append(std::to_string(req.path.size())).append(":").append(req.path);
  text.append("\n");
  for (const auto& [k, v] : params) {  // length-prefixed: no two lists encode alike
    text.append(std::to_string(k.size())).append(":").append(k);
    text.append("=").append(std::to_string(v.size())).append(":").append(v).append("&");
  }
  text += "\n";
  Result<Json> doc = req.body.empty() ? Result<Json>(Status::InvalidArgument("empty"))
                                      : ParseJson(req.body, "body", 64);
  if (doc.ok()) {
    text += "json:" + CanonicalJson(*doc);
  } else {
    text += "raw:" + req.body;
  }
  return "sha256:" + Sha256Hex(text);
}

}  // namespace

// ---- Opening -------------------------------------------------------------------

namespace {

Status CheckOptions(const std::string& op, const IdempotencyOptions& options) {
  if (options.lock_timeout_ms < 1) {
    return Status::InvalidArgument(op + ": lock_timeout_ms must be >= 1");
  }
  if (options.ttl_ms < options.lock_timeout_ms) {
    return Status::InvalidArgument(op + ": ttl_ms must be >= lock_timeout_ms");
  }
  if (options.retry_after_s < 0 || options.busy_timeout_ms < 0) {
    return Status::InvalidArgument(op + ": retry_after_s and busy_timeout_ms must be >= 0");
  }
  return Status::Ok();
}

}  // namespace

IdempotencyLayer::IdempotencyLayer(std::unique_ptr<storage::Store> owned,
                                   storage::KeyRecordStore* records, IdempotencyOptions options)
    : owned_(std::move(owned)),
      records_(records),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : SystemClock::Get()) {
  renewer_ = std::thread([this] { RenewLoop(); });
}

IdempotencyLayer::~IdempotencyLayer() {
  {
    std::lock_guard<std::mutex> lock(renew_mu_);
    stop_ = true;
  }
  renew_cv_.notify_all();
  renewer_.join();
}

uint64_t IdempotencyLayer::Hold(storage::KeyLease lease) {
  std::lock_guard<std::mutex> lock(renew_mu_);
  const uint64_t id = next_id_++;
  live_.emplace(id, std::move(lease));
  return id;
}

void IdempotencyLayer::Drop(uint64_t id) {
  std::lock_guard<std::mutex> lock(renew_mu_);
  live_.erase(id);
}

void IdempotencyLayer::RenewLoop() {
  const auto interval =
      std::chrono::milliseconds(std::max<int64_t>(1, options_.lock_timeout_ms / 3));
  std::unique_lock<std::mutex> lock(renew_mu_);
  while (!renew_cv_.wait_for(lock, interval, [this] { return stop_; })) {
    if (live_.empty()) continue;
    std::vector<uint64_t> ids;
    std::vector<storage::KeyLease> leases;
    for (const auto& [id, lease] : live_) {
      ids.push_back(id);
      leases.push_back(lease);
    }
    lock.unlock();
    // A failed tick is retried at the next. A claim lost (taken over while
    // this holder stalled) is renewed no more; its CompleteKey is fenced.
    Result<std::vector<size_t>> lost = records_->RenewKeys(leases, clock_->NowMs());
    lock.lock();
    if (lost.ok()) {
      for (size_t i : *lost) live_.erase(ids[i]);
    }
  }
}

Result<std::unique_ptr<IdempotencyLayer>> IdempotencyLayer::Open(const std::string& sqlite_path,
                                                                 IdempotencyOptions options) {
  const std::string op = "open idempotency store " + Quote(sqlite_path);
  if (sqlite_path.empty() || sqlite_path == ":memory:") {
    return Status::InvalidArgument(op + ": give a database file path");
  }
  IDEM_RETURN_IF_ERROR(CheckOptions(op, options));
  const char* sync = nullptr;
  for (const char* m : kSyncModes) {
    if (Upper(options.synchronous) == m) sync = m;
  }
  if (sync == nullptr) {
    return Status::InvalidArgument(op + ": synchronous " + Quote(options.synchronous) +
                                   " is not one of NORMAL, FULL, EXTRA");
  }
  storage::SqliteOptions so;
  so.path = sqlite_path;
  so.synchronous = sync;
  so.busy_timeout_ms = options.busy_timeout_ms;
  so.clock = options.clock;
  Result<std::unique_ptr<storage::SqliteStore>> store = storage::SqliteStore::Open(so);
  if (!store.ok()) {
    return Status(store.status().code(), op + ": " + store.status().message());
  }
  storage::KeyRecordStore* records = (*store)->KeyRecords();
  return std::unique_ptr<IdempotencyLayer>(
      new IdempotencyLayer(std::move(store).value(), records, std::move(options)));
}

Result<std::unique_ptr<IdempotencyLayer>> IdempotencyLayer::Create(storage::KeyRecordStore* records,
                                                                   IdempotencyOptions options) {
  const std::string op = "idempotency layer";
  if (records == nullptr) return Status::InvalidArgument(op + ": no key record store");
  IDEM_RETURN_IF_ERROR(CheckOptions(op, options));
  return std::unique_ptr<IdempotencyLayer>(
      new IdempotencyLayer(nullptr, records, std::move(options)));
}

Result<IdempotencyRecord> IdempotencyLayer::Find(const std::string& scope_text,
                                                 const std::string& key) {
  return records_->FindKey(Sha256Hex(scope_text), key);
}

Result<int64_t> IdempotencyLayer::PurgeExpired() {
  return records_->PurgeKeys(clock_->NowMs() - options_.ttl_ms);
}

// ---- Serving -------------------------------------------------------------------

httplib::Server::Handler IdempotencyLayer::Wrap(httplib::Server::Handler handler,
                                                WrapOptions options) {
  // A thin shim over Run: the handler writes the httplib response itself
  // (every header, a content provider), and Run sees its status,
  // Content-Type and body.
  return [this, handler = std::move(handler), options = std::move(options)](
             const httplib::Request& req, httplib::Response& res) {
    IdempotentRequest in;
    in.method = req.method;
    in.path = req.path;
    in.params.insert(req.params.begin(), req.params.end());
    const size_t count = req.get_header_value_count("Idempotency-Key");
    for (size_t i = 0; i < count; ++i) {
      in.keys.push_back(req.get_header_value("Idempotency-Key", i));
    }
    if (options.scope) {
      in.scope = options.scope(req);
    } else if (!options.scope_header.empty()) {
      in.scope = req.get_header_value(options.scope_header);
    }
    in.body = req.body;
    bool handled = false;  // the handler ran and returned: `res` is its answer
    IdempotentResponse out;
    Run(
        in,
        [&](IdempotentResponse& r) {
          handler(req, res);
          if (res.status == -1) res.status = 200;  // what httplib sends for an unset status
          handled = true;
          r.status = res.status;
          r.content_type = res.get_header_value("Content-Type");
          r.body = res.body;
        },
        options.key_required, options.released_statuses, out);
    if (handled) return;
    res = httplib::Response();
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (out.content_type.empty()) {
      res.body = out.body;
    } else {
      res.set_content(out.body, out.content_type);
    }
  };
}

void IdempotencyLayer::Run(const IdempotentRequest& req,
                           const std::function<void(IdempotentResponse&)>& handler,
                           bool key_required, const std::vector<int>& released_statuses,
                           IdempotentResponse& res) {
  const size_t count = req.keys.size();
  if (count == 0) {
    if (!key_required) {
      handler(res);
      return;
    }
    Problem(res, 400, kProblemKeyMissing, "Idempotency-Key is missing",
            "this operation requires an Idempotency-Key header");
    return;
  }
  if (count > 1) {
    Problem(res, 400, kProblemKeyInvalid, "Idempotency-Key is invalid",
            "send exactly one Idempotency-Key header");
    return;
  }
  Result<std::string> key = ParseKey(req.keys.front());
  if (!key.ok()) {
    Problem(res, 400, kProblemKeyInvalid, "Idempotency-Key is invalid", key.status().message());
    return;
  }
  const std::string scope = Sha256Hex(req.scope);
  const std::string retry_after = std::to_string(options_.retry_after_s);

  storage::KeyClaimPolicy policy;
  policy.now_ms = clock_->NowMs();
  policy.lock_timeout_ms = options_.lock_timeout_ms;
  policy.ttl_ms = options_.ttl_ms;
  Result<storage::KeyClaim> claim =
      records_->ClaimKey(scope, *key, RequestFingerprint(req), policy);
  if (!claim.ok()) {
    Problem(res, 503, kProblemUnavailable, "Idempotency store unavailable",
            "the request was not processed; retry later");
    res.headers.emplace_back("Retry-After", retry_after);
    return;
  }
  switch (claim->kind) {
    case storage::KeyClaim::Kind::kMismatch:
      Problem(res, 422, kProblemKeyReused, "Idempotency-Key is already used",
              "this key was used with another request payload; use a new key for a new request");
      return;
    case storage::KeyClaim::Kind::kInFlight:
      Problem(res, 409, kProblemKeyInFlight, "A request is outstanding for this Idempotency-Key",
              "the first request with this key is still being processed; retry later");
      res.headers.emplace_back("Retry-After", retry_after);
      return;
    case storage::KeyClaim::Kind::kReplay: {
      const IdempotencyRecord& r = claim->stored;
      res = IdempotentResponse();
      res.status = r.status;
      res.content_type = r.content_type;
      res.body = r.body;
      res.headers.emplace_back("Idempotent-Replayed", "true");
      return;
    }
    case storage::KeyClaim::Kind::kClaimed:
      break;
  }

  // Execution begins: from here on the response is stored (the Stripe rule).
  // The renewer keeps the claim alive while the handler runs.
  const uint64_t held = Hold(storage::KeyLease{scope, *key, claim->token});
  try {
    handler(res);
  } catch (...) {
    Problem(res, 500, kProblemHandlerFailed, "The handler failed", "the request failed");
  }
  Drop(held);
  const auto& released = released_statuses;
  if (std::find(released.begin(), released.end(), res.status) != released.end()) {
    (void)records_->ReleaseKey(scope, *key,
                               claim->token);  // a failed release expires with the lock timeout
    return;
  }
  // A failure here leaves the claim in flight, no longer renewed: retries get
  // 409 until the lock timeout, then take it over. A fenced claim (taken over after
  // the lock timeout) keeps the newer holder's response.
  (void)records_->CompleteKey(scope, *key, claim->token, res.status, res.content_type, res.body);
}

}  // namespace idem::server
