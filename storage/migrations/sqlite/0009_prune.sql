
-- Retention (storage/prune.h): a finished saga's inputs and results may be
-- removed or redacted. The saga records when (pruned_at_ms); the journal and
-- the effects stay append-only except for the data of a pruned saga, which
-- the prune rewrites once in the transaction that marks it.
ALTER TABLE sagas ADD COLUMN pruned_at_ms INTEGER;
DROP TRIGGER journal_no_update;
CREATE TRIGGER journal_no_update BEFORE UPDATE ON journal
WHEN NEW.seq IS NOT OLD.seq OR NEW.saga_id IS NOT OLD.saga_id OR NEW.step_id IS NOT OLD.step_id
  OR NEW.event IS NOT OLD.event OR NEW.at_ms IS NOT OLD.at_ms
  OR (SELECT pruned_at_ms FROM sagas WHERE saga_id = OLD.saga_id) IS NULL
BEGIN
  SELECT RAISE(ABORT, 'journal is append-only');
END;
DROP TRIGGER effects_no_update;
CREATE TRIGGER effects_no_update BEFORE UPDATE ON effects
WHEN NEW.idempotency_key IS NOT OLD.idempotency_key OR NEW.saga_id IS NOT OLD.saga_id
  OR NEW.step_id IS NOT OLD.step_id OR NEW.kind IS NOT OLD.kind OR NEW.tool IS NOT OLD.tool
  OR NEW.external_ref IS NOT OLD.external_ref OR NEW.at_ms IS NOT OLD.at_ms
  OR (SELECT pruned_at_ms FROM sagas WHERE saga_id = OLD.saga_id) IS NULL
BEGIN
  SELECT RAISE(ABORT, 'effects are append-only');
END;
CREATE INDEX sagas_prunable ON sagas (updated_ms) WHERE pruned_at_ms IS NULL;
