-- The database's identity: one random UUID, made when this migration runs. The blob store
-- records the identity of the one database whose references decide what garbage collection
-- deletes from it (its owner marker, docs/adr/0019); a pass connected to any other database
-- refuses to run. A copy of the database (CREATE DATABASE ... TEMPLATE, a restored dump) carries
-- the identity with it: give a copy that must not own the store a new one with
-- `UPDATE store_identity SET id = gen_random_uuid()`.
CREATE TABLE store_identity (
    -- Always true: the table holds at most one row.
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    id         uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO store_identity (id) VALUES (gen_random_uuid());
