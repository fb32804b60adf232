-- Registry credentials a started build brought (`fromImageRegistry`), sealed with authenticated
-- encryption under a key derived from the server secret (src/registry/sealed.rs). Never an
-- event: the worker that holds the build's active attempt opens them, and the row is deleted
-- in the same transaction that ends the build (the inline builds projection).
CREATE TABLE build_credentials (
    build_id   uuid        PRIMARY KEY,
    sealed     bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
