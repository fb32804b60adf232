//! Pure domain logic: state machines as `decide(state, command) -> Result<Vec<Event>, Error>` and
//! `evolve(state, event) -> state`, key encodings and validation. Nothing here performs I/O or
//! reads a clock: time is passed in by the caller.
