-- Sagas per state, kept by the writes themselves (docs/bench.md, "Cost as
-- the journal grows"): /metrics reads a row per state and the moves not yet
-- folded into it, instead of counting an index entry per saga, so its cost
-- stays flat as finished sagas pile up.
--
-- Many writers: a counter row per state would be a hot row (a transaction
-- that moves a saga would hold its lock until COMMIT, so every state change
-- would wait for the one before it, and a group commit's transactions could
-- deadlock on them). So the trigger only appends the move to
-- saga_state_moves (a heap without an index: no row lock, no conflict), in
-- the same transaction as the state, and PgStore::ReadGauges folds the moves
-- into saga_state_counts (DELETE ... RETURNING, then one upsert per state)
-- before it reads both in one snapshot. Two folds at once each fold the
-- moves they deleted, so none is counted twice.
CREATE TABLE saga_state_counts (
  state TEXT PRIMARY KEY,
  sagas BIGINT NOT NULL
);
CREATE TABLE saga_state_moves (
  state TEXT NOT NULL,
  delta BIGINT NOT NULL
);
CREATE FUNCTION idem_count_saga_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO saga_state_moves (state, delta) VALUES (NEW.state, 1);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO saga_state_moves (state, delta) VALUES (OLD.state, -1);
  ELSE
    INSERT INTO saga_state_moves (state, delta) VALUES (OLD.state, -1), (NEW.state, 1);
  END IF;
  RETURN NULL;
END
$$;
-- No saga moves between the count and the triggers (writers wait for this
-- migration's COMMIT; readers do not).
LOCK TABLE sagas IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO saga_state_counts (state, sagas) SELECT state, count(*) FROM sagas GROUP BY state;
CREATE TRIGGER saga_state_counts_insert_delete AFTER INSERT OR DELETE ON sagas
  FOR EACH ROW EXECUTE FUNCTION idem_count_saga_state();
CREATE TRIGGER saga_state_counts_update AFTER UPDATE OF state ON sagas
  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION idem_count_saga_state();
