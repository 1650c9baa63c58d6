
ALTER TABLE steps ADD COLUMN phase TEXT;
CREATE TABLE consumed_tokens (
  nonce   TEXT   NOT NULL PRIMARY KEY,
  saga_id TEXT   NOT NULL REFERENCES sagas (saga_id),
  step_id TEXT   NOT NULL,
  at_ms   BIGINT NOT NULL
);
