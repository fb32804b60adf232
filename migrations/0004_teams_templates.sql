-- API keys by their sha256, maintained inline from `team-…` streams
-- (src/projections/api_keys.rs): authentication must see a key the moment it is issued and
-- stop accepting it the moment it is revoked.
CREATE TABLE api_keys (
    key_sha256 text        PRIMARY KEY,
    key_id     uuid        NOT NULL UNIQUE,
    team_id    text        NOT NULL,
    prefix     text        NOT NULL,
    issued_at  timestamptz NOT NULL,
    revoked_at timestamptz
);

CREATE INDEX api_keys_team_idx ON api_keys (team_id);

-- Templates by team, maintained inline from `template-…` streams
-- (src/projections/templates.rs), for listings. Decisions read the streams.
CREATE TABLE templates (
    template_id  text        PRIMARY KEY,
    team_id      text        NOT NULL,
    names        text[]      NOT NULL DEFAULT '{}',
    build_count  bigint      NOT NULL DEFAULT 0,
    latest_build uuid,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    deleted      boolean     NOT NULL DEFAULT false
);

CREATE INDEX templates_team_idx ON templates (team_id) WHERE NOT deleted;
