-- Fewer index entries per step (docs/bench.md, the WAL of a step by record
-- type): a three-step saga inserted 52 index entries, a third of its WAL.
-- Dropped here are three indexes that no query needs:
-- - sagas_by_state: sagas_by_state_lease leads with the state and serves
--   every lookup by state (as on SQLite since version 4); a saga's insert
--   and each update that moves it wrote an entry in both.
-- - the journal's primary key on seq: seq comes from its sequence, and every
--   read of the journal goes through journal_by_saga (saga_id, seq), the
--   prune's rewrite included; one entry per journal line.
-- - effects' unique seq: the same; effects are read through effects_by_saga
--   (saga_id, seq) and effects_by_time (at_ms), and stay unique by their
--   idempotency key.
-- Metadata only: nothing is rewritten, whatever the journal's size.
DROP INDEX IF EXISTS sagas_by_state;
ALTER TABLE journal DROP CONSTRAINT IF EXISTS journal_pkey;
ALTER TABLE effects DROP CONSTRAINT IF EXISTS effects_seq_key;
