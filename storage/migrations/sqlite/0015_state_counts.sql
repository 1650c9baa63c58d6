-- Sagas per state, kept by the writes themselves (docs/bench.md, "Cost as
-- the journal grows"): /metrics reads a row per state instead of counting
-- an index entry per saga, so its cost stays flat as finished sagas pile up.
-- The triggers move a saga's count in the same transaction as its state, so
-- a reader's snapshot sees counts and sagas agree. SQLite has one writer at
-- a time, so one row per state is no hot spot. A row whose count fell to 0
-- stays (readers skip it).
CREATE TABLE saga_state_counts (
  state TEXT PRIMARY KEY,
  sagas INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO saga_state_counts (state, sagas) SELECT state, COUNT(*) FROM sagas GROUP BY state;
CREATE TRIGGER saga_state_counts_insert AFTER INSERT ON sagas BEGIN
  INSERT INTO saga_state_counts (state, sagas) VALUES (NEW.state, 1)
    ON CONFLICT (state) DO UPDATE SET sagas = sagas + 1;
END;
CREATE TRIGGER saga_state_counts_update AFTER UPDATE OF state ON sagas
  WHEN OLD.state IS NOT NEW.state BEGIN
  UPDATE saga_state_counts SET sagas = sagas - 1 WHERE state = OLD.state;
  INSERT INTO saga_state_counts (state, sagas) VALUES (NEW.state, 1)
    ON CONFLICT (state) DO UPDATE SET sagas = sagas + 1;
END;
CREATE TRIGGER saga_state_counts_delete AFTER DELETE ON sagas BEGIN
  UPDATE saga_state_counts SET sagas = sagas - 1 WHERE state = OLD.state;
END;
