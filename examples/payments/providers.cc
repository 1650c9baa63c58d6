#include "examples/payments/providers.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include <sqlite3.h>

#include "common/failpoint.h"
#include <SQLiteCpp/SQLiteCpp.h>

namespace idem::payments {
namespace {

constexpr int kBusyTimeoutMs = 10'000;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS ops (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  op TEXT NOT NULL, key TEXT NOT NULL, hold_id TEXT NOT NULL DEFAULT '',
  ref TEXT NOT NULL DEFAULT '', payment TEXT NOT NULL DEFAULT '',
  amount INTEGER NOT NULL DEFAULT 0, at_ms INTEGER NOT NULL, result TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ops_key ON ops (op, key);
CREATE INDEX IF NOT EXISTS ops_hold ON ops (hold_id);
CREATE TABLE IF NOT EXISTS calls (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  op TEXT NOT NULL, key TEXT NOT NULL, outcome TEXT NOT NULL, at_ms INTEGER NOT NULL);
)sql";

Status FromSqlite(const SQLite::Exception& e, const std::string& what) {
  const int code = e.getErrorCode();
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return Status::Unavailable("payments ledger busy: " + what);
  }
  return Status::Internal("payments ledger: " + what + ": " + e.what());
}

/// A short, stable id from a key: "H-" + 10 hex digits of FNV-1a.
std::string IdFor(const char* prefix, const std::string& key) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s-%010llX", prefix,
                static_cast<unsigned long long>(h & 0xFFFFFFFFFFULL));
  return buf;
}

std::string Money(int64_t cents, const std::string& currency) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %lld.%02lld", currency.c_str(),
                static_cast<long long>(cents / 100), static_cast<long long>(cents % 100));
  return buf;
}

struct Fault {
  std::string mode;
  int nth = 0;
};

}  // namespace

struct Ledger::Impl {
  std::mutex mu;
  std::unique_ptr<SQLite::Database> db;  // guarded by mu
};

Ledger::Ledger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Ledger::~Ledger() = default;

Result<std::shared_ptr<Ledger>> Ledger::Open(const std::string& path, bool create) {
  if (!create && !std::filesystem::exists(path)) {
    return Status::NotFound("no payments ledger at " + path);
  }
  auto impl = std::make_unique<Impl>();
  try {
    int flags = SQLite::OPEN_READWRITE | (create ? SQLite::OPEN_CREATE : 0);
    impl->db = std::make_unique<SQLite::Database>(path, flags, kBusyTimeoutMs);
    impl->db->exec("PRAGMA journal_mode=WAL");
    impl->db->exec("PRAGMA synchronous=FULL");
    impl->db->exec(kSchema);
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "open " + path);
  }
  return std::shared_ptr<Ledger>(new Ledger(std::move(impl)));
}

Result<std::vector<LedgerOp>> Ledger::Ops() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT id, op, key, hold_id, ref, payment, amount, at_ms FROM ops "
                        "ORDER BY id");
    std::vector<LedgerOp> out;
    while (q.executeStep()) {
      out.push_back({q.getColumn(0).getInt64(), q.getColumn(1).getString(),
                     q.getColumn(2).getString(), q.getColumn(3).getString(),
                     q.getColumn(4).getString(), q.getColumn(5).getString(),
                     q.getColumn(6).getInt64(), q.getColumn(7).getInt64()});
    }
    return out;
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "read ops");
  }
}

Result<int> Ledger::CountCalls(const std::string& op, const std::string& key) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db, "SELECT COUNT(*) FROM calls WHERE op = ? AND key = ?");
    q.bind(1, op);
    q.bind(2, key);
    q.executeStep();
    return q.getColumn(0).getInt();
  } catch (const SQLite::Exception& e) {
    return FromSqlite(e, "count calls");
  }
}

// The five tools over one ledger. Every operation runs in one immediate
// transaction: look the key up (a repeat answers the stored result), check
// the hold, insert the row and the call.
class Tools {
 public:
  Tools(std::shared_ptr<Ledger> ledger, const ProviderOptions& o, std::map<std::string, Fault> f)
      : ledger_(std::move(ledger)),
        clock_(o.clock != nullptr ? o.clock : SystemClock::Get()),
        lifetime_ms_(o.hold_lifetime_ms),
        faults_(std::move(f)) {}

  /// The hold's row: status "authorized", "captured", "voided" or "" (none).
  struct Hold {
    std::string status;
    int64_t amount = 0;
    int64_t expires_at_ms = 0;
    std::string payment;
    Json auth;
  };

  ToolOutcome Invoke(const std::string& op, const ToolCall& call) {
    std::string mode = FaultFor(call.tool);
    if (mode == "fail") return Record(op, call.key, "fault:fail"), Retryable("busy, try again");
    if (mode == "reject") return Record(op, call.key, "fault:reject"), Permanent("declined");
    if (mode == "lose_request") return ToolOutcome::Unknown("request lost");
    Ledger::Impl& impl = *ledger_->impl_;
    std::lock_guard<std::mutex> lock(impl.mu);
    ToolOutcome out;
    try {
      SQLite::Transaction tx(*impl.db, SQLite::TransactionBehavior::IMMEDIATE);
      std::string outcome;
      out = Apply(*impl.db, op, call, &outcome);
      InsertCall(*impl.db, op, call.key, outcome);
      tx.commit();
    } catch (const SQLite::Exception& e) {
      return ToolOutcome::Unknown(FromSqlite(e, op).message());
    } catch (const std::exception& e) {
      return Permanent(std::string("bad arguments: ") + e.what());
    }
    if (out.kind == OutcomeKind::kSucceeded && !out.replayed) {
      if (IDEM_FAILPOINT("provider.after_apply")) return ToolOutcome::Unknown("failpoint");
    }
    if (mode == "lose_response") return ToolOutcome::Unknown("response lost");
    return out;
  }

  LookupOutcome Lookup(const std::string& op, const std::string& key) {
    Ledger::Impl& impl = *ledger_->impl_;
    std::lock_guard<std::mutex> lock(impl.mu);
    LookupOutcome out;
    try {
      InsertCall(*impl.db, "lookup", key, op);
      auto found = Find(*impl.db, op, key);
      if (found.is_null()) {
        out.kind = LookupKind::kNotApplied;
      } else {
        out.kind = LookupKind::kApplied;
        out.result = found;
        out.external_ref = found.value("ref", "");
      }
    } catch (const std::exception& e) {
      out.kind = LookupKind::kError;
      out.error = e.what();
    }
    return out;
  }

  PreviewOutcome PreviewCapture(const ToolCall& call) {
    Ledger::Impl& impl = *ledger_->impl_;
    std::lock_guard<std::mutex> lock(impl.mu);
    PreviewOutcome pv;
    try {
      InsertCall(*impl.db, "preview", call.key, "capture");
      const std::string hold_id = call.args.at("hold_id").get<std::string>();
      const int64_t amount = call.args.at("amount").get<int64_t>();
      const std::string currency = call.args.value("currency", "EUR");
      Hold h = ReadHold(*impl.db, hold_id);
      if (h.status != "authorized") {
        pv.error = "hold " + hold_id + " is " + (h.status.empty() ? "unknown" : h.status);
        return pv;
      }
      pv.ok = true;
      pv.summary = "capture " + Money(amount, currency) + " of hold " + hold_id + " (payment " +
                   h.payment + ")";
      pv.changes = {{"amount", amount},
                    {"currency", currency},
                    {"hold_id", hold_id},
                    {"payment", h.payment},
                    {"hold_expires_at_ms", h.expires_at_ms}};
    } catch (const std::exception& e) {
      pv.error = std::string("bad arguments: ") + e.what();
    }
    return pv;
  }

 private:
  static ToolOutcome Retryable(const std::string& e) { return ToolOutcome::Failed(e, true); }
  static ToolOutcome Permanent(const std::string& e) { return ToolOutcome::Failed(e, false); }

  std::string FaultFor(const std::string& tool) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = ++counts_[tool];
    auto it = faults_.find(tool);
    if (it == faults_.end()) return "";
    return it->second.nth == 0 || it->second.nth == n ? it->second.mode : "";
  }

  void Record(const std::string& op, const std::string& key, const std::string& outcome) {
    Ledger::Impl& impl = *ledger_->impl_;
    std::lock_guard<std::mutex> lock(impl.mu);
    try {
      InsertCall(*impl.db, op, key, outcome);
    } catch (const std::exception&) {
    }
  }

  void InsertCall(SQLite::Database& db, const std::string& op, const std::string& key,
                  const std::string& outcome) {
    SQLite::Statement ins(db, "INSERT INTO calls (op, key, outcome, at_ms) VALUES (?, ?, ?, ?)");
    ins.bind(1, op);
    ins.bind(2, key);
    ins.bind(3, outcome);
    ins.bind(4, static_cast<int64_t>(clock_->NowMs()));
    ins.exec();
  }

  static Json Find(SQLite::Database& db, const std::string& op, const std::string& key) {
    SQLite::Statement q(db, "SELECT result FROM ops WHERE op = ? AND key = ? ORDER BY id LIMIT 1");
    q.bind(1, op);
    q.bind(2, key);
    if (!q.executeStep()) return Json();
    return Json::parse(q.getColumn(0).getString());
  }

  Hold ReadHold(SQLite::Database& db, const std::string& hold_id) {
    Hold h;
    SQLite::Statement q(db,
                        "SELECT op, amount, payment, result FROM ops WHERE hold_id = ? "
                        "AND op IN ('authorize', 'capture', 'void') ORDER BY id");
    q.bind(1, hold_id);
    while (q.executeStep()) {
      std::string op = q.getColumn(0).getString();
      if (op == "authorize") {
        h.status = "authorized";
        h.amount = q.getColumn(1).getInt64();
        h.payment = q.getColumn(2).getString();
        h.auth = Json::parse(q.getColumn(3).getString());
        h.expires_at_ms = h.auth.value("expires_at_ms", int64_t{0});
      } else if (!h.status.empty()) {
        h.status = op == "capture" ? "captured" : "voided";
      }
    }
    if (h.status == "authorized" && clock_->NowMs() >= h.expires_at_ms) h.status = "expired";
    return h;
  }

  void Insert(SQLite::Database& db, const std::string& op, const std::string& key,
              const std::string& hold_id, const std::string& ref, const std::string& payment,
              int64_t amount, const Json& result) {
    SQLite::Statement ins(db,
                          "INSERT INTO ops (op, key, hold_id, ref, payment, amount, at_ms, result) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    ins.bind(1, op);
    ins.bind(2, key);
    ins.bind(3, hold_id);
    ins.bind(4, ref);
    ins.bind(5, payment);
    ins.bind(6, amount);
    ins.bind(7, static_cast<int64_t>(clock_->NowMs()));
    ins.bind(8, result.dump());
    ins.exec();
  }

  ToolOutcome Apply(SQLite::Database& db, const std::string& op, const ToolCall& call,
                    std::string* outcome) {
    Json found = Find(db, op, call.key);
    if (!found.is_null()) {
      *outcome = "repeat";
      ToolOutcome r = ToolOutcome::Succeeded(found, found.value("ref", ""));
      r.replayed = true;
      return r;
    }
    const Json& a = call.args;
    *outcome = "applied";
    if (op == "authorize") {
      const int64_t amount = a.at("amount").get<int64_t>();
      const std::string payment = a.at("payment").get<std::string>();
      if (amount <= 0) return *outcome = "rejected", Permanent("amount must be positive");
      const std::string hold_id = IdFor("H", call.key);
      Json result = {{"hold_id", hold_id},
                     {"payment", payment},
                     {"amount", amount},
                     {"currency", a.value("currency", "EUR")},
                     {"expires_at_ms", clock_->NowMs() + lifetime_ms_},
                     {"status", "authorized"},
                     {"ref", hold_id}};
      Insert(db, op, call.key, hold_id, hold_id, payment, amount, result);
      return ToolOutcome::Succeeded(result, hold_id);
    }
    if (op == "capture") {
      const std::string hold_id = a.at("hold_id").get<std::string>();
      const int64_t amount = a.at("amount").get<int64_t>();
      Hold h = ReadHold(db, hold_id);
      if (h.status != "authorized") {
        *outcome = "refused";
        return Permanent("hold " + hold_id + " is " + (h.status.empty() ? "unknown" : h.status));
      }
      if (amount <= 0 || amount > h.amount) {
        *outcome = "refused";
        return Permanent("capture amount exceeds the hold");
      }
      const std::string ref = IdFor("C", call.key);
      Json result = {{"capture_id", ref}, {"hold_id", hold_id},   {"payment", h.payment},
                     {"amount", amount},  {"status", "captured"}, {"ref", ref}};
      Insert(db, op, call.key, hold_id, ref, h.payment, amount, result);
      return ToolOutcome::Succeeded(result, ref);
    }
    if (op == "void") {
      const std::string hold_id = a.at("hold_id").get<std::string>();
      Hold h = ReadHold(db, hold_id);
      if (h.status.empty()) {
        *outcome = "null_void";
        return ToolOutcome::Succeeded({{"hold_id", hold_id}, {"voided", false}});
      }
      if (h.status == "captured") {
        *outcome = "refused";
        return Permanent("hold " + hold_id + " was captured: refund it instead");
      }
      if (h.status == "voided") {
        *outcome = "already_voided";
        return ToolOutcome::Succeeded({{"hold_id", hold_id}, {"voided", true}});
      }
      Json result = {{"hold_id", hold_id}, {"voided", true}, {"was", h.status}};
      Insert(db, op, call.key, hold_id, "", h.payment, h.amount, result);
      return ToolOutcome::Succeeded(result);
    }
    if (op == "refund") {
      const std::string capture_id = a.at("capture_id").get<std::string>();
      SQLite::Statement q(db,
                          "SELECT hold_id, payment, amount FROM ops WHERE op = 'capture' AND "
                          "ref = ? LIMIT 1");
      q.bind(1, capture_id);
      if (!q.executeStep()) {
        *outcome = "refused";
        return Permanent("no capture " + capture_id);
      }
      const std::string hold_id = q.getColumn(0).getString();
      const std::string payment = q.getColumn(1).getString();
      const int64_t amount = q.getColumn(2).getInt64();
      q.reset();
      const std::string ref = IdFor("R", call.key);
      Json result = {
          {"refund_id", ref}, {"capture_id", capture_id}, {"amount", amount}, {"ref", ref}};
      Insert(db, op, call.key, hold_id, capture_id, payment, amount, result);
      return ToolOutcome::Succeeded(result, ref);
    }
    // receipt
    const std::string ref = IdFor("M", call.key);
    Json result = {{"receipt_id", ref}, {"to", a.at("to")}, {"ref", ref}};
    Insert(db, "receipt", call.key, a.value("hold_id", ""), ref, a.value("payment", ""), 0, result);
    return ToolOutcome::Succeeded(result, ref);
  }

  std::shared_ptr<Ledger> ledger_;
  Clock* clock_;
  int64_t lifetime_ms_;
  std::mutex mu_;
  std::map<std::string, Fault> faults_;
  std::map<std::string, int> counts_;  // guarded by mu_
};

const std::vector<std::string>& PaymentToolNames() {
  static const std::vector<std::string> names = {"payments.authorize", "payments.capture",
                                                 "payments.void", "payments.refund",
                                                 "receipts.send"};
  return names;
}

Status RegisterPaymentTools(ToolRegistry& registry, const ProviderOptions& options) {
  std::map<std::string, Fault> faults;
  for (const std::string& text : options.faults) {
    auto eq = text.find('=');
    std::string tool = eq == std::string::npos ? "" : text.substr(0, eq);
    std::string mode = eq == std::string::npos ? "" : text.substr(eq + 1);
    int nth = 0;
    auto at = mode.find('@');
    if (at != std::string::npos) {
      try {
        nth = std::stoi(mode.substr(at + 1));
      } catch (const std::exception&) {
        nth = -1;
      }
      mode.resize(at);
    }
    bool known_tool = false;
    for (const auto& n : PaymentToolNames()) known_tool |= n == tool;
    bool known_mode =
        mode == "lose_response" || mode == "lose_request" || mode == "fail" || mode == "reject";
    if (!known_tool || !known_mode || nth < 0) {
      return Status::InvalidArgument("--fault " + Json(text).dump() +
                                     ": expected TOOL=MODE[@N] with TOOL a payments tool and MODE "
                                     "lose_response, lose_request, fail or reject");
    }
    faults[tool] = {mode, nth};
  }
  auto ledger = Ledger::Open(options.ledger_path);
  if (!ledger.ok()) return ledger.status();
  auto tools = std::make_shared<Tools>(*ledger, options, std::move(faults));

  struct Def {
    const char* name;
    const char* op;
    EffectClass effect;
    bool preview;
    const char* description;
  };
  const Def defs[] = {
      {"payments.authorize", "authorize", EffectClass::kWrite, false,
       "place a hold on the card: {payment, amount (cents), currency}"},
      {"payments.capture", "capture", EffectClass::kWrite, true,
       "capture a hold: {hold_id, amount, currency}"},
      {"payments.void", "void", EffectClass::kIdempotent, false, "release a hold: {hold_id}"},
      {"payments.refund", "refund", EffectClass::kIdempotent, false,
       "refund a capture: {capture_id}"},
      {"receipts.send", "receipt", EffectClass::kIrreversible, false,
       "email a receipt: {to, payment}"},
  };
  for (const Def& def : defs) {
    ToolInfo info;
    info.name = def.name;
    info.effect = def.effect;
    info.honours_keys = true;
    info.description = def.description;
    std::string op = def.op;
    FunctionTool::PreviewFn preview = nullptr;
    if (def.preview) preview = [tools](const ToolCall& c) { return tools->PreviewCapture(c); };
    IDEM_RETURN_IF_ERROR(registry.Register(std::make_unique<FunctionTool>(
        info, [tools, op](const ToolCall& c) { return tools->Invoke(op, c); },
        [tools, op](const std::string& key) { return tools->Lookup(op, key); }, preview)));
  }
  return Status::Ok();
}

LedgerFindings CheckLedger(const std::vector<LedgerOp>& ops,
                           const std::set<std::string>& unfinished_sagas) {
  LedgerFindings f;
  std::map<std::string, const LedgerOp*> auth;  // hold -> authorization
  std::map<std::string, int> captures_by_hold, voids_by_hold, captures_by_payment;
  std::map<std::string, const LedgerOp*> capture_by_ref;
  std::map<std::pair<std::string, std::string>, int> by_key;
  for (const LedgerOp& o : ops) {
    if (++by_key[{o.op, o.key}] == 2) {
      f.violations.push_back(o.op + " applied twice under key " + o.key);
    }
    if (o.op == "authorize") {
      ++f.holds;
      auth[o.hold_id] = &o;
    } else if (o.op == "capture") {
      ++f.captures;
      if (voids_by_hold[o.hold_id] > 0) {
        f.violations.push_back("capture " + o.ref + " of hold " + o.hold_id + " after its void");
      }
      if (++captures_by_hold[o.hold_id] == 2) {
        f.violations.push_back("hold " + o.hold_id + " captured more than once");
      }
      if (++captures_by_payment[o.payment] == 2) {
        f.violations.push_back("payment " + o.payment + " captured more than once");
      }
      if (auth.count(o.hold_id) == 0) {
        f.violations.push_back("capture " + o.ref + " of unknown hold " + o.hold_id);
      }
      capture_by_ref[o.ref] = &o;
    } else if (o.op == "void") {
      ++f.voids;
      ++voids_by_hold[o.hold_id];
      if (auth.count(o.hold_id) == 0) {
        f.violations.push_back("void of hold " + o.hold_id + " that was never authorized");
      }
      if (captures_by_hold[o.hold_id] > 0) {
        f.violations.push_back("void of hold " + o.hold_id + " after its capture");
      }
    } else if (o.op == "refund") {
      ++f.refunds;
      if (capture_by_ref.count(o.ref) == 0) {
        f.violations.push_back("refund " + o.key + " of capture " + o.ref + " that never happened");
      }
    } else if (o.op == "receipt") {
      ++f.receipts;
    }
  }
  for (const auto& [hold, a] : auth) {
    if (captures_by_hold[hold] > 0 || voids_by_hold[hold] > 0) continue;
    const std::string saga = a->key.substr(0, a->key.find('/'));
    if (unfinished_sagas.count(saga) > 0) continue;
    f.violations.push_back("hold " + hold + " (payment " + a->payment +
                           ") left open: neither captured nor voided");
  }
  return f;
}

std::string FormatOps(const std::vector<LedgerOp>& ops) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-10s %-14s %-14s %-12s %10s\n", "#", "op", "hold", "ref",
                "payment", "amount");
  out << line;
  for (const LedgerOp& o : ops) {
    std::snprintf(line, sizeof line, "%-4lld %-10s %-14s %-14s %-12s %10s\n",
                  static_cast<long long>(o.id), o.op.c_str(), o.hold_id.c_str(), o.ref.c_str(),
                  o.payment.c_str(), o.amount ? Money(o.amount, "EUR").c_str() : "");
    out << line;
  }
  return out.str();
}

}  // namespace idem::payments
