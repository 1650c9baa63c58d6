
-- Asynchronous completion (saga/completion.h): a step that waits for its
-- provider (`processing`) has one row here, written with the step in the
-- same transaction: when its status is asked next, until when (the tool's
-- completion window), and how often it was asked. A sweep reads only the
-- rows that are due (step_checks_due). The drift job's findings
-- (saga/reconcile.h) are recorded once per (kind, tool, key).
CREATE TABLE step_checks (
  saga_id       TEXT    NOT NULL REFERENCES sagas (saga_id),
  step_id       TEXT    NOT NULL,
  next_check_ms INTEGER NOT NULL,
  deadline_ms   INTEGER NOT NULL,
  checks        INTEGER NOT NULL DEFAULT 0,
  since_ms      INTEGER NOT NULL,
  PRIMARY KEY (saga_id, step_id)
);
CREATE INDEX step_checks_due ON step_checks (next_check_ms);
CREATE TABLE drift_findings (
  kind     TEXT    NOT NULL CHECK (kind IN ('effect_missing', 'orphan')),
  tool     TEXT    NOT NULL,
  key      TEXT    NOT NULL,
  saga_id  TEXT    NOT NULL DEFAULT '',
  step_id  TEXT    NOT NULL DEFAULT '',
  detail   TEXT    NOT NULL DEFAULT '',
  found_ms INTEGER NOT NULL,
  PRIMARY KEY (kind, tool, key)
);
CREATE INDEX effects_by_time ON effects (at_ms);
