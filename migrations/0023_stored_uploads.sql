-- What each team's uploads take in the blob store, so an upload can be held to
-- STRATA_TEAM_MAX_STORED_UPLOADS inside the append that completes it (src/projections/
-- stored_uploads.rs, ADR 0032). A row per published generation of a `files-…` stream, removed
-- when the generation is retired or its object's bytes are deleted by garbage collection. A
-- team's stored bytes count each distinct archive once. An index for admission, never the
-- authority: the files and object streams are.
CREATE TABLE stored_uploads (
    team_id     text   NOT NULL,
    stream_id   text   NOT NULL,
    generation  bigint NOT NULL,
    blob_digest text   NOT NULL,
    size        bigint NOT NULL,
    PRIMARY KEY (stream_id, generation)
);

CREATE INDEX stored_uploads_team_idx ON stored_uploads (team_id);
CREATE INDEX stored_uploads_blob_idx ON stored_uploads (blob_digest);

-- The published generations not since retired, whose bytes no deletion recorded after the
-- publication has taken.
INSERT INTO stored_uploads (team_id, stream_id, generation, blob_digest, size)
SELECT b.team_id, p.stream_id, (p.data ->> 'generation')::bigint, p.data ->> 'blob_digest',
       (p.data ->> 'size')::bigint
FROM events p
JOIN builds b ON b.build_id = (p.data ->> 'build')::uuid
WHERE p.type = 'GenerationPublished.v1'
  AND NOT EXISTS (
      SELECT 1 FROM events r
      WHERE r.stream_id = p.stream_id AND r.type = 'GenerationRetired.v1'
        AND (r.data ->> 'generation')::bigint = (p.data ->> 'generation')::bigint
  )
  AND NOT EXISTS (
      SELECT 1 FROM events d
      WHERE d.stream_id = 'object-' || substr(p.data ->> 'blob_digest', 8)
        AND d.type = 'ObjectDeleted.v1' AND d.position > p.position
  )
ON CONFLICT DO NOTHING;
