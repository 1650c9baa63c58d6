#include "cli/journal.h"

#include <cstdio>

#include "storage/sqlite_store.h"

namespace idem::cli {

Status JournalCommand(const std::string& action, const std::string& who, const std::string& reason,
                      storage::Store* store) {
  auto* sqlite = dynamic_cast<storage::SqliteStore*>(store);
  const std::string mark = sqlite != nullptr ? sqlite->HighWaterMarkPath() : std::string();
  if (action == "check") {
    IDEM_RETURN_IF_ERROR(store->JournalIntegrity());
    if (mark.empty()) {
      std::printf("journal: no high-water mark kept (PostgreSQL keeps its own durability)\n");
    } else {
      std::printf("journal: not behind its high-water mark %s\n", mark.c_str());
    }
    return Status::Ok();
  }
  if (action == "accept-regression") {
    if (who.empty())
      return Status::InvalidArgument("journal accept-regression: --as NAME is required");
    if (reason.empty()) {
      return Status::InvalidArgument("journal accept-regression: --reason TEXT is required");
    }
    IDEM_RETURN_IF_ERROR(store->AcceptRegression(who, reason));
    std::printf(
        "journal: regression accepted by %s and recorded in %s.log; the journal drives "
        "again from where it stands\n",
        who.c_str(), mark.c_str());
    return Status::Ok();
  }
  return Status::InvalidArgument("journal: expected check or accept-regression, got \"" + action +
                                 "\"");
}

}  // namespace idem::cli
