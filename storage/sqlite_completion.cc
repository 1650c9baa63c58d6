// SqliteStore's asynchronous completion and drift records (migration 11):
// `step_checks` (written with the step's batch, ApplyBatch in
// sqlite_store.cc; read here on the read connection) and `drift_findings`
// (one BEGIN IMMEDIATE transaction with the finding's journal entry).

#include <mutex>
#include <string>
#include <vector>

#include "storage/sqlite_errors.h"
#include "storage/sqlite_store.h"
#include "storage/validate.h"

#include "common/json_util.h"
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::storage {
namespace {

using sqlite_errors::Guarded;

Status CheckLimit(const char* what, int limit) {
  if (limit > 0) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + ": limit must be positive, got " +
                                 std::to_string(limit));
}

}  // namespace

Result<std::vector<StepCheck>> SqliteStore::ListStepChecks(const std::string& saga_id) {
  return Guarded<Result<std::vector<StepCheck>>>(
      "ListStepChecks " + Quote(saga_id), [&]() -> Result<std::vector<StepCheck>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        SQLite::Statement q(*read_db_,
                            "SELECT step_id, next_check_ms, deadline_ms, checks, since_ms"
                            " FROM step_checks WHERE saga_id = ? ORDER BY step_id");
        q.bind(1, saga_id);
        std::vector<StepCheck> out;
        while (q.executeStep()) {
          StepCheck c;
          c.step_id = q.getColumn(0).getString();
          c.next_check_ms = q.getColumn(1).getInt64();
          c.deadline_ms = q.getColumn(2).getInt64();
          c.checks = q.getColumn(3).getInt();
          c.since_ms = q.getColumn(4).getInt64();
          out.push_back(std::move(c));
        }
        return out;
      });
}

Result<std::vector<DueCheck>> SqliteStore::ListDueChecks(const std::string& saga_state,
                                                         int64_t now_ms, int limit) {
  IDEM_RETURN_IF_ERROR(CheckLimit("ListDueChecks", limit));
  return Guarded<Result<std::vector<DueCheck>>>(
      "ListDueChecks", [&]() -> Result<std::vector<DueCheck>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        SQLite::Statement q(*read_db_,
                            "SELECT c.saga_id, MIN(c.next_check_ms) AS due FROM step_checks c"
                            " JOIN sagas s ON s.saga_id = c.saga_id"
                            " WHERE c.next_check_ms <= ? AND s.state = ?"
                            " GROUP BY c.saga_id ORDER BY due, c.saga_id LIMIT ?");
        q.bind(1, static_cast<int64_t>(now_ms));
        q.bind(2, saga_state);
        q.bind(3, limit);
        std::vector<DueCheck> out;
        while (q.executeStep()) {
          out.push_back({q.getColumn(0).getString(), q.getColumn(1).getInt64()});
        }
        return out;
      });
}

Result<std::vector<EffectRecord>> SqliteStore::ListEffectsSince(int64_t since_ms, int limit) {
  IDEM_RETURN_IF_ERROR(CheckLimit("ListEffectsSince", limit));
  return Guarded<Result<std::vector<EffectRecord>>>(
      "ListEffectsSince", [&]() -> Result<std::vector<EffectRecord>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        SQLite::Statement q(*read_db_,
                            "SELECT idempotency_key, saga_id, step_id, kind, tool, result,"
                            " external_ref, at_ms FROM effects"
                            " WHERE kind = 'action' AND at_ms >= ? ORDER BY at_ms, rowid LIMIT ?");
        q.bind(1, static_cast<int64_t>(since_ms));
        q.bind(2, limit);
        std::vector<EffectRecord> out;
        while (q.executeStep()) {
          EffectRecord f;
          f.idempotency_key = q.getColumn(0).getString();
          f.saga_id = q.getColumn(1).getString();
          f.step_id = q.getColumn(2).getString();
          f.kind = q.getColumn(3).getString();
          f.tool = q.getColumn(4).getString();
          if (!q.getColumn(5).isNull()) {
            auto parsed = ParseJson(q.getColumn(5).getString(), "effects.result");
            if (!parsed.ok()) return Status::Internal(parsed.status().message());
            f.result = std::move(parsed).value();
          }
          f.external_ref = q.getColumn(6).getString();
          f.at_ms = q.getColumn(7).getInt64();
          out.push_back(std::move(f));
        }
        return out;
      });
}

Result<bool> SqliteStore::RecordDrift(const DriftFinding& finding) {
  if (finding.kind != "effect_missing" && finding.kind != "orphan") {
    return Status::InvalidArgument("RecordDrift: kind " + Quote(finding.kind) +
                                   " is not effect_missing or orphan");
  }
  if (finding.tool.empty() || finding.key.empty()) {
    return Status::InvalidArgument("RecordDrift: a finding needs its tool and key");
  }
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  return Guarded<Result<bool>>("record drift", [&]() -> Result<bool> {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
    SQLite::Statement ins(*db_,
                          "INSERT INTO drift_findings (kind, tool, key, saga_id, step_id, detail,"
                          " found_ms) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING");
    ins.bind(1, finding.kind);
    ins.bind(2, finding.tool);
    ins.bind(3, finding.key);
    ins.bind(4, finding.saga_id);
    ins.bind(5, finding.step_id);
    ins.bind(6, finding.detail);
    ins.bind(7, static_cast<int64_t>(finding.found_ms));
    if (ins.exec() == 0) return false;  // recorded before: the transaction writes nothing
    bool journaled = false;
    if (!finding.saga_id.empty()) {
      SQLite::Statement exists(*db_, "SELECT 1 FROM sagas WHERE saga_id = ?");
      exists.bind(1, finding.saga_id);
      if (exists.executeStep()) {
        SQLite::Statement je(*db_,
                             "INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
                             " VALUES (?, ?, 'drift', ?, ?)");
        je.bind(1, finding.saga_id);
        je.bind(2, finding.step_id);
        je.bind(3, CanonicalJson(Json{{"kind", finding.kind},
                                      {"tool", finding.tool},
                                      {"key", finding.key},
                                      {"detail", finding.detail}}));
        je.bind(4, static_cast<int64_t>(finding.found_ms));
        je.exec();
        journaled = true;
      }
    }
    tx.commit();
    if (journaled) AdvanceMark();
    return true;
  });
}

}  // namespace idem::storage
