//! Event types and the Postgres event store.
