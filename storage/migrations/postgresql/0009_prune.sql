
-- Retention (storage/prune.h): a finished saga's inputs and results may be
-- removed or redacted. The saga records when (pruned_at_ms); the journal and
-- the effects stay append-only except for one column (TG_ARGV[1]) of a
-- pruned saga's rows, which the prune rewrites once. Re-runnable (IF NOT
-- EXISTS, OR REPLACE), as migrations 5 and 6: the migration tests rebuild
-- older databases from the current schema.
ALTER TABLE sagas ADD COLUMN IF NOT EXISTS pruned_at_ms BIGINT;

CREATE OR REPLACE FUNCTION idem_append_only_unless_pruned() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'UPDATE'
     AND (to_jsonb(NEW) - TG_ARGV[1]) = (to_jsonb(OLD) - TG_ARGV[1])
     AND EXISTS (SELECT 1 FROM sagas WHERE saga_id = OLD.saga_id AND pruned_at_ms IS NOT NULL) THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$fn$;
DROP TRIGGER journal_no_update_or_delete ON journal;
CREATE TRIGGER journal_no_update_or_delete BEFORE UPDATE OR DELETE ON journal
  FOR EACH ROW EXECUTE FUNCTION idem_append_only_unless_pruned('journal is append-only', 'data');
DROP TRIGGER effects_no_update_or_delete ON effects;
CREATE TRIGGER effects_no_update_or_delete BEFORE UPDATE OR DELETE ON effects
  FOR EACH ROW EXECUTE FUNCTION idem_append_only_unless_pruned('effects are append-only', 'result');

-- `doc` with the value of every member named in `fields`, at any depth,
-- replaced by "[redacted]" (storage/prune.cc's PruneDocument).
CREATE OR REPLACE FUNCTION idem_redact(doc jsonb, fields text[]) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  out jsonb;
  k text;
  v jsonb;
BEGIN
  IF doc IS NULL THEN
    RETURN NULL;
  ELSIF jsonb_typeof(doc) = 'object' THEN
    out := '{}'::jsonb;
    FOR k, v IN SELECT * FROM jsonb_each(doc) LOOP
      IF k = ANY (fields) THEN
        out := out || jsonb_build_object(k, '[redacted]'::text);
      ELSE
        out := out || jsonb_build_object(k, idem_redact(v, fields));
      END IF;
    END LOOP;
    RETURN out;
  ELSIF jsonb_typeof(doc) = 'array' THEN
    SELECT coalesce(jsonb_agg(idem_redact(e, fields) ORDER BY n), '[]'::jsonb) INTO out
      FROM jsonb_array_elements(doc) WITH ORDINALITY AS t (e, n);
    RETURN out;
  END IF;
  RETURN doc;
END
$fn$;

-- A journal entry's data with the members in `fields` set to null where
-- present (storage/prune.cc's PruneJournalData without redaction).
CREATE OR REPLACE FUNCTION idem_null_members(doc jsonb, fields text[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
  SELECT CASE WHEN doc IS NULL OR jsonb_typeof(doc) <> 'object' THEN doc
    ELSE doc || coalesce((SELECT jsonb_object_agg(k, 'null'::jsonb)
                          FROM jsonb_object_keys(doc) AS k WHERE k = ANY (fields)), '{}'::jsonb)
  END
$fn$;
CREATE INDEX IF NOT EXISTS sagas_prunable ON sagas (updated_ms) WHERE pruned_at_ms IS NULL;
