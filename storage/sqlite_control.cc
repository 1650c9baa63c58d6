// SqliteStore's control requests (storage/control_store.h): the table
// `saga_controls` of migration 6. Writes are one BEGIN IMMEDIATE transaction
// on the write connection (the request row and its journal entry together);
// reads run on the read connection.

#include <mutex>
#include <utility>

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

constexpr const char* kControlColumns =
    "SELECT saga_id, request_id, kind, requested_by, reason, requested_ms FROM saga_controls";

ControlRequest ReadControl(SQLite::Statement& q) {
  ControlRequest r;
  r.saga_id = q.getColumn(0).getString();
  r.request_id = q.getColumn(1).getString();
  r.kind = q.getColumn(2).getString();
  r.by = q.getColumn(3).getString();
  r.reason = q.getColumn(4).getString();
  r.requested_ms = q.getColumn(5).getInt64();
  return r;
}

}  // namespace

Result<ControlOutcome> SqliteStore::RequestControl(const ControlRequest& request) {
  IDEM_RETURN_IF_ERROR(CheckControlRequest(request));
  return Guarded<Result<ControlOutcome>>(
      "record " + request.kind + " request", [&]() -> Result<ControlOutcome> {
        std::lock_guard<std::mutex> lock(mu_);
        SQLite::Transaction tx(*db_, SQLite::TransactionBehavior::IMMEDIATE);
        {
          SQLite::Statement exists(*db_, "SELECT 1 FROM sagas WHERE saga_id = ?");
          exists.bind(1, request.saga_id);
          if (!exists.executeStep()) {
            return Status::NotFound("saga " + Quote(request.saga_id) + " not found");
          }
        }
        {
          SQLite::Statement q(*db_, std::string(kControlColumns) + " WHERE saga_id = ?");
          q.bind(1, request.saga_id);
          if (q.executeStep()) {
            ControlRequest pending = ReadControl(q);
            if (!ControlReplaces(pending.kind, request.kind)) {
              return ControlOutcome{std::move(pending), false};  // nothing written
            }
          }
        }
        SQLite::Statement up(
            *db_,
            "INSERT INTO saga_controls (saga_id, request_id, kind, requested_by,"
            " reason, requested_ms) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (saga_id) DO UPDATE SET request_id = excluded.request_id,"
            " kind = excluded.kind, requested_by = excluded.requested_by,"
            " reason = excluded.reason, requested_ms = excluded.requested_ms");
        up.bind(1, request.saga_id);
        up.bind(2, request.request_id);
        up.bind(3, request.kind);
        up.bind(4, request.by);
        up.bind(5, request.reason);
        up.bind(6, static_cast<int64_t>(request.requested_ms));
        up.exec();
        SQLite::Statement je(*db_,
                             "INSERT INTO journal (saga_id, step_id, event, data, at_ms)"
                             " VALUES (?, '', ?, ?, ?)");
        je.bind(1, request.saga_id);
        je.bind(2, request.kind + "_requested");
        je.bind(3, CanonicalJson(Json{{"by", request.by},
                                      {"reason", request.reason},
                                      {"request", request.request_id}}));
        je.bind(4, static_cast<int64_t>(request.requested_ms));
        je.exec();
        tx.commit();
        return ControlOutcome{request, true};
      });
}

Result<std::optional<ControlRequest>> SqliteStore::PendingControl(const std::string& saga_id) {
  return Guarded<Result<std::optional<ControlRequest>>>(
      "read control request", [&]() -> Result<std::optional<ControlRequest>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        SQLite::Statement q(*read_db_, std::string(kControlColumns) + " WHERE saga_id = ?");
        q.bind(1, saga_id);
        if (!q.executeStep()) return std::optional<ControlRequest>();
        return std::optional<ControlRequest>(ReadControl(q));
      });
}

Status SqliteStore::SettleControl(const std::string& saga_id, const std::string& request_id) {
  return Guarded<Status>("settle control request", [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    SQLite::Statement del(*db_, "DELETE FROM saga_controls WHERE saga_id = ? AND request_id = ?");
    del.bind(1, saga_id);
    del.bind(2, request_id);
    del.exec();  // autocommit: one statement
    return Status::Ok();
  });
}

Result<std::vector<ControlRequest>> SqliteStore::ListControls(int limit) {
  if (limit <= 0) {
    return Status::InvalidArgument("ListControls: limit must be positive, got " +
                                   std::to_string(limit));
  }
  return Guarded<Result<std::vector<ControlRequest>>>(
      "list control requests", [&]() -> Result<std::vector<ControlRequest>> {
        std::lock_guard<std::mutex> lock(read_mu_);
        SQLite::Statement q(
            *read_db_, std::string(kControlColumns) + " ORDER BY requested_ms, saga_id LIMIT ?");
        q.bind(1, limit);
        std::vector<ControlRequest> out;
        while (q.executeStep()) out.push_back(ReadControl(q));
        return out;
      });
}

}  // namespace idem::storage
