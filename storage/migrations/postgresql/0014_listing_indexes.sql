-- Listings in the database, at a cost that does not grow with the journal
-- (docs/bench.md, "Cost as the journal grows"). Both indexes are written
-- once, when a saga is created (created_ms and intent_key never change), so
-- only a step that moves a saga adds to them (PostgreSQL writes a new entry
-- in every index of a row updated without HOT, and sagas_by_state_lease
-- already rules HOT out).
-- The newest sagas first, for a listing over all owners; COLLATE "C" as in
-- the listing's ORDER BY.
CREATE INDEX sagas_by_created ON sagas (created_ms DESC, saga_id COLLATE "C");
-- One owner's sagas, newest first: the owner is the intent key's part before
-- the first ':' ('' without one), the same expression as PgStore's listing
-- query.
CREATE INDEX sagas_by_owner ON sagas ((CASE WHEN strpos(intent_key, ':') = 0 THEN ''
                                       ELSE substr(intent_key, 1, strpos(intent_key, ':') - 1) END)
                                      COLLATE "C", created_ms DESC, saga_id COLLATE "C");
