-- Open sagas (saga/open_saga.h): the calls an agent appended, one step each.
-- A call id (the model's tool-call id) names one step of its saga, once: the
-- primary key refuses a second step for it, in any process. The saga's
-- frozen plan (sagas.spec) grows with each call in the same transaction.
CREATE TABLE open_calls (
  saga_id    TEXT    NOT NULL REFERENCES sagas (saga_id),
  call_id    TEXT    NOT NULL,
  step_idx   INTEGER NOT NULL,
  created_ms INTEGER  NOT NULL,
  PRIMARY KEY (saga_id, call_id),
  UNIQUE (saga_id, step_idx)
);
