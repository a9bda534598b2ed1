//! The 32-value block types as the SIMD kernels see them: a marker type
//! each, with its block's size, whether it has a minimum, and where its
//! codes are. The kernels are generic over them, so that each type's
//! choices are made when it is compiled.

/// Where a block type's codes are, and how they read as bytes.
#[derive(Clone, Copy)]
pub(crate) enum Codes {
    /// Nibbles at `qs`, unsigned (Q4_1; Q4_0 has kernels of its own,
    /// `packed.rs`).
    Nib4 { qs: usize },
    /// Nibbles at `qs` and fifth bits at `qh`: less 16 when `signed` (Q5_0),
    /// else unsigned (Q5_1).
    Nib5 { qh: usize, qs: usize, signed: bool },
    /// Signed bytes at `qs` (Q8_0).
    Int8 { qs: usize },
}

/// A 32-value block type, as the kernels see it.
pub(crate) trait Ty {
    /// Bytes of a block.
    const BYTES: usize;
    /// Whether it has a minimum (its codes are then unsigned).
    const MIN: bool;
    /// Its codes.
    const CODES: Codes;
}

/// Q4_1.
#[derive(Debug)]
pub(crate) struct Q4_1;
/// Q5_0.
#[derive(Debug)]
pub(crate) struct Q5_0;
/// Q5_1.
#[derive(Debug)]
pub(crate) struct Q5_1;
/// Q8_0.
#[derive(Debug)]
pub(crate) struct Q8_0;

impl Ty for Q4_1 {
    const BYTES: usize = 20;
    const MIN: bool = true;
    const CODES: Codes = Codes::Nib4 { qs: 4 };
}

impl Ty for Q5_0 {
    const BYTES: usize = 22;
    const MIN: bool = false;
    const CODES: Codes = Codes::Nib5 {
        qh: 2,
        qs: 6,
        signed: true,
    };
}

impl Ty for Q5_1 {
    const BYTES: usize = 24;
    const MIN: bool = true;
    const CODES: Codes = Codes::Nib5 {
        qh: 4,
        qs: 8,
        signed: false,
    };
}

impl Ty for Q8_0 {
    const BYTES: usize = 34;
    const MIN: bool = false;
    const CODES: Codes = Codes::Int8 { qs: 2 };
}
