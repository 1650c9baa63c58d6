
ALTER TABLE sagas
  ADD COLUMN lease_owner      TEXT   NOT NULL DEFAULT '',
  ADD COLUMN lease_expires_ms BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN lease_epoch      BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sagas_by_state_lease ON sagas (state, lease_expires_ms);
