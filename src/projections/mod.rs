//! Read models, fed inline (same transaction as the append) or from the global feed.
