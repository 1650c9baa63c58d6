
-- Lease updates as HOT updates (docs/bench.md, the resume of 10,000 sagas):
-- an update that changes no indexed column and finds room on its row's page
-- writes no index entry. sagas_by_state_lease had lease_expires_ms in it, so
-- each claim, renewal and release of a lease wrote a new entry in all six of
-- the sagas' indexes (123 us of server time per claim in the resume, more
-- than the saga's read). It is replaced by sagas_by_state on the state
-- alone: the lookups by state (ClaimSagas, the gauges, the listing by state)
-- read the saga's row for the lease anyway.
-- Fill factors: new pages keep room for the HOT versions of their rows,
-- sagas for its lease updates, steps for the two to four updates of each
-- step (none changes an indexed column). Rows already stored stay where
-- they are: no table is rewritten; building sagas_by_state reads the sagas
-- once (about a second per million).
CREATE INDEX sagas_by_state ON sagas (state);
DROP INDEX IF EXISTS sagas_by_state_lease;
ALTER TABLE sagas SET (fillfactor = 85);
ALTER TABLE steps SET (fillfactor = 70);
