// SqliteStore::Prune (storage/prune.h): one BEGIN IMMEDIATE transaction per
// batch of sagas on the write connection, so the write lock is held for one
// batch at a time; the JSON rewrites are storage/prune.cc's. A dry run reads
// on the read connection and writes nothing.

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "storage/prune.h"
#include "storage/sqlite_errors.h"
#include "storage/sqlite_store.h"

#include "common/json_util.h"
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

namespace idem::storage {
namespace {

using sqlite_errors::DataError;
using sqlite_errors::Guarded;

// The candidates: finished (one of the request's states), last updated
// before the cutoff, not pruned yet; oldest first. Only placeholders are
// appended, one per state.
std::string CandidatesSql(const PruneRequest& r) {
  std::string sql = "SELECT saga_id FROM sagas WHERE pruned_at_ms IS NULL AND updated_ms < ?";
  sql += " AND state IN (?";
  for (size_t i = 1; i < r.states.size(); ++i) sql += ", ?";
  sql += ") ORDER BY updated_ms, saga_id LIMIT ?";
  return sql;
}

std::vector<std::string> Candidates(SQLite::Database& db, const PruneRequest& r, int limit) {
  SQLite::Statement q(db, CandidatesSql(r));
  int i = 1;
  q.bind(i++, static_cast<int64_t>(r.finished_before_ms));
  for (const std::string& s : r.states) q.bind(i++, s);
  q.bind(i, limit);
  std::vector<std::string> ids;
  while (q.executeStep()) ids.push_back(q.getColumn(0).getString());
  return ids;
}

Json Column(SQLite::Statement& q, int index, const char* column) {
  SQLite::Column c = q.getColumn(index);
  if (c.isNull()) return Json();
  Json v = Json::parse(c.getString(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) throw DataError(std::string("column ") + column + " holds invalid JSON");
  return v;
}

void Bind(SQLite::Statement& q, int index, const Json& v) {
  if (v.is_null()) {
    q.bind(index);
  } else {
    q.bind(index, CanonicalJson(v));
  }
}

int64_t Count(SQLite::Database& db, const char* sql, const std::string& saga_id) {
  SQLite::Statement q(db, sql);
  q.bind(1, saga_id);
  q.executeStep();
  return q.getColumn(0).getInt64();
}

// Rewrites one saga's data, marks it pruned and journals it.
void PruneSaga(SQLite::Database& db, const PruneRequest& r, const std::string& id,
               PruneReport* report) {
  const std::vector<std::string>& f = r.redact;
  {
    // Marked first: the triggers of migration 9 let a pruned saga's data change.
    SQLite::Statement q(db, "SELECT input FROM sagas WHERE saga_id = ?");
    q.bind(1, id);
    q.executeStep();
    Json input = f.empty() ? Json::object() : PruneDocument(Column(q, 0, "sagas.input"), f);
    SQLite::Statement up(db, "UPDATE sagas SET pruned_at_ms = ?, input = ? WHERE saga_id = ?");
    up.bind(1, static_cast<int64_t>(r.now_ms));
    Bind(up, 2, input);
    up.bind(3, id);
    up.exec();
  }
  {
    SQLite::Statement q(db,
                        "SELECT idx, args, result, comp_result, phase FROM steps"
                        " WHERE saga_id = ? ORDER BY idx");
    q.bind(1, id);
    SQLite::Statement up(db,
                         "UPDATE steps SET args = ?, result = ?, comp_result = ?, phase = ?"
                         " WHERE saga_id = ? AND idx = ?");
    while (q.executeStep()) {
      Bind(up, 1, PruneDocument(Column(q, 1, "steps.args"), f));
      Bind(up, 2, PruneDocument(Column(q, 2, "steps.result"), f));
      Bind(up, 3, PruneDocument(Column(q, 3, "steps.comp_result"), f));
      Bind(up, 4, PruneDocument(Column(q, 4, "steps.phase"), f));
      up.bind(5, id);
      up.bind(6, q.getColumn(0).getInt());
      up.exec();
      up.reset();
      ++report->steps;
    }
  }
  {
    SQLite::Statement q(db, "SELECT seq, data FROM journal WHERE saga_id = ? AND data IS NOT NULL");
    q.bind(1, id);
    SQLite::Statement up(db, "UPDATE journal SET data = ? WHERE seq = ?");
    while (q.executeStep()) {
      Json data = Column(q, 1, "journal.data");
      Json pruned = PruneJournalData(data, f);
      if (pruned == data) continue;
      Bind(up, 1, pruned);
      up.bind(2, q.getColumn(0).getInt64());
      up.exec();
      up.reset();
      ++report->journal_entries;
    }
  }
  {
    SQLite::Statement q(db,
                        "SELECT idempotency_key, result FROM effects"
                        " WHERE saga_id = ? AND result IS NOT NULL");
    q.bind(1, id);
    SQLite::Statement up(db, "UPDATE effects SET result = ? WHERE idempotency_key = ?");
    while (q.executeStep()) {
      Bind(up, 1, PruneDocument(Column(q, 1, "effects.result"), f));
      up.bind(2, q.getColumn(0).getString());
      up.exec();
      up.reset();
      ++report->effects;
    }
  }
  {
    SQLite::Statement del(db, "DELETE FROM consumed_tokens WHERE saga_id = ?");
    del.bind(1, id);
    report->tokens += del.exec();
  }
  SQLite::Statement je(db,
                       "INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
                       " VALUES (?, '', 'saga_pruned', ?, ?)");
  je.bind(1, id);
  Bind(je, 2, PrunedEntryData(r));
  je.bind(3, static_cast<int64_t>(r.now_ms));
  je.exec();
  report->saga_ids.push_back(id);
}

}  // namespace

Result<PruneReport> SqliteStore::Prune(const PruneRequest& request) {
  IDEM_RETURN_IF_ERROR(CheckPruneRequest(request));
  if (request.dry_run) {
    return Guarded<Result<PruneReport>>("prune (dry run)", [&]() -> Result<PruneReport> {
      std::lock_guard<std::mutex> lock(read_mu_);
      SQLite::Transaction tx(*read_db_);  // one snapshot
      PruneReport report;
      report.saga_ids = Candidates(*read_db_, request, 1'000'000);
      for (const std::string& id : report.saga_ids) {
        report.steps += Count(*read_db_, "SELECT count(*) FROM steps WHERE saga_id = ?", id);
        report.journal_entries += Count(
            *read_db_, "SELECT count(*) FROM journal WHERE saga_id = ? AND data IS NOT NULL", id);
        report.effects += Count(
            *read_db_, "SELECT count(*) FROM effects WHERE saga_id = ? AND result IS NOT NULL", id);
        report.tokens +=
            Count(*read_db_, "SELECT count(*) FROM consumed_tokens WHERE saga_id = ?", id);
      }
      return report;
    });
  }
  IDEM_RETURN_IF_ERROR(WritesAllowed());
  PruneReport report;
  for (;;) {
    auto pruned = Guarded<Result<size_t>>("prune", [&]() -> Result<size_t> {
      std::lock_guard<std::mutex> lock(mu_);
      SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
      std::vector<std::string> ids = Candidates(*db_, request, request.batch_sagas);
      for (const std::string& id : ids) PruneSaga(*db_, request, id, &report);
      if (ids.empty()) return size_t{0};
      tx.commit();
      AdvanceMark();
      return ids.size();
    });
    if (!pruned.ok()) return pruned.status();
    if (*pruned == 0) break;
    ++report.batches;
  }
  return report;
}

}  // namespace idem::storage
