
CREATE TABLE intents (
  intent_key  TEXT   NOT NULL PRIMARY KEY,
  fingerprint TEXT   NOT NULL,
  saga_id     TEXT   NOT NULL UNIQUE,
  created_ms  BIGINT NOT NULL
);

CREATE TABLE sagas (
  saga_id     TEXT   NOT NULL PRIMARY KEY,
  intent_key  TEXT   NOT NULL UNIQUE REFERENCES intents (intent_key),
  fingerprint TEXT   NOT NULL,
  spec_name   TEXT   NOT NULL,
  spec        TEXT,
  input       TEXT,
  state       TEXT   NOT NULL,
  reason      TEXT   NOT NULL DEFAULT '',
  created_ms  BIGINT NOT NULL,
  updated_ms  BIGINT NOT NULL
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
  updated_ms       BIGINT  NOT NULL,
  PRIMARY KEY (saga_id, idx)
);

CREATE FUNCTION idem_append_only() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$fn$;

CREATE TABLE journal (
  seq     BIGSERIAL PRIMARY KEY,
  saga_id TEXT   NOT NULL REFERENCES sagas (saga_id),
  step_id TEXT   NOT NULL DEFAULT '',
  event   TEXT   NOT NULL,
  data    TEXT,
  at_ms   BIGINT NOT NULL
);
CREATE INDEX journal_by_saga ON journal (saga_id, seq);
CREATE TRIGGER journal_no_update_or_delete BEFORE UPDATE OR DELETE ON journal
  FOR EACH ROW EXECUTE FUNCTION idem_append_only('journal is append-only');
CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON journal
  FOR EACH STATEMENT EXECUTE FUNCTION idem_append_only('journal is append-only');

CREATE TABLE effects (
  idempotency_key TEXT      NOT NULL PRIMARY KEY,
  seq             BIGSERIAL NOT NULL UNIQUE,
  saga_id         TEXT      NOT NULL REFERENCES sagas (saga_id),
  step_id         TEXT      NOT NULL,
  kind            TEXT      NOT NULL,
  tool            TEXT      NOT NULL,
  result          TEXT,
  external_ref    TEXT      NOT NULL DEFAULT '',
  at_ms           BIGINT    NOT NULL
);
CREATE INDEX effects_by_saga ON effects (saga_id, seq);
CREATE TRIGGER effects_no_update_or_delete BEFORE UPDATE OR DELETE ON effects
  FOR EACH ROW EXECUTE FUNCTION idem_append_only('effects are append-only');
CREATE TRIGGER effects_no_truncate BEFORE TRUNCATE ON effects
  FOR EACH STATEMENT EXECUTE FUNCTION idem_append_only('effects are append-only');
