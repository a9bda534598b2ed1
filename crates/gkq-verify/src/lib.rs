//! Release gate (in progress).
