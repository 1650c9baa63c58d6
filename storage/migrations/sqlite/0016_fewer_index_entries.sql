
-- Nothing to do: PostgreSQL's migration 16 drops indexes SQLite never had
-- (sagas_by_state went in version 4; the journal's seq is its rowid, and
-- effects have no seq); this one keeps version N the same on both backends.
SELECT 1;
