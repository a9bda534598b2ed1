//! gkq-reader's integration tests, one binary (one link of the servers,
//! the fixtures and candle instead of seven): each module is a file that
//! was a test target of its own, its tests unchanged.

mod async_api;
mod integrity;
mod mirrors;
mod one_copy;
mod reader;
mod transport;
mod trust;
mod warm;
