-- Read model of the `stream_catalog` projection (src/projections/stream_catalog.rs): one row per
-- stream, for operators browsing the audit history. Fed from the global feed; may lag.
CREATE TABLE stream_catalog (
    stream_id         text        PRIMARY KEY,
    category          text        NOT NULL,
    version           bigint      NOT NULL,
    event_count       bigint      NOT NULL,
    first_recorded_at timestamptz NOT NULL,
    last_recorded_at  timestamptz NOT NULL,
    last_event_type   text        NOT NULL
);

CREATE INDEX stream_catalog_category_idx ON stream_catalog (category, stream_id);
