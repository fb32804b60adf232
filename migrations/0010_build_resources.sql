-- What `GET /templates` and `GET /templates/{id}` answer per build besides its phase: the
-- resources it asked for (NULL = the server default) and when it reached a terminal phase.
-- Existing rows are filled from their build streams.
ALTER TABLE builds
    ADD COLUMN cpu_count   integer,
    ADD COLUMN memory_mb   integer,
    ADD COLUMN finished_at timestamptz;

UPDATE builds b
SET cpu_count = (e.data -> 'resources' ->> 'cpu_count')::integer,
    memory_mb = (e.data -> 'resources' ->> 'memory_mb')::integer
FROM events e
WHERE e.stream_id = 'build-' || b.build_id::text
  AND e.type = 'BuildRegistered.v1';

UPDATE builds b
SET finished_at = (
    SELECT min(e.recorded_at) FROM events e
    WHERE e.stream_id = 'build-' || b.build_id::text
      AND e.type IN ('BuildReady.v1', 'BuildFailed.v1')
)
WHERE b.phase IN ('ready', 'error');
