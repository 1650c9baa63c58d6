#include "examples/travel_booking/providers.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <sqlite3.h>

#include "common/clock.h"
#include "common/failpoint.h"
#include <SQLiteCpp/SQLiteCpp.h>

namespace idem::travel {
namespace {

constexpr int kBusyTimeoutMs = 10'000;
/// idem calls a compensation with the key of its action plus this suffix.
constexpr const char* kCompensateSuffix = ":compensate";
constexpr const char* kNullCompensated = "null_compensated";

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS effects(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  provider TEXT NOT NULL,
  operation TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  applied_at TEXT NOT NULL,
  args TEXT NOT NULL,
  result TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS effects_by_key ON effects(provider, operation, idempotency_key);
CREATE TABLE IF NOT EXISTS calls(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  provider TEXT NOT NULL,
  operation TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  at TEXT NOT NULL,
  outcome TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS calls_by_key ON calls(provider, operation, idempotency_key);
CREATE TABLE IF NOT EXISTS barriers(
  provider TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  op TEXT NOT NULL,
  PRIMARY KEY(provider, idempotency_key, op));
CREATE TABLE IF NOT EXISTS versions(
  provider TEXT NOT NULL,
  resource TEXT NOT NULL,
  version INTEGER NOT NULL,
  PRIMARY KEY(provider, resource));
CREATE TABLE IF NOT EXISTS acceptances(
  provider TEXT NOT NULL,
  operation TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  args TEXT NOT NULL,
  job_id TEXT NOT NULL,
  accepted_ms INTEGER NOT NULL,
  ready_ms INTEGER NOT NULL,
  outcome TEXT NOT NULL,
  PRIMARY KEY(provider, operation, idempotency_key));
)sql";

Status FromSqlite(const SQLite::Exception& e, const std::string& what) {
  int code = e.getErrorCode() & 0xff;
  std::string message = "ledger: " + what + ": " + e.what();
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) return Status::Unavailable(message);
  return Status::Internal(message);
}

std::string NowText() { return FormatTimeMs(SystemClock::Get()->NowMs()); }

/// Splits "flights.reserve" into ("flights", "reserve").
std::pair<std::string, std::string> SplitTool(const std::string& tool) {
  auto dot = tool.find('.');
  if (dot == std::string::npos) return {tool, ""};
  return {tool.substr(0, dot), tool.substr(dot + 1)};
}

/// The version of a resource; 1 when it has no row. Caller holds the mutex.
int64_t ReadVersion(SQLite::Database& db, const std::string& provider,
                    const std::string& resource) {
  SQLite::Statement q(db, "SELECT version FROM versions WHERE provider = ? AND resource = ?");
  q.bind(1, provider);
  q.bind(2, resource);
  if (!q.executeStep()) return 1;
  return q.getColumn(0).getInt64();
}

/// Moves a resource to its next version and answers it. Caller holds the
/// mutex (and, for atomicity with other statements, a transaction).
int64_t BumpVersionIn(SQLite::Database& db, const std::string& provider,
                      const std::string& resource) {
  SQLite::Statement insert(db,
                           "INSERT OR IGNORE INTO versions(provider, resource, version) "
                           "VALUES (?, ?, 1)");
  insert.bind(1, provider);
  insert.bind(2, resource);
  insert.exec();
  SQLite::Statement update(db,
                           "UPDATE versions SET version = version + 1 "
                           "WHERE provider = ? AND resource = ?");
  update.bind(1, provider);
  update.bind(2, resource);
  update.exec();
  return ReadVersion(db, provider, resource);
}

std::string VersionText(int64_t version) { return "v" + std::to_string(version); }

bool ParseInt(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  *out = std::stoi(text);
  return true;
}

}  // namespace

// ---- the ledger

struct Ledger::Impl {
  std::string path;
  std::mutex mu;
  std::unique_ptr<SQLite::Database> db;  // guarded by mu
};

/// The providers' side of the ledger: what the tools below may touch.
class LedgerAccess {
 public:
  using Impl = Ledger::Impl;
  static Impl& Of(Ledger& ledger) { return *ledger.impl_; }
};

Ledger::Ledger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Ledger::~Ledger() = default;

const std::string& Ledger::path() const { return impl_->path; }

Result<std::shared_ptr<Ledger>> Ledger::Open(const std::string& path, bool create) {
  if (path.empty()) return Status::InvalidArgument("ledger: empty path");
  std::error_code ec;
  if (!create && !std::filesystem::exists(path, ec)) {
    return Status::NotFound("ledger: no ledger at " + path);
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  // Processes opening a new ledger at once race to switch it to WAL, and
  // SQLite answers the losers "database is locked" without waiting: retry.
  for (int attempt = 0;; ++attempt) {
    try {
      int flags = SQLite::OPEN_READWRITE | (create ? SQLite::OPEN_CREATE : 0);
      impl->db = std::make_unique<SQLite::Database>(path, flags, kBusyTimeoutMs);
      impl->db->exec("PRAGMA journal_mode=WAL");
      impl->db->exec("PRAGMA synchronous=FULL");
      impl->db->exec(kSchema);
      break;
    } catch (const SQLite::Exception& e) {
      int code = e.getErrorCode() & 0xff;
      if ((code != SQLITE_BUSY && code != SQLITE_LOCKED) || attempt >= 100) {
        return FromSqlite(e, "open " + path);
      }
      impl->db.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(10 + 5 * attempt));
    }
  }
  return std::shared_ptr<Ledger>(new Ledger(std::move(impl)));
}

Result<std::vector<LedgerEffect>> Ledger::Effects() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT id, provider, operation, idempotency_key, applied_at, args, result "
                        "FROM effects ORDER BY id");
    std::vector<LedgerEffect> out;
    while (q.executeStep()) {
      LedgerEffect e;
      e.id = q.getColumn(0).getInt64();
      e.provider = q.getColumn(1).getString();
      e.operation = q.getColumn(2).getString();
      e.idempotency_key = q.getColumn(3).getString();
      e.applied_at = q.getColumn(4).getString();
      e.args = Json::parse(q.getColumn(5).getString(), nullptr, /*allow_exceptions=*/false);
      e.result = Json::parse(q.getColumn(6).getString(), nullptr, /*allow_exceptions=*/false);
      out.push_back(std::move(e));
    }
    return out;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "read effects");
  }
}

Result<std::vector<LedgerCall>> Ledger::Calls() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT id, provider, operation, idempotency_key, at, outcome "
                        "FROM calls ORDER BY id");
    std::vector<LedgerCall> out;
    while (q.executeStep()) {
      LedgerCall c;
      c.id = q.getColumn(0).getInt64();
      c.provider = q.getColumn(1).getString();
      c.operation = q.getColumn(2).getString();
      c.idempotency_key = q.getColumn(3).getString();
      c.at = q.getColumn(4).getString();
      c.outcome = q.getColumn(5).getString();
      out.push_back(std::move(c));
    }
    return out;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "read calls");
  }
}

Result<std::vector<LedgerJob>> Ledger::Jobs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT provider, operation, idempotency_key, job_id, outcome "
                        "FROM acceptances ORDER BY provider, operation, idempotency_key");
    std::vector<LedgerJob> out;
    while (q.executeStep()) {
      LedgerJob j;
      j.provider = q.getColumn(0).getString();
      j.operation = q.getColumn(1).getString();
      j.idempotency_key = q.getColumn(2).getString();
      j.job_id = q.getColumn(3).getString();
      j.outcome = q.getColumn(4).getString();
      out.push_back(std::move(j));
    }
    return out;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "ledger jobs");
  }
}

Result<int> Ledger::CountEffects(const std::string& key) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db, "SELECT COUNT(*) FROM effects WHERE idempotency_key = ?");
    q.bind(1, key);
    q.executeStep();
    return q.getColumn(0).getInt();
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "count effects");
  }
}

namespace {

/// Rows of `table` (effects or calls) for one provider operation and key.
Result<int> CountRowsFor(LedgerAccess::Impl& impl, const char* table, const std::string& tool,
                         const std::string& key) {
  auto [provider, operation] = SplitTool(tool);
  std::lock_guard<std::mutex> lock(impl.mu);
  try {
    SQLite::Statement q(*impl.db,
                        std::string("SELECT COUNT(*) FROM ") + table +
                            " WHERE provider = ? AND operation = ? AND idempotency_key = ?");
    q.bind(1, provider);
    q.bind(2, operation);
    q.bind(3, key);
    q.executeStep();
    return q.getColumn(0).getInt();
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, std::string("count ") + table);
  }
}

}  // namespace

Result<int> Ledger::CountEffects(const std::string& tool, const std::string& key) const {
  return CountRowsFor(*impl_, "effects", tool, key);
}

Result<int> Ledger::CountCalls(const std::string& tool, const std::string& key) const {
  return CountRowsFor(*impl_, "calls", tool, key);
}

Result<bool> Ledger::IsBarred(const std::string& provider, const std::string& key) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT COUNT(*) FROM barriers "
                        "WHERE provider = ? AND idempotency_key = ? AND op = ?");
    q.bind(1, provider);
    q.bind(2, key);
    q.bind(3, kNullCompensated);
    q.executeStep();
    return q.getColumn(0).getInt() > 0;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "read barriers");
  }
}

Result<std::vector<DuplicateEffect>> Ledger::Duplicates() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT provider, operation, idempotency_key, COUNT(*) FROM effects "
                        "GROUP BY provider, operation, idempotency_key HAVING COUNT(*) > 1 "
                        "ORDER BY MIN(id)");
    std::vector<DuplicateEffect> out;
    while (q.executeStep()) {
      DuplicateEffect d;
      d.provider = q.getColumn(0).getString();
      d.operation = q.getColumn(1).getString();
      d.idempotency_key = q.getColumn(2).getString();
      d.count = q.getColumn(3).getInt();
      out.push_back(std::move(d));
    }
    return out;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "find duplicates");
  }
}

Result<std::string> Ledger::ResourceVersion(const std::string& provider,
                                            const std::string& resource) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    return VersionText(ReadVersion(*impl_->db, provider, resource));
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "read version");
  }
}

Result<std::string> Ledger::BumpVersion(const std::string& provider, const std::string& resource) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Transaction tx(*impl_->db, SQLite::TransactionBehavior::IMMEDIATE);
    int64_t version = BumpVersionIn(*impl_->db, provider, resource);
    tx.commit();
    return VersionText(version);
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "bump version");
  }
}

// ---- text tables

namespace {

std::string Clip(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  return s.substr(0, width - 3) + "...";
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size());
  for (size_t i = 0; i < header.size(); ++i) widths[i] = header[i].size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) text += "  ";
      text += cells[i];
      if (i + 1 < cells.size()) text += std::string(widths[i] - cells[i].size(), ' ');
    }
    out << text << "\n";
  };
  line(header);
  std::vector<std::string> rule;
  rule.reserve(widths.size());
  for (size_t w : widths) rule.emplace_back(w, '-');
  line(rule);
  for (const auto& row : rows) line(row);
  return out.str();
}

}  // namespace

std::string FormatEffectsTable(const std::vector<LedgerEffect>& effects) {
  std::vector<std::vector<std::string>> rows;
  rows.reserve(effects.size());
  for (const auto& e : effects) {
    rows.push_back({std::to_string(e.id), e.provider, e.operation, e.idempotency_key, e.applied_at,
                    Clip(CanonicalJson(e.result), 80)});
  }
  return RenderTable({"id", "provider", "operation", "idempotency_key", "applied_at", "result"},
                     rows);
}

std::string FormatCallsTable(const std::vector<LedgerCall>& calls) {
  std::vector<std::vector<std::string>> rows;
  rows.reserve(calls.size());
  for (const auto& c : calls) {
    rows.push_back(
        {std::to_string(c.id), c.provider, c.operation, c.idempotency_key, c.at, c.outcome});
  }
  return RenderTable({"id", "provider", "operation", "idempotency_key", "at", "outcome"}, rows);
}

// ---- faults

Result<FaultRule> ParseFaultRule(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("fault \"" + text + "\": " + why +
                                   " (expected TOOL=MODE[@N], MODE one of fail, fail_times(K), "
                                   "reject, lose_request, lose_response, delay(MS), reprice, "
                                   "decline)");
  };
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return bad("no TOOL=");
  FaultRule rule;
  rule.tool = text.substr(0, eq);
  std::string mode = text.substr(eq + 1);
  auto at = mode.rfind('@');
  if (at != std::string::npos) {
    if (!ParseInt(mode.substr(at + 1), &rule.nth) || rule.nth < 1) {
      return bad("@N must be a positive integer");
    }
    mode = mode.substr(0, at);
  }
  auto paren = mode.find('(');
  if (paren != std::string::npos) {
    if (mode.back() != ')') return bad("unclosed parenthesis");
    std::string arg = mode.substr(paren + 1, mode.size() - paren - 2);
    mode = mode.substr(0, paren);
    if (mode != "fail_times" && mode != "delay") return bad("mode " + mode + " takes no argument");
    if (!ParseInt(arg, &rule.param)) return bad(mode + "(...) needs a non-negative integer");
  } else if (mode == "fail_times" || mode == "delay") {
    return bad(mode + " needs an argument, e.g. " + mode + "(2)");
  }
  if (mode != "fail" && mode != "fail_times" && mode != "reject" && mode != "lose_request" &&
      mode != "lose_response" && mode != "delay" && mode != "reprice" && mode != "decline") {
    return bad(mode.empty() ? "no mode" : "unknown mode \"" + mode + "\"");
  }
  if (mode == "fail_times" && rule.nth != 0) return bad("fail_times(K) takes no @N");
  rule.mode = mode;
  return rule;
}

// ---- the tools

namespace {

enum class Role { kAction, kCompensation };

struct ToolDef {
  const char* provider;
  const char* operation;
  EffectClass effect;
  bool honours_keys;
  bool has_status;
  bool has_preview;  ///< versions a resource: Preview, expected_version, reprice
  Role role;
  const char* undoes;     ///< compensation: the action operation it undoes
  const char* ref_field;  ///< the result field that is the external reference
  const char* description;
  bool accepts = false;  ///< a slow provider: answers Accepted, finishes later
};

// clang-format off
constexpr std::array<ToolDef, 10> kTools = {{
//  provider    operation  effect                   keys   status preview role                undoes    ref_field
  {"flights",  "reserve", EffectClass::kWrite,      true,  true,  true,  Role::kAction,       "",       "reservation_id",
   "Reserve a flight. Honours idempotency keys; answers status lookups and previews "
   "(versioned by route and date)."},
  {"flights",  "cancel",  EffectClass::kIdempotent, true,  false, false, Role::kCompensation, "reserve", "reservation_id",
   "Cancel a flight reservation: {reservation_id}."},
  {"hotels",   "book",    EffectClass::kWrite,      false, true,  false, Role::kAction,       "",       "booking_id",
   "Book a hotel room. Does NOT deduplicate keys: a repeat books again. Answers status lookups."},
  {"hotels",   "cancel",  EffectClass::kIdempotent, true,  true,  false, Role::kCompensation, "book",    "booking_id",
   "Cancel a hotel booking: {booking_id}."},
  {"cars",     "rent",    EffectClass::kWrite,      false, false, false, Role::kAction,       "",       "rental_id",
   "Rent a car. Neither deduplicates keys nor answers status lookups."},
  {"cars",     "return",  EffectClass::kIdempotent, true,  false, false, Role::kCompensation, "rent",    "rental_id",
   "Return a rented car early: {rental_id}."},
  {"payments", "charge",  EffectClass::kWrite,      true,  true,  true,  Role::kAction,       "",       "charge_id",
   "Charge a card: {traveller, amount_cents, currency}. Honours idempotency keys; answers status "
   "lookups and previews (versioned by the traveller's account)."},
  {"payments", "refund",  EffectClass::kIdempotent, true,  false, false, Role::kCompensation, "charge",  "refund_id",
   "Refund a charge: {charge_id, amount_cents}."},
  {"transfers", "book",   EffectClass::kWrite,      true,  true,  false, Role::kAction,       "",       "transfer_id",
   "Book an airport transfer: {traveller, city, date}. A slow provider: takes the call at once "
   "and confirms it a few seconds later (ask its status). Honours idempotency keys.", true},
  {"transfers", "cancel", EffectClass::kIdempotent, true,  false, false, Role::kCompensation, "book",    "transfer_id",
   "Cancel an airport transfer: {transfer_id}."},
}};
// clang-format on

std::string ToolName(const ToolDef& def) { return std::string(def.provider) + "." + def.operation; }

/// "FL-" + 10 random upper-case base32 characters.
std::string ShortId(const std::string& prefix) {
  std::string id = NewId("").substr(0, 10);
  for (char& c : id) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return prefix + id;
}

/// A stable small hash for made-up flight numbers and prices (FNV-1a).
uint32_t Fnv(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

std::string Text(const Json& args, const char* field, const char* fallback) {
  auto it = args.find(field);
  if (it == args.end() || it->is_null()) return fallback;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

/// The first non-null of args[field] and action_result[field].
Json Pick(const Json& args, const Json& action_result, const char* field) {
  if (args.contains(field) && !args[field].is_null()) return args[field];
  if (action_result.is_object() && action_result.contains(field)) return action_result[field];
  return nullptr;
}

/// A flight's fare rises this much with each version of its route and date.
constexpr int64_t kRepriceStepCents = 2'500;

/// The flight that flights.reserve would book for `args`.
Json FlightOf(const Json& args) {
  std::string from = Text(args, "from", "LIS");
  std::string to = Text(args, "to", "NRT");
  std::string date = Text(args, "date", "");
  Json flight = {{"number", "ID" + std::to_string(100 + Fnv(from + to + date) % 900)},
                 {"from", from},
                 {"to", to},
                 {"date", date}};
  if (args.contains("return_date")) flight["return_date"] = args["return_date"];
  return flight;
}

/// The fare of a route at `version` of its (route, date) resource.
int64_t FlightPriceCents(const Json& args, int64_t version) {
  std::string from = Text(args, "from", "LIS");
  std::string to = Text(args, "to", "NRT");
  return 40'000 + static_cast<int64_t>(Fnv(from + to) % 800) * 100 +
         (version - 1) * kRepriceStepCents;
}

/// The charge's amount, or a refusal message.
Result<int64_t> ChargeAmountCents(const Json& args) {
  Json amount = args.contains("amount_cents") ? args["amount_cents"] : Json(0);
  if (!amount.is_number_integer() || amount.get<int64_t>() < 0) {
    return Status::InvalidArgument("amount_cents must be a non-negative integer");
  }
  return amount.get<int64_t>();
}

/// "EUR 1,840.00".
std::string Money(int64_t cents, const std::string& currency) {
  std::string units = std::to_string(cents / 100);
  for (int i = static_cast<int>(units.size()) - 3; i > 0; i -= 3) units.insert(i, ",");
  int64_t rest = cents % 100;
  return currency + " " + units + "." + (rest < 10 ? "0" : "") + std::to_string(rest);
}

/// The resource a two-phase tool versions: the traveller's account for
/// payments, the route and date for flights.
std::string ResourceOf(const ToolDef& def, const Json& args) {
  const std::string tool = ToolName(def);
  if (tool == "payments.charge") return "account/" + Text(args, "traveller", "guest");
  if (tool == "flights.reserve") {
    return Text(args, "from", "LIS") + "-" + Text(args, "to", "NRT") + "/" + Text(args, "date", "");
  }
  return "";
}

/// What a commit of `args` would do at `version`, or a refusal message.
Result<PreviewOutcome> Describe(const ToolDef& def, const Json& args, int64_t version) {
  const std::string tool = ToolName(def);
  const std::string currency = Text(args, "currency", "EUR");
  const std::string traveller = Text(args, "traveller", "guest");
  const std::string resource = ResourceOf(def, args);
  PreviewOutcome out;
  out.ok = true;
  out.resource_version = VersionText(version);
  if (tool == "payments.charge") {
    Result<int64_t> amount = ChargeAmountCents(args);
    if (!amount.ok()) return amount.status();
    std::string description = Text(args, "description", "");
    out.summary = "charge " + Money(*amount, currency) + " to " + traveller;
    if (!description.empty()) out.summary += " (" + description + ")";
    out.changes = {{"operation", "charge"},          {"traveller", traveller},
                   {"amount_cents", *amount},        {"currency", currency},
                   {"description", description},     {"resource", resource},
                   {"version", out.resource_version}};
    return out;
  }
  if (tool == "flights.reserve") {
    Json flight = FlightOf(args);
    int64_t price = FlightPriceCents(args, version);
    out.summary = "reserve " + flight["from"].get<std::string>() + " \u2192 " +
                  flight["to"].get<std::string>() + " on " + flight["date"].get<std::string>();
    if (flight.contains("return_date")) {
      out.summary += " (return " + Text(flight, "return_date", "") + ")";
    }
    out.summary += " for " + traveller + ", " + Money(price, currency);
    out.changes = {
        {"operation", "reserve"}, {"traveller", traveller},
        {"flight", flight},       {"price", {{"amount_cents", price}, {"currency", currency}}},
        {"resource", resource},   {"version", out.resource_version}};
    return out;
  }
  return Status::Internal("no preview for " + tool);
}

/// The result of a new effect, or a refusal message. `action_result` is the
/// result of the undone action (compensations; null when none); `version` is
/// the version of the resource the tool versions (1 when none).
Result<Json> MakeResult(const ToolDef& def, const Json& args, const Json& action_result,
                        int64_t version = 1) {
  const std::string tool = ToolName(def);
  const std::string currency = Text(args, "currency", "EUR");
  if (tool == "flights.reserve") {
    Json flight = FlightOf(args);
    int64_t price = FlightPriceCents(args, version);
    return Json{{"reservation_id", ShortId("FL-")},
                {"flight", flight},
                {"price", {{"amount_cents", price}, {"currency", currency}}}};
  }
  if (tool == "hotels.book") {
    std::string city = Text(args, "city", "Tokyo");
    int64_t price = 60'000 + static_cast<int64_t>(Fnv(city) % 400) * 100;
    return Json{{"booking_id", ShortId("HT-")},
                {"hotel", "Hotel Idem " + city},
                {"city", city},
                {"check_in", Text(args, "check_in", "")},
                {"check_out", Text(args, "check_out", "")},
                {"price", {{"amount_cents", price}, {"currency", currency}}}};
  }
  if (tool == "cars.rent") {
    return Json{{"rental_id", ShortId("CR-")},
                {"car", "compact"},
                {"pickup", Text(args, "city", "Tokyo")},
                {"from", Text(args, "from", "")},
                {"until", Text(args, "until", "")}};
  }
  if (tool == "payments.charge") {
    Result<int64_t> amount = ChargeAmountCents(args);
    if (!amount.ok()) return amount.status();
    return Json{{"charge_id", ShortId("CH-")}, {"amount_cents", *amount}, {"currency", currency}};
  }
  if (tool == "transfers.book") {
    return Json{{"transfer_id", ShortId("TR-")},
                {"pickup", "Airport " + Text(args, "city", "Tokyo")},
                {"date", Text(args, "date", "")},
                {"traveller", Text(args, "traveller", "")},
                {"price", {{"amount_cents", 4'500}, {"currency", currency}}}};
  }
  if (tool == "flights.cancel" || tool == "hotels.cancel" || tool == "transfers.cancel") {
    return Json{{"cancelled", true}, {def.ref_field, Pick(args, action_result, def.ref_field)}};
  }
  if (tool == "cars.return") {
    return Json{{"returned", true}, {"rental_id", Pick(args, action_result, "rental_id")}};
  }
  if (tool == "payments.refund") {
    return Json{{"refund_id", ShortId("RF-")},
                {"charge_id", Pick(args, action_result, "charge_id")},
                {"amount_cents", Pick(args, action_result, "amount_cents")}};
  }
  return Status::Internal("no result maker for " + tool);
}

std::string RefOf(const ToolDef& def, const Json& result) {
  if (!result.is_object()) return "";
  auto it = result.find(def.ref_field);
  if (it == result.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

class ProviderTool : public Tool {
 public:
  ProviderTool(const ToolDef& def, std::shared_ptr<Ledger> ledger, const ProviderOptions& options)
      : def_(def),
        ledger_(std::move(ledger)),
        latency_ms_(options.latency_ms),
        confirm_delay_ms_(options.confirm_delay_ms) {
    info_.name = ToolName(def);
    info_.effect = def.effect;
    info_.honours_keys = def.honours_keys;
    info_.has_status = def.has_status;
    info_.has_preview = def.has_preview;
    info_.description = def.description;
    if (def.accepts) {
      info_.completion.accepts = true;
      info_.completion.window_ms = 30 * 60'000;
      info_.completion.first_check_ms = 1'000;
      info_.completion.max_check_ms = 10'000;
    }
    // Called outside a spec (an open saga, saga/open_saga.h): the provider's
    // undo, with the action's reference from its result.
    for (const ToolDef& undo : kTools) {
      if (def.role == Role::kAction && undo.role == Role::kCompensation &&
          std::string(undo.provider) == def.provider && std::string(undo.undoes) == def.operation) {
        info_.open.compensate_tool = ToolName(undo);
        info_.open.compensate_args = {
            {def.ref_field, std::string("${result.") + def.ref_field + "}"}};
      }
    }
    for (const auto& rule : options.faults) {
      if (rule.tool == info_.name) faults_.push_back(rule);
    }
  }

  const ToolInfo& info() const override { return info_; }

  ToolOutcome Invoke(const ToolCall& call) override {
    if (latency_ms_ > 0) SystemClock::Get()->SleepMs(latency_ms_);
    int n = calls_.fetch_add(1) + 1;
    const FaultRule* fault = FaultFor(n);
    std::string mode = fault != nullptr ? fault->mode : "";
    if (mode == "delay") {
      SystemClock::Get()->SleepMs(fault->param);
      mode.clear();
    }
    if (mode == "fail" || mode == "fail_times") {
      LogCall(call.key, "fault:fail");
      return ToolOutcome::Failed(
          "injected fault: transient failure (" + info_.name + " call " + std::to_string(n) + ")",
          /*retryable=*/true);
    }
    if (mode == "reject") {
      LogCall(call.key, "fault:reject");
      return ToolOutcome::Failed(
          "injected fault: permanent refusal (" + info_.name + " call " + std::to_string(n) + ")",
          /*retryable=*/false);
    }
    if (mode == "lose_request") {
      LogCall(call.key, "fault:lose_request");
      return ToolOutcome::Unknown("request lost");
    }
    const bool lose_response = mode == "lose_response";
    const bool reprice = mode == "reprice";
    const bool decline = mode == "decline";

    if (!call.args.is_null() && !call.args.is_object()) {
      LogCall(call.key, "error");
      return ToolOutcome::Failed(info_.name + ": args must be a JSON object", false);
    }
    const Json args = call.args.is_null() ? Json::object() : call.args;
    bool new_effect = false;  // an effect row was committed by this call
    ToolOutcome outcome =
        def_.accepts ? Accept(call.key, args, decline, lose_response)
        : def_.role == Role::kAction
            ? Act(call.key, args, call.expected_version, reprice, lose_response, &new_effect)
            : Compensate(call.key, args, lose_response, &new_effect);
    if (new_effect && outcome.kind == OutcomeKind::kSucceeded) {
      const char* site =
          def_.role == Role::kAction ? "provider.after_apply" : "provider.after_undo";
      if (IDEM_FAILPOINT(site))
        return ToolOutcome::Unknown(std::string("injected error at ") + site);
    }
    if (lose_response) return ToolOutcome::Unknown("response lost");
    return outcome;
  }

  LookupOutcome Lookup(const std::string& key) override {
    LookupOutcome out;
    if (!def_.has_status) return Tool::Lookup(key);
    if (def_.accepts) return LookupAccepted(key);
    auto& impl = LedgerAccess::Of(*ledger_);
    std::lock_guard<std::mutex> lock(impl.mu);
    try {
      Json first;
      bool found = FirstEffect(impl, def_.operation, key, &first);
      InsertCall(impl, "lookup", key, found ? "applied" : "not_applied");
      if (found) {
        out.kind = LookupKind::kApplied;
        out.result = first;
        out.external_ref = RefOf(def_, first);
      } else {
        out.kind = LookupKind::kNotApplied;
      }
    } catch (const std::exception& e) {
      out = LookupOutcome();
      out.kind = LookupKind::kError;
      out.error = std::string("ledger: ") + e.what();
    }
    return out;
  }

  /// No effect, no fault, no latency, no @N count: reads the resource's
  /// version and describes the commit; logs one `calls` row ("preview").
  PreviewOutcome Preview(const ToolCall& call) override {
    if (!def_.has_preview) return Tool::Preview(call);
    auto refuse = [](std::string error, bool retryable) {
      PreviewOutcome o;
      o.error = std::move(error);
      o.retryable = retryable;
      return o;
    };
    if (!call.args.is_null() && !call.args.is_object()) {
      LogCall("preview", call.key, "error");
      return refuse(info_.name + ": args must be a JSON object", false);
    }
    const Json args = call.args.is_null() ? Json::object() : call.args;
    auto& impl = LedgerAccess::Of(*ledger_);
    std::lock_guard<std::mutex> lock(impl.mu);
    try {
      SQLite::Transaction tx(*impl.db, SQLite::TransactionBehavior::IMMEDIATE);
      PreviewOutcome out;
      Json first;
      if (IsBarredIn(impl, call.key)) {
        InsertCall(impl, "preview", call.key, "refused_after_compensation");
        out = refuse("action arrived after its compensation", false);
      } else {
        const int64_t version = ReadVersion(*impl.db, def_.provider, ResourceOf(def_, args));
        Result<PreviewOutcome> described = Describe(def_, args, version);
        if (!described.ok()) {
          InsertCall(impl, "preview", call.key, "rejected");
          out = refuse(info_.name + ": " + described.status().message(), false);
        } else if (def_.honours_keys && FirstEffect(impl, def_.operation, call.key, &first)) {
          // A commit would replay the stored result: say so, and show it.
          InsertCall(impl, "preview", call.key, "already_applied");
          out = *described;
          out.summary = "already done: " + out.summary;
          out.changes["already_applied"] = true;
          out.changes["result"] = first;
        } else {
          InsertCall(impl, "preview", call.key, "previewed");
          out = *described;
        }
      }
      tx.commit();
      return out;
    } catch (const std::exception& e) {
      return refuse(info_.name + ": ledger error: " + e.what(), true);
    }
  }

 private:
  using Impl = LedgerAccess::Impl;

  /// Binds (this provider, `operation`, `key`) to parameters first..first+2.
  void BindKey(SQLite::Statement& q, int first, const std::string& operation,
               const std::string& key) const {
    q.bind(first, def_.provider);
    q.bind(first + 1, operation);
    q.bind(first + 2, key);
  }

  const FaultRule* FaultFor(int n) const {
    for (const auto& rule : faults_) {
      if (rule.mode == "fail_times") {
        if (n <= rule.param) return &rule;
      } else if (rule.nth == 0 || rule.nth == n) {
        return &rule;
      }
    }
    return nullptr;
  }

  /// Finds the first effect of `operation` under `key`. Caller holds mu.
  bool FirstEffect(Impl& impl, const std::string& operation, const std::string& key, Json* result) {
    SQLite::Statement q(*impl.db,
                        "SELECT result FROM effects "
                        "WHERE provider = ? AND operation = ? AND idempotency_key = ? "
                        "ORDER BY id LIMIT 1");
    BindKey(q, 1, operation, key);
    if (!q.executeStep()) return false;
    *result = Json::parse(q.getColumn(0).getString());
    return true;
  }

  /// Caller holds mu.
  void InsertCall(Impl& impl, const std::string& operation, const std::string& key,
                  const std::string& outcome) {
    SQLite::Statement q(*impl.db,
                        "INSERT INTO calls(provider, operation, idempotency_key, at, outcome) "
                        "VALUES (?, ?, ?, ?, ?)");
    q.bind(1, def_.provider);
    q.bind(2, operation);
    q.bind(3, key);
    q.bind(4, NowText());
    q.bind(5, outcome);
    q.exec();
  }

  /// Caller holds mu.
  void InsertEffect(Impl& impl, const std::string& key, const Json& args, const Json& result) {
    SQLite::Statement q(*impl.db,
                        "INSERT INTO effects(provider, operation, idempotency_key, applied_at, "
                        "args, result) VALUES (?, ?, ?, ?, ?, ?)");
    BindKey(q, 1, def_.operation, key);
    q.bind(4, NowText());
    q.bind(5, CanonicalJson(args));
    q.bind(6, CanonicalJson(result));
    q.exec();
  }

  /// Logs a call that never reached the ledger logic (faults). Best effort.
  void LogCall(const std::string& key, const std::string& outcome) {
    LogCall(def_.operation, key, outcome);
  }
  void LogCall(const std::string& operation, const std::string& key, const std::string& outcome) {
    auto& impl = LedgerAccess::Of(*ledger_);
    std::lock_guard<std::mutex> lock(impl.mu);
    try {
      InsertCall(impl, operation, key, outcome);
    } catch (const std::exception&) {
      // The log is for tests; a busy ledger must not change the outcome.
    }
  }

  /// Whether a null compensation barred action key `key`. Caller holds mu.
  bool IsBarredIn(Impl& impl, const std::string& key) {
    SQLite::Statement barrier(*impl.db,
                              "SELECT 1 FROM barriers "
                              "WHERE provider = ? AND idempotency_key = ? AND op = ?");
    barrier.bind(1, def_.provider);
    barrier.bind(2, key);
    barrier.bind(3, kNullCompensated);
    return barrier.executeStep();
  }

  static std::string Tag(const std::string& outcome, bool lose_response) {
    return lose_response ? outcome + ";response_lost" : outcome;
  }

  /// Runs `body` in an immediate transaction. Errors before the commit mean
  /// nothing happened (a retryable failure); an error in the commit itself
  /// leaves the effect uncertain.
  template <typename Body>
  ToolOutcome InTransaction(Body body) {
    auto& impl = LedgerAccess::Of(*ledger_);
    std::lock_guard<std::mutex> lock(impl.mu);
    bool committing = false;
    try {
      SQLite::Transaction tx(*impl.db, SQLite::TransactionBehavior::IMMEDIATE);
      ToolOutcome outcome = body(impl);
      committing = true;
      tx.commit();
      return outcome;
    } catch (const std::exception& e) {
      std::string why = info_.name + ": ledger error: " + e.what();
      return committing ? ToolOutcome::Unknown(why) : ToolOutcome::Failed(why, true);
    }
  }

  /// An action. With `expected_version` (a two-phase commit) the versioned
  /// resource must still be at that version; `reprice` first moves it on.
  ToolOutcome Act(const std::string& key, const Json& args, const std::string& expected_version,
                  bool reprice, bool lose_response, bool* new_effect) {
    return InTransaction([&](Impl& impl) {
      const std::string resource = def_.has_preview ? ResourceOf(def_, args) : "";
      if (reprice) BumpVersionIn(*impl.db, def_.provider, resource);
      if (IsBarredIn(impl, key)) {
        InsertCall(impl, def_.operation, key, Tag("refused_after_compensation", lose_response));
        return ToolOutcome::Failed("action arrived after its compensation", false);
      }
      Json first;
      if (def_.honours_keys && FirstEffect(impl, def_.operation, key, &first)) {
        InsertCall(impl, def_.operation, key, Tag("repeat", lose_response));
        return ToolOutcome::Succeeded(first, RefOf(def_, first));
      }
      int64_t version = 1;
      if (def_.has_preview) {
        version = ReadVersion(*impl.db, def_.provider, resource);
        const std::string current = VersionText(version);
        if (!expected_version.empty() && expected_version != current) {
          InsertCall(impl, def_.operation, key, Tag("stale", lose_response));
          return ToolOutcome::Stale(
              info_.name + ": " + resource + " changed since the preview: previewed at version " +
              expected_version + ", now " + current + "; nothing was done, preview again");
        }
      }
      Result<Json> result = MakeResult(def_, args, nullptr, version);
      if (!result.ok()) {
        InsertCall(impl, def_.operation, key, Tag("rejected", lose_response));
        return ToolOutcome::Failed(info_.name + ": " + result.status().message(), false);
      }
      InsertEffect(impl, key, args, *result);
      InsertCall(impl, def_.operation, key, Tag("applied", lose_response));
      *new_effect = true;
      return ToolOutcome::Succeeded(*result, RefOf(def_, *result));
    });
  }

  ToolOutcome Compensate(const std::string& key, const Json& args, bool lose_response,
                         bool* new_effect) {
    const std::string suffix = kCompensateSuffix;
    const bool has_action_key = key.size() > suffix.size() &&
                                key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
    const std::string action_key = has_action_key ? key.substr(0, key.size() - suffix.size()) : "";
    return InTransaction([&](Impl& impl) {
      Json first;
      if (def_.honours_keys && FirstEffect(impl, def_.operation, key, &first)) {
        InsertCall(impl, def_.operation, key, Tag("repeat", lose_response));
        return ToolOutcome::Succeeded(first, RefOf(def_, first));
      }
      Json action_result;
      if (has_action_key && !FirstEffect(impl, def_.undoes, action_key, &action_result)) {
        // Null compensation: bar the action key so a late action is refused.
        SQLite::Statement bar(*impl.db,
                              "INSERT OR IGNORE INTO barriers(provider, idempotency_key, op) "
                              "VALUES (?, ?, ?)");
        bar.bind(1, def_.provider);
        bar.bind(2, action_key);
        bar.bind(3, kNullCompensated);
        bar.exec();
        InsertCall(impl, def_.operation, key, Tag("null_compensation", lose_response));
        return ToolOutcome::Succeeded(Json{{"null_compensation", true}});
      }
      Result<Json> result = MakeResult(def_, args, action_result);
      if (!result.ok()) {
        InsertCall(impl, def_.operation, key, Tag("rejected", lose_response));
        return ToolOutcome::Failed(info_.name + ": " + result.status().message(), false);
      }
      InsertEffect(impl, key, args, *result);
      InsertCall(impl, def_.operation, key, Tag("applied", lose_response));
      *new_effect = true;
      return ToolOutcome::Succeeded(*result, RefOf(def_, *result));
    });
  }

  /// A job the slow provider took (the acceptances table).
  struct Acceptance {
    Json args;
    std::string job_id;
    int64_t ready_ms = 0;
    std::string outcome;  ///< pending, done, declined
  };

  /// Caller holds mu.
  bool FindAcceptance(Impl& impl, const std::string& key, Acceptance* a) {
    SQLite::Statement q(*impl.db,
                        "SELECT args, job_id, ready_ms, outcome FROM acceptances "
                        "WHERE provider = ? AND operation = ? AND idempotency_key = ?");
    BindKey(q, 1, def_.operation, key);
    if (!q.executeStep()) return false;
    a->args = Json::parse(q.getColumn(0).getString());
    a->job_id = q.getColumn(1).getString();
    a->ready_ms = q.getColumn(2).getInt64();
    a->outcome = q.getColumn(3).getString();
    return true;
  }

  /// Caller holds mu.
  void SetAcceptanceOutcome(Impl& impl, const std::string& key, const char* outcome) {
    SQLite::Statement q(*impl.db,
                        "UPDATE acceptances SET outcome = ? "
                        "WHERE provider = ? AND operation = ? AND idempotency_key = ?");
    q.bind(1, outcome);
    BindKey(q, 2, def_.operation, key);
    q.exec();
  }

  /// The slow provider takes a call: a job row, no effect yet (the first
  /// status lookup once it is ready writes the effect). A repeated key is
  /// answered from the ledger, never a second job.
  ToolOutcome Accept(const std::string& key, const Json& args, bool decline, bool lose_response) {
    return InTransaction([&](Impl& impl) {
      if (IsBarredIn(impl, key)) {
        InsertCall(impl, def_.operation, key, Tag("refused_after_compensation", lose_response));
        return ToolOutcome::Failed("action arrived after its compensation", false);
      }
      Json first;
      if (FirstEffect(impl, def_.operation, key, &first)) {
        InsertCall(impl, def_.operation, key, Tag("repeat", lose_response));
        return ToolOutcome::Succeeded(first, RefOf(def_, first));
      }
      const int64_t now = SystemClock::Get()->NowMs();
      Acceptance taken;
      if (FindAcceptance(impl, key, &taken)) {
        InsertCall(impl, def_.operation, key, Tag("repeat", lose_response));
        if (taken.outcome == "declined" && now >= taken.ready_ms) {
          return ToolOutcome::Failed(info_.name + ": the provider declined job " + taken.job_id,
                                     false);
        }
        return ToolOutcome::Accepted(taken.job_id, std::max<int64_t>(taken.ready_ms - now, 0));
      }
      Result<Json> result = MakeResult(def_, args, nullptr);  // refuse bad args now
      if (!result.ok()) {
        InsertCall(impl, def_.operation, key, Tag("rejected", lose_response));
        return ToolOutcome::Failed(info_.name + ": " + result.status().message(), false);
      }
      const std::string job = ShortId("JOB-");
      SQLite::Statement q(
          *impl.db,
          "INSERT INTO acceptances(provider, operation, idempotency_key, args, "
          "job_id, accepted_ms, ready_ms, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
      BindKey(q, 1, def_.operation, key);
      q.bind(4, CanonicalJson(args));
      q.bind(5, job);
      q.bind(6, static_cast<int64_t>(now));
      q.bind(7, static_cast<int64_t>(now + confirm_delay_ms_));
      q.bind(8, decline ? "declined" : "pending");
      q.exec();
      InsertCall(impl, def_.operation, key, Tag("accepted", lose_response));
      return ToolOutcome::Accepted(job, confirm_delay_ms_);
    });
  }

  /// The slow provider's status: pending until the job is ready, then done
  /// (the effect row is written by the first lookup after it) or declined.
  LookupOutcome LookupAccepted(const std::string& key) {
    LookupOutcome out;
    auto& impl = LedgerAccess::Of(*ledger_);
    std::lock_guard<std::mutex> lock(impl.mu);
    try {
      SQLite::Transaction tx(*impl.db, SQLite::TransactionBehavior::IMMEDIATE);
      Json first;
      Acceptance job;
      const int64_t now = SystemClock::Get()->NowMs();
      if (FirstEffect(impl, def_.operation, key, &first)) {
        InsertCall(impl, "lookup", key, "applied");
        out.kind = LookupKind::kApplied;
        out.result = first;
        out.external_ref = RefOf(def_, first);
      } else if (!FindAcceptance(impl, key, &job)) {
        InsertCall(impl, "lookup", key, "not_applied");
        out.kind = LookupKind::kNotApplied;
      } else if (now < job.ready_ms) {
        InsertCall(impl, "lookup", key, "pending");
        out.kind = LookupKind::kPending;
        out.external_ref = job.job_id;
        out.check_after_ms = job.ready_ms - now;
      } else if (job.outcome == "declined" || IsBarredIn(impl, key)) {
        // Declined by the provider, or cancelled before it was confirmed.
        SetAcceptanceOutcome(impl, key, "declined");
        InsertCall(impl, "lookup", key, "declined");
        out.kind = LookupKind::kFailed;
        out.error = "job " + job.job_id + " declined: no transfer available";
      } else {
        Result<Json> result = MakeResult(def_, job.args, nullptr);
        if (!result.ok()) throw std::runtime_error(result.status().message());
        InsertEffect(impl, key, job.args, *result);
        SetAcceptanceOutcome(impl, key, "done");
        InsertCall(impl, "lookup", key, "confirmed");
        out.kind = LookupKind::kApplied;
        out.result = *result;
        out.external_ref = RefOf(def_, *result);
      }
      tx.commit();
    } catch (const std::exception& e) {
      out = LookupOutcome();
      out.kind = LookupKind::kError;
      out.error = std::string("ledger: ") + e.what();
    }
    return out;
  }

  const ToolDef& def_;
  std::shared_ptr<Ledger> ledger_;
  int latency_ms_;
  int64_t confirm_delay_ms_;
  std::vector<FaultRule> faults_;
  ToolInfo info_;
  std::atomic<int> calls_{0};
};

}  // namespace

const std::vector<std::string>& TravelToolNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    out.reserve(kTools.size());
    for (const auto& def : kTools) out.push_back(ToolName(def));
    return out;
  }();
  return names;
}

Status RegisterTravelTools(ToolRegistry& registry, const ProviderOptions& options) {
  const auto& names = TravelToolNames();
  for (const auto& rule : options.faults) {
    if (std::find(names.begin(), names.end(), rule.tool) == names.end()) {
      return Status::InvalidArgument("fault for unknown tool \"" + rule.tool + "\"");
    }
    auto def = std::find_if(kTools.begin(), kTools.end(),
                            [&](const ToolDef& d) { return ToolName(d) == rule.tool; });
    if (rule.mode == "decline" && !def->accepts) {
      return Status::InvalidArgument("fault decline for \"" + rule.tool +
                                     "\": the tool does not accept calls to finish later "
                                     "(decline applies to transfers.book)");
    }
    if (rule.mode == "reprice") {
      if (!def->has_preview) {
        return Status::InvalidArgument("fault reprice for \"" + rule.tool +
                                       "\": the tool has no preview (reprice applies to "
                                       "flights.reserve and payments.charge)");
      }
    }
  }
  if (options.latency_ms < 0) return Status::InvalidArgument("latency_ms must not be negative");
  if (options.confirm_delay_ms < 0) {
    return Status::InvalidArgument("confirm_delay_ms must not be negative");
  }
  Result<std::shared_ptr<Ledger>> ledger = Ledger::Open(options.ledger_path);
  if (!ledger.ok()) return ledger.status();
  for (const auto& def : kTools) {
    IDEM_RETURN_IF_ERROR(registry.Register(std::make_unique<ProviderTool>(def, *ledger, options)));
  }
  return Status::Ok();
}

}  // namespace idem::travel
