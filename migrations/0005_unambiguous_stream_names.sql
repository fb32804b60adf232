-- Stream names become an unambiguous encoding (docs/adr/0009-stream-names-and-command-ids.md):
-- the components of a multi-part name are joined with `:`, which no id or name may contain,
-- instead of `-`, which they may. `templatename-{team}-{name}` made team `acme-corp`'s `x` and
-- team `acme`'s `corp-x` one stream.
--
--   templatename-{team}-{name}  -> templatename-{team}:{name}
--   files-{scope}-{hash}        -> files-{scope}:{hash}
--   cachekey-{scope}-{key}      -> cachekey-{scope}:{key}
--   promotion-{build}-{epoch}   -> promotion-{build}:{epoch}
--
-- Events are moved, never changed: their payloads, ids, positions and transaction ids stay as
-- stored, so the global feed and every projection checkpoint are untouched; only `stream_id`
-- (and, where an old shared name is split in two, `version`) is rewritten, with the stream head
-- rows and the stream catalog rows to match. Single-part names (`team-`, `template-`, `build-`,
-- `snapshot-`, `object-`) are already their own encoding and are not touched.
--
-- The team of a name claim is not in its stream name (that was the defect) and not in its events
-- (`NameClaimed.v1` carries only the template): it is read from the claimed template's
-- `TemplateRegistered.v1`, per event, so a shared old stream whose claims belong to two teams is
-- split into each team's own stream. The fixed-length parts (64 hex digits, a 36-character UUID)
-- make the old files, cachekey and promotion names decodable by pattern.

CREATE TEMPORARY TABLE stream_renames ON COMMIT DROP AS
SELECT e.position,
       e.stream_id AS old_id,
       CASE
           WHEN e.stream_id ~ '^files-.+-[0-9a-f]{64}$'
               THEN regexp_replace(e.stream_id, '^files-(.+)-([0-9a-f]{64})$', 'files-\1:\2')
           WHEN e.stream_id ~ '^cachekey-.+-[0-9a-f]{64}$'
               THEN regexp_replace(e.stream_id, '^cachekey-(.+)-([0-9a-f]{64})$', 'cachekey-\1:\2')
           WHEN e.stream_id ~ '^promotion-[0-9a-f-]{36}-[0-9]+$'
               THEN regexp_replace(e.stream_id, '^promotion-([0-9a-f-]{36})-([0-9]+)$', 'promotion-\1:\2')
           WHEN starts_with(e.stream_id, 'templatename-' || owner.team || '-')
               THEN 'templatename-' || owner.team || ':'
                    || substr(e.stream_id, length('templatename-' || owner.team || '-') + 1)
       END AS new_id,
       e.version AS old_version
FROM events e
LEFT JOIN LATERAL (
    SELECT r.data ->> 'team' AS team
    FROM events r
    WHERE r.stream_id = 'template-' || (e.data ->> 'template')
      AND r.type = 'TemplateRegistered.v1'
    ORDER BY r.version
    LIMIT 1
) owner ON starts_with(e.stream_id, 'templatename-')
WHERE starts_with(e.stream_id, 'templatename-')
   OR starts_with(e.stream_id, 'files-')
   OR starts_with(e.stream_id, 'cachekey-')
   OR starts_with(e.stream_id, 'promotion-');

DO $$
DECLARE
    bad text;
BEGIN
    SELECT old_id INTO bad FROM stream_renames
    WHERE new_id IS NULL OR new_id ~ '~' OR new_id ~ ':.*:' OR new_id !~ ':'
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'stream % does not have a recognised pre-0005 name (or its claimed template has no TemplateRegistered.v1 event); repair it before migrating', bad;
    END IF;
END
$$;

-- Versions within each new stream, in the old order (identity unless an old name is split).
ALTER TABLE stream_renames ADD COLUMN new_version bigint;
UPDATE stream_renames r
SET new_version = n.v
FROM (
    SELECT position, row_number() OVER (PARTITION BY new_id ORDER BY old_version) AS v
    FROM stream_renames
) n
WHERE n.position = r.position;

INSERT INTO streams (stream_id, version, created_at, updated_at)
SELECT r.new_id, max(r.new_version), min(s.created_at), max(s.updated_at)
FROM stream_renames r
JOIN streams s ON s.stream_id = r.old_id
GROUP BY r.new_id;

UPDATE events e
SET stream_id = r.new_id, version = r.new_version
FROM stream_renames r
WHERE e.position = r.position;

DELETE FROM streams s
WHERE s.stream_id IN (SELECT old_id FROM stream_renames);

-- The catalog (an asynchronous projection) keeps covering exactly the events its checkpoint has
-- passed: the renamed streams' rows are rebuilt from those events under their new names.
DELETE FROM stream_catalog c
WHERE c.stream_id IN (SELECT old_id FROM stream_renames);

INSERT INTO stream_catalog
    (stream_id, category, version, event_count, first_recorded_at, last_recorded_at, last_event_type)
SELECT DISTINCT ON (e.stream_id)
       e.stream_id,
       split_part(e.stream_id, '-', 1),
       e.version,
       count(*) OVER w,
       min(e.recorded_at) OVER w,
       e.recorded_at,
       e.type
FROM events e
JOIN projection_checkpoints cp ON cp.name = 'stream_catalog'
WHERE e.position IN (SELECT position FROM stream_renames)
  AND (e.tx_id, e.position) <= (cp.tx_id, cp.position)
WINDOW w AS (PARTITION BY e.stream_id)
ORDER BY e.stream_id, e.version DESC;
