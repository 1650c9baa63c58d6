// The late-write audit of the sweep's PostgreSQL journal (chaos/runner.h):
// a trigger, in the sweep's own throwaway database, that records for every
// journal entry which worker wrote it and who held the saga's lease then.
#include <algorithm>

#include "chaos/runner.h"
#include <glob.h>

namespace idem::chaos {

namespace {

// A worker's connections carry its lease owner name as application_name
// (PGAPPNAME); other processes' carry "idem" (or nothing): no writer.
constexpr const char* kAuditSql = R"SQL(
CREATE TABLE IF NOT EXISTS chaos_journal_audit (
  seq BIGINT, saga_id TEXT, event TEXT, writer TEXT, lease_owner TEXT);
CREATE OR REPLACE FUNCTION chaos_journal_audit() RETURNS trigger AS $$
BEGIN
  INSERT INTO chaos_journal_audit
  SELECT NEW.seq, NEW.saga_id, NEW.event,
         CASE WHEN current_setting('application_name') LIKE 'chaos-w%'
              THEN current_setting('application_name') ELSE '' END,
         COALESCE((SELECT lease_owner FROM sagas WHERE saga_id = NEW.saga_id), '');
  RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS chaos_journal_audit ON journal;
CREATE TRIGGER chaos_journal_audit AFTER INSERT ON journal
  FOR EACH ROW EXECUTE FUNCTION chaos_journal_audit();
)SQL";

// The newest psql of /usr/lib/postgresql/*/bin, or "psql" (on PATH).
std::string Psql() {
  glob_t g{};
  std::string best;
  if (glob("/usr/lib/postgresql/*/bin/psql", 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::string p = g.gl_pathv[i];
      if (best.empty() || p.size() > best.size() || (p.size() == best.size() && p > best)) {
        best = p;
      }
    }
  }
  globfree(&g);
  return best.empty() ? "/usr/bin/psql" : best;
}

}  // namespace

Status Runner::InstallAudit() {
  audit_ = config_.work_dir + "/journal-audit.tsv";
  // The journal's tables first (any command migrates the store).
  auto argv = Base();
  argv.push_back("list");
  Child m = Child::Spawn(argv, LogPath("migrate.out"), LogPath("migrate.err"));
  Exit e = m.WaitFor(60'000);
  if (e.running || e.killed || e.code != 0) {
    return Status::Internal("chaos: could not migrate the journal: " +
                            ReadFileText(LogPath("migrate.err")));
  }
  Child c =
      Child::Spawn({Psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", locator_, "-c", kAuditSql},
                   LogPath("audit-install.out"), LogPath("audit-install.err"));
  e = c.WaitFor(60'000);
  if (e.running || e.killed || e.code != 0) {
    return Status::Internal("chaos: could not install the journal audit: " +
                            ReadFileText(LogPath("audit-install.err")));
  }
  return Status::Ok();
}

void Runner::DumpAudit() {
  if (audit_.empty()) return;
  Child c = Child::Spawn({Psql(), "-X", "-q", "-A", "-t", "-F", "\t", "-d", locator_, "-c",
                          "SELECT seq, saga_id, event, writer, lease_owner FROM "
                          "chaos_journal_audit ORDER BY seq"},
                         audit_, LogPath("audit-dump.err"));
  Exit e = c.WaitFor(120'000);
  if (e.running || e.killed || e.code != 0) {
    std::fprintf(stderr, "chaos: the journal audit could not be read: %s\n",
                 ReadFileText(LogPath("audit-dump.err")).c_str());
  }
}

}  // namespace idem::chaos
