
-- Nothing to do: SQLite's migration 4 changed how its pages are written, not
-- its tables; this one keeps version N the same tables on both backends.
SELECT 1;
