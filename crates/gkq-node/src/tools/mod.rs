//! The node tools whose work is more than a library call: their flags
//! (clap) and their output, each run by a thin binary.

pub mod inspect;
pub mod rows;
