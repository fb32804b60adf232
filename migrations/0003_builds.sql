-- Read model of build streams, maintained inline (src/projections/builds.rs) in the same
-- transaction as every append to a `build-…` stream, so it is exact. It serves the worker's
-- queue, the reconcilers' scans and listings; decisions still re-read the stream.
CREATE TABLE builds (
    build_id         uuid        PRIMARY KEY,
    template_id      text        NOT NULL,
    team_id          text        NOT NULL,
    -- waiting | queued | active | publishing | ready | error
    phase            text        NOT NULL,
    epoch            bigint,
    node             text,
    lease_expires_at timestamptz,
    -- The waiting deadline, then (after start) the queue deadline.
    deadline         timestamptz,
    registered_at    timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- Version of the build stream this row reflects.
    stream_version   bigint      NOT NULL
);

CREATE INDEX builds_queued_idx ON builds (registered_at) WHERE phase = 'queued';
CREATE INDEX builds_leased_idx ON builds (lease_expires_at) WHERE phase IN ('active', 'publishing');
CREATE INDEX builds_deadline_idx ON builds (deadline) WHERE phase IN ('waiting', 'queued');
CREATE INDEX builds_template_idx ON builds (template_id, registered_at DESC);

-- Build logs as the status endpoint pages them. Not events: they decide nothing and would race
-- lease renewals for the build stream's version. `seq` is the SDK's `logsOffset` index; rows are
-- only ever appended. `epoch` says which attempt wrote the line.
CREATE TABLE build_logs (
    build_id  uuid        NOT NULL,
    seq       bigint      NOT NULL CHECK (seq >= 0),
    epoch     bigint,
    logged_at timestamptz NOT NULL,
    level     text        NOT NULL CHECK (level IN ('debug', 'info', 'warn', 'error')),
    message   text        NOT NULL,
    step      text,
    PRIMARY KEY (build_id, seq)
);
