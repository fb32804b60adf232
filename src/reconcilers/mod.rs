//! Reconcilers: independent workers that replay streams and drive state forward.
