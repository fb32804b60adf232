-- A sandbox created with `network.allowPublicTraffic: false` keeps the token its ports ask for
-- (E2B's `trafficAccessToken`); NULL: its ports are public (every sandbox before this).
ALTER TABLE sandboxes ADD COLUMN traffic_token text;
