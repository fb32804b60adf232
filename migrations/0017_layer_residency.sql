-- Which build node holds which extracted layers in its local cache: a hint for cache-aware
-- placement (src/worker/residency.rs, ADR 0020). Not events: a row says something about one
-- node's disk, only that node writes it (replacing its whole set when it starts, then the
-- changes as its cache gains and evicts layers), and no decision depends on it being right:
-- a build claimed on a wrong hint fetches its layers from the blob store.
CREATE TABLE cache_nodes (
    node_id    text        PRIMARY KEY,
    -- The node's last report, by the database clock.
    seen_at    timestamptz NOT NULL,
    -- Its residency counts until then: a node that stops reporting (dead, stopped, cut off)
    -- stops attracting builds without anyone deleting its rows.
    expires_at timestamptz NOT NULL
);

CREATE TABLE layer_residency (
    node_id text   NOT NULL REFERENCES cache_nodes (node_id) ON DELETE CASCADE,
    -- `sha256:<hex>` of the layer tar (its diff id).
    digest  text   NOT NULL,
    -- Bytes of the extracted tree on that node.
    bytes   bigint NOT NULL,
    PRIMARY KEY (node_id, digest)
);

CREATE INDEX layer_residency_digest_idx ON layer_residency (digest);

-- When a build was queued (its `BuildFrozen`), so a node can tell how long a build waited for
-- the node that holds its cache; maintained by the inline `builds` projection.
ALTER TABLE builds ADD COLUMN queued_at timestamptz;

UPDATE builds b SET queued_at = e.recorded_at
FROM events e
WHERE b.phase = 'queued'
  AND e.stream_id = 'build-' || b.build_id::text
  AND e.type = 'BuildFrozen.v1';
