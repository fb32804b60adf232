-- Fair share across teams (ADR 0024).
--
-- What a team holds, counted inside the append that would add to it (src/projections/
-- team_usage.rs): builds by team and phase, so the count reads one index range and a
-- SERIALIZABLE append conflicts only with appends of the same team's builds.
CREATE INDEX builds_team_phase_idx ON builds (team_id, phase);

-- When each team last had a build start: between teams with as many builds running, the queue
-- goes to the one served longest ago. Maintained inline by the `builds` projection on every
-- acquired attempt; an index for ordering the queue, never the authority.
CREATE TABLE team_turns (
    team_id         text        PRIMARY KEY,
    last_started_at timestamptz NOT NULL
);

INSERT INTO team_turns (team_id, last_started_at)
SELECT b.team_id, max(e.recorded_at)
FROM builds b
JOIN events e ON e.stream_id = 'build-' || b.build_id::text AND e.type = 'AttemptAcquired.v1'
GROUP BY b.team_id;
