-- Listings in the database, at a cost that does not grow with the journal
-- (docs/bench.md, "Cost as the journal grows"). Both indexes are written
-- once, when a saga is created (created_ms and intent_key never change), so
-- a step's update touches neither.
-- The newest sagas first, for a listing over all owners.
CREATE INDEX sagas_by_created ON sagas (created_ms DESC, saga_id);
-- One owner's sagas, newest first: the owner is the intent key's part before
-- the first ':' ('' without one), the same expression as SqliteStore's
-- listing query.
CREATE INDEX sagas_by_owner ON sagas (substr(intent_key, 1, instr(intent_key, ':') - 1),
                                      created_ms DESC, saga_id);
-- One state's sagas, newest first (the inbox's state filter), without
-- sorting all of that state's sagas: sagas_by_state_lease keeps its name
-- and its uses (counts by state from the index alone, claims and sweeps of
-- the unfinished states, the lease filtered in the index) and gains the
-- listing's order. A step that moves a saga rewrites one entry of it, as
-- before.
DROP INDEX sagas_by_state_lease;
CREATE INDEX sagas_by_state_lease ON sagas (state, created_ms DESC, saga_id, lease_expires_ms);
