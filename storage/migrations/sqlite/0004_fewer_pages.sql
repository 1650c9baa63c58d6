
DROP INDEX sagas_by_state;
CREATE TABLE journal_v4 (
  seq     INTEGER PRIMARY KEY,
  saga_id TEXT    NOT NULL REFERENCES sagas (saga_id),
  step_id TEXT    NOT NULL DEFAULT '',
  event   TEXT    NOT NULL,
  data    TEXT,
  at_ms   INTEGER NOT NULL
);
INSERT INTO journal_v4 (seq, saga_id, step_id, event, data, at_ms)
  SELECT seq, saga_id, step_id, event, data, at_ms FROM journal ORDER BY seq;
DROP TABLE journal;
ALTER TABLE journal_v4 RENAME TO journal;
DELETE FROM sqlite_sequence WHERE name = 'journal';
CREATE INDEX journal_by_saga ON journal (saga_id, seq);
CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
BEGIN
  SELECT RAISE(ABORT, 'journal is append-only');
END;
CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
BEGIN
  SELECT RAISE(ABORT, 'journal is append-only');
END;
