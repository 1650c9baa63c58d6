
-- Nothing to do: PostgreSQL's migration 17 makes lease updates HOT updates
-- (SQLite has no such thing: its sagas_by_state_lease stays, and a claim
-- rewrites that entry as before); this one keeps version N the same on both
-- backends.
SELECT 1;
