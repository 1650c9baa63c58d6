
-- Server state beside the journal (storage/server_state.h): the
-- Idempotency-Key records and the spec registry, which `idem serve` kept in a
-- --state file of its own before. IF NOT EXISTS: a key file of the
-- IdempotencyLayer made before this migration already holds `idempotency`
-- with these columns.
CREATE TABLE IF NOT EXISTS idempotency (
  scope        TEXT    NOT NULL,
  key          TEXT    NOT NULL,
  fingerprint  TEXT    NOT NULL,
  state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'done')),
  status       INTEGER NOT NULL DEFAULT 0,
  content_type TEXT    NOT NULL DEFAULT '',
  body         BLOB    NOT NULL DEFAULT x'',
  created_ms   INTEGER NOT NULL,
  claimed_ms   INTEGER NOT NULL,
  claim_token  TEXT    NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_by_created ON idempotency (created_ms);
CREATE TABLE IF NOT EXISTS server_specs (
  name        TEXT    NOT NULL,
  version     INTEGER NOT NULL,
  doc         TEXT    NOT NULL,
  fingerprint TEXT    NOT NULL,
  created_ms  INTEGER NOT NULL,
  created_by  TEXT    NOT NULL,
  PRIMARY KEY (name, version)
);
