
-- Durable control requests (storage/control_store.h): at most one pending
-- cancel, pause or resume per saga, honoured by whichever process drives it
-- and removed once carried out. The history of requests is the journal's
-- (`<kind>_requested` entries written with the row). IF NOT EXISTS, as in 5.
CREATE TABLE IF NOT EXISTS saga_controls (
  saga_id      TEXT    NOT NULL PRIMARY KEY REFERENCES sagas (saga_id),
  request_id   TEXT    NOT NULL,
  kind         TEXT    NOT NULL CHECK (kind IN ('cancel', 'pause', 'resume')),
  requested_by TEXT    NOT NULL,
  reason       TEXT    NOT NULL,
  requested_ms INTEGER  NOT NULL
);
