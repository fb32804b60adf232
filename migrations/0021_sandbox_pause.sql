-- Pausing launched sandboxes (ADR 0028): `pausing` and `paused` join the states, a paused
-- sandbox remembers when it paused, a request may ask to pause at its deadline, and a failed
-- resume's reason is kept beside the row (`end_detail` stays the reason it ended).
ALTER TABLE sandboxes
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN auto_pause boolean NOT NULL DEFAULT false,
    ADD COLUMN resume_detail text;

DROP INDEX sandboxes_live_node_idx;
CREATE INDEX sandboxes_live_node_idx ON sandboxes (node_id) WHERE state IN ('placed', 'running', 'pausing');
