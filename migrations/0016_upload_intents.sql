-- Pending upload intents of waiting builds, by expiry: what the intent-expiry reconciler looks
-- for, so that a pass reads only the streams of builds with an intent due instead of every
-- waiting build's stream (ADR 0018). Maintained inline by the `builds` projection
-- (src/projections/builds.rs): a row per intent reserved while the build waits, removed when
-- the intent completes, expires or is released, or the build leaves Waiting. An index for
-- finding work, never the authority: the reconciler decides on the build stream.
CREATE TABLE upload_intents (
    build_id   uuid        NOT NULL,
    intent_id  uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (build_id, intent_id)
);

CREATE INDEX upload_intents_expires_idx ON upload_intents (expires_at);

-- The pending intents of the builds waiting now, from their streams.
INSERT INTO upload_intents (build_id, intent_id, expires_at)
SELECT b.build_id, (e.data ->> 'intent')::uuid, (e.data ->> 'expires_at')::timestamptz
FROM builds b
JOIN events e ON e.stream_id = 'build-' || b.build_id::text AND e.type = 'UploadReserved.v1'
WHERE b.phase = 'waiting'
  AND NOT EXISTS (
      SELECT 1 FROM events x
      WHERE x.stream_id = e.stream_id
        AND ((x.type IN ('UploadCompleted.v1', 'IntentExpired.v1')
              AND x.data ->> 'intent' = e.data ->> 'intent')
          OR (x.type = 'ContextReleased.v1' AND x.data -> 'intents' ? (e.data ->> 'intent')))
  )
ON CONFLICT DO NOTHING;
