
-- Specs belong to whoever registered them (issue 12, item 6;
-- storage/server_state.h): a name is owned by the caller whose PUT created
-- it, only the owner adds versions, and `shared` lets every caller read and
-- run it. Names registered before this migration keep working for everyone
-- (shared), owned by whoever created their first version.
CREATE TABLE spec_owners (
  name       TEXT    NOT NULL PRIMARY KEY,
  owner      TEXT    NOT NULL,
  shared     INTEGER NOT NULL DEFAULT 0 CHECK (shared IN (0, 1)),
  created_ms BIGINT  NOT NULL
);
INSERT INTO spec_owners (name, owner, shared, created_ms)
  SELECT name, created_by, 1, created_ms FROM server_specs s
  WHERE version = (SELECT MIN(version) FROM server_specs t WHERE t.name = s.name);
-- Which spec a saga runs: the registry version (NULL for a spec given inline)
-- and the SHA-256 of its canonical text ('' for sagas older than this).
ALTER TABLE sagas ADD COLUMN spec_version INTEGER;
ALTER TABLE sagas ADD COLUMN spec_sha256 TEXT NOT NULL DEFAULT '';
