-- The event store: streams of versioned events, one head row per stream, and checkpoints for
-- subscribers of the global feed. See docs/adr/0001-event-store.md and 0002-global-feed.md.

-- One head row per stream. Appends compare-and-set `version` here, so two writers at the same
-- expected version can never both succeed.
CREATE TABLE streams (
    stream_id  text        PRIMARY KEY,
    version    bigint      NOT NULL CHECK (version >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE events (
    -- Insertion order. Assigned at INSERT, visible at COMMIT: never a subscriber's cursor on
    -- its own (see tx_id).
    position    bigserial   PRIMARY KEY,
    stream_id   text        NOT NULL REFERENCES streams (stream_id),
    -- 1-based; the stream's head row holds the last one.
    version     bigint      NOT NULL CHECK (version >= 1),
    -- Chosen by the command, so a retried append is recognised instead of duplicated.
    event_id    uuid        NOT NULL,
    type        text        NOT NULL,
    data        jsonb       NOT NULL,
    metadata    jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    -- The appending transaction. The global feed reads only rows whose transaction is older than
    -- every transaction still running, ordered by (tx_id, position).
    tx_id       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, version),
    CONSTRAINT events_event_id_key UNIQUE (event_id)
);

CREATE INDEX events_tx_id_position_idx ON events (tx_id, position);

-- One row per async projection: where in the global feed its read model is. Updated in the same
-- transaction as the read model, and locked FOR UPDATE SKIP LOCKED so one runner applies a batch.
CREATE TABLE projection_checkpoints (
    name       text        PRIMARY KEY,
    tx_id      xid8        NOT NULL DEFAULT '0',
    position   bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Feed subscribers LISTEN on `strata_events`; the event store sends one NOTIFY after its appends
-- commit (src/events/notifier.rs). Not a trigger: NOTIFY inside the appending transaction takes a
-- cluster-wide lock until its COMMIT is flushed, which halved append throughput (ADR 0002).
