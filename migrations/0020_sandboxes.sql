-- Launched sandboxes (ADR 0028): the read model of `sandbox-{id}` streams, kept inline with
-- every append (src/projections/sandboxes.rs), so a create call sees its sandbox running the
-- moment the node's append commits, and listing never shows an ended sandbox.
CREATE TABLE sandboxes (
    sandbox_id      text        PRIMARY KEY,
    team_id         text        NOT NULL,
    template_id     text        NOT NULL,
    alias           text        NOT NULL,
    build_id        uuid        NOT NULL,
    snapshot_id     uuid        NOT NULL,
    -- requested | placed | running | ended
    state           text        NOT NULL,
    end_reason      text,
    end_detail      text,
    node_id         text,
    epoch           bigint      NOT NULL DEFAULT 0,
    agent_url       text,
    envd_token      text        NOT NULL,
    metadata        jsonb       NOT NULL,
    env_vars        jsonb       NOT NULL,
    allow_internet  boolean     NOT NULL,
    timeout_secs    integer     NOT NULL,
    cpu_count       integer     NOT NULL,
    memory_mb       integer     NOT NULL,
    requested_at    timestamptz NOT NULL,
    started_at      timestamptz,
    end_at          timestamptz,
    ended_at        timestamptz
);

CREATE INDEX sandboxes_team_state_idx ON sandboxes (team_id, state, requested_at);
CREATE INDEX sandboxes_requested_idx ON sandboxes (requested_at) WHERE state = 'requested';
CREATE INDEX sandboxes_live_node_idx ON sandboxes (node_id) WHERE state IN ('placed', 'running');
