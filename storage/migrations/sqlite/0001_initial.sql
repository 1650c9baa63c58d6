
CREATE TABLE intents (
  intent_key  TEXT    NOT NULL PRIMARY KEY,
  fingerprint TEXT    NOT NULL,
  saga_id     TEXT    NOT NULL UNIQUE,
  created_ms  INTEGER NOT NULL
);

CREATE TABLE sagas (
  saga_id     TEXT    NOT NULL PRIMARY KEY,
  intent_key  TEXT    NOT NULL UNIQUE REFERENCES intents (intent_key),
  fingerprint TEXT    NOT NULL,
  spec_name   TEXT    NOT NULL,
  spec        TEXT,
  input       TEXT,
  state       TEXT    NOT NULL,
  reason      TEXT    NOT NULL DEFAULT '',
  created_ms  INTEGER NOT NULL,
  updated_ms  INTEGER NOT NULL
);
CREATE INDEX sagas_by_state ON sagas (state);

CREATE TABLE steps (
  saga_id          TEXT    NOT NULL REFERENCES sagas (saga_id),
  idx              INTEGER NOT NULL,
  step_id          TEXT    NOT NULL,
  tool             TEXT    NOT NULL,
  state            TEXT    NOT NULL,
  attempt          INTEGER NOT NULL DEFAULT 0,
  step_key         TEXT    NOT NULL UNIQUE,
  args             TEXT,
  args_fingerprint TEXT    NOT NULL DEFAULT '',
  result           TEXT,
  external_ref     TEXT    NOT NULL DEFAULT '',
  error            TEXT    NOT NULL DEFAULT '',
  comp_attempt     INTEGER NOT NULL DEFAULT 0,
  comp_result      TEXT,
  updated_ms       INTEGER NOT NULL,
  PRIMARY KEY (saga_id, idx)
);

CREATE TABLE journal (
  seq     INTEGER PRIMARY KEY AUTOINCREMENT,
  saga_id TEXT    NOT NULL REFERENCES sagas (saga_id),
  step_id TEXT    NOT NULL DEFAULT '',
  event   TEXT    NOT NULL,
  data    TEXT,
  at_ms   INTEGER NOT NULL
);
CREATE INDEX journal_by_saga ON journal (saga_id, seq);
CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
BEGIN
  SELECT RAISE(ABORT, 'journal is append-only');
END;
CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
BEGIN
  SELECT RAISE(ABORT, 'journal is append-only');
END;

CREATE TABLE effects (
  idempotency_key TEXT    NOT NULL PRIMARY KEY,
  saga_id         TEXT    NOT NULL REFERENCES sagas (saga_id),
  step_id         TEXT    NOT NULL,
  kind            TEXT    NOT NULL,
  tool            TEXT    NOT NULL,
  result          TEXT,
  external_ref    TEXT    NOT NULL DEFAULT '',
  at_ms           INTEGER NOT NULL
);
CREATE INDEX effects_by_saga ON effects (saga_id);
CREATE TRIGGER effects_no_update BEFORE UPDATE ON effects
BEGIN
  SELECT RAISE(ABORT, 'effects are append-only');
END;
CREATE TRIGGER effects_no_delete BEFORE DELETE ON effects
BEGIN
  SELECT RAISE(ABORT, 'effects are append-only');
END;
