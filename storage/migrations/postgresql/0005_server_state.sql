
-- Server state beside the journal (storage/server_state.h): the
-- Idempotency-Key records and the spec registry, shared by every `idem serve`
-- process on this database. IF NOT EXISTS, as on SQLite.
CREATE TABLE IF NOT EXISTS idempotency (
  scope        TEXT    NOT NULL,
  key          TEXT    NOT NULL,
  fingerprint  TEXT    NOT NULL,
  state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'done')),
  status       INTEGER NOT NULL DEFAULT 0,
  content_type TEXT    NOT NULL DEFAULT '',
  body         BYTEA   NOT NULL DEFAULT ''::bytea,
  created_ms   BIGINT  NOT NULL,
  claimed_ms   BIGINT  NOT NULL,
  claim_token  TEXT    NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_by_created ON idempotency (created_ms);
CREATE TABLE IF NOT EXISTS server_specs (
  name        TEXT    NOT NULL,
  version     INTEGER NOT NULL,
  doc         TEXT    NOT NULL,
  fingerprint TEXT    NOT NULL,
  created_ms  BIGINT  NOT NULL,
  created_by  TEXT    NOT NULL,
  PRIMARY KEY (name, version)
);
