-- The operator page's charts over time (ADR 0031) read read models only, in a fixed number of
-- buckets, so their cost does not grow with the history: when a build was first acquired and
-- how many of its steps were cached or run (builds), what each GC pass measured (gc_passes),
-- and when each sandbox ran and was paused (sandbox_spans). All three are kept inline with the
-- appends; what existed before this migration is filled in from the events.

ALTER TABLE builds
    -- The first attempt's acquisition: its queue wait is acquired_at - queued_at.
    ADD COLUMN acquired_at  timestamptz,
    -- Step completions of every attempt, cached or run (executed or checkpointed).
    ADD COLUMN steps_cached integer NOT NULL DEFAULT 0,
    ADD COLUMN steps_run    integer NOT NULL DEFAULT 0;

UPDATE builds b SET queued_at = e.recorded_at
FROM events e
WHERE b.queued_at IS NULL
  AND e.stream_id = 'build-' || b.build_id::text
  AND e.type = 'BuildFrozen.v1';

UPDATE builds b SET acquired_at = a.first
FROM (SELECT stream_id, min(recorded_at) AS first FROM events
      WHERE type = 'AttemptAcquired.v1' GROUP BY stream_id) a
WHERE a.stream_id = 'build-' || b.build_id::text;

UPDATE builds b SET steps_cached = s.cached, steps_run = s.run
FROM (SELECT stream_id,
             count(*) FILTER (WHERE data->'outcome'->>'kind' = 'cached') AS cached,
             count(*) FILTER (WHERE data->'outcome'->>'kind' <> 'cached') AS run
      FROM events WHERE type = 'StepCompleted.v1' GROUP BY stream_id) s
WHERE s.stream_id = 'build-' || b.build_id::text;

CREATE INDEX builds_queued_at_idx ON builds (queued_at);
CREATE INDEX builds_acquired_at_idx ON builds (acquired_at);
CREATE INDEX builds_finished_at_idx ON builds (finished_at);
-- The builds list pages newest first over every build; without this each page sorted the
-- whole table (22 ms at 100k builds in `strata bench ui`).
CREATE INDEX builds_registered_idx ON builds (registered_at DESC, build_id DESC);

-- One row per `gcpass-{id}` stream. The measure (the store by class before the pass deleted,
-- the budget, what it deleted) is there for passes that ended with one (GcPassMeasured.v1).
CREATE TABLE gc_passes (
    pass_id         text        PRIMARY KEY,
    node            text        NOT NULL,
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    fenced_by       text,
    total_bytes     bigint,
    budget_bytes    bigint,
    deleted_objects bigint,
    deleted_bytes   bigint,
    -- {"rooted": {"objects": n, "bytes": n}, "<tier>": {...}}
    classes         jsonb
);

CREATE INDEX gc_passes_started_idx ON gc_passes (started_at);

INSERT INTO gc_passes (pass_id, node, started_at)
SELECT substr(stream_id, length('gcpass-') + 1), data->>'node', recorded_at
FROM events WHERE type = 'GcPassStarted.v1'
ON CONFLICT DO NOTHING;

UPDATE gc_passes g SET ended_at = e.recorded_at
FROM events e
WHERE e.type = 'GcPassEnded.v1' AND e.stream_id = 'gcpass-' || g.pass_id;

UPDATE gc_passes g SET fenced_by = e.data->>'by'
FROM events e
WHERE e.type = 'GcPassFenced.v1' AND e.stream_id = 'gcpass-' || g.pass_id;

-- A sandbox's life as spans, each closed by the next: `starting` from its request or a resume
-- to running (or, for a resume that failed, paused again), `running` to its pause or end,
-- `paused` to its resume or end. `to_at` is NULL while it lasts.
CREATE TABLE sandbox_spans (
    sandbox_id text        NOT NULL,
    -- The stream version of the event that opened the span (two may share a timestamp).
    opened_by  bigint      NOT NULL,
    state      text        NOT NULL CHECK (state IN ('starting', 'running', 'paused')),
    from_at    timestamptz NOT NULL,
    to_at      timestamptz,
    PRIMARY KEY (sandbox_id, opened_by)
);

CREATE INDEX sandbox_spans_open_idx ON sandbox_spans (sandbox_id) WHERE to_at IS NULL;

INSERT INTO sandbox_spans (sandbox_id, opened_by, state, from_at, to_at)
SELECT sandbox_id, version,
       CASE WHEN type = 'SandboxRunning.v1' THEN 'running'
            WHEN type IN ('SandboxRequested.v1', 'SandboxResumed.v1') THEN 'starting'
            ELSE 'paused' END,
       recorded_at, next_at
FROM (SELECT substr(stream_id, length('sandbox-') + 1) AS sandbox_id, version, type, recorded_at,
             lead(recorded_at) OVER (PARTITION BY stream_id ORDER BY version) AS next_at
      FROM events
      WHERE type IN ('SandboxRequested.v1', 'SandboxRunning.v1', 'SandboxPaused.v1',
                     'SandboxResumed.v1', 'SandboxResumeFailed.v1', 'SandboxEnded.v1')) lives
WHERE type <> 'SandboxEnded.v1'
ON CONFLICT DO NOTHING;
