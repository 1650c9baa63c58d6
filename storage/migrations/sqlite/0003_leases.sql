
ALTER TABLE sagas ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';
ALTER TABLE sagas ADD COLUMN lease_expires_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sagas ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sagas_by_state_lease ON sagas (state, lease_expires_ms);
