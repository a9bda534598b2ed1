//! The compute kernels of ggml's block types (docs/FORMAT.md 3.5 gives
//! their bytes, which `gkq-format` knows): the dot product of a quantized
//! row with quantized activations, and the quantized matmul over it.
//!
//! - [`quantize_activations`]: activations to 8-bit blocks of 32 ([`Q8Block`]).
//! - [`RowDot`]: the dot product of one block type, the fastest kernel this
//!   CPU has (AVX2 with FMA and F16C, detected at run time), else the
//!   portable one; the kernels of a type are one entry of [`KERNELS`].
//! - [`matmul`]: the rows of one or more matrices among rayon's threads,
//!   each row meeting a tile of tokens while it is in cache.
//!
//! The f32 results are candle 0.11's bit for bit (its kernels were the
//! decoder's before these): activation quantization turns a last-bit
//! difference into another 8-bit code in the next layer.
//!
//! This crate is optimised in test builds (the workspace's profile): its
//! intrinsics are calls, not instructions, at opt-level 0.
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::needless_range_loop
)]
#![deny(missing_docs)]

#[cfg(target_arch = "x86_64")]
mod avx2;
mod matmul;
mod portable;
mod types;

use gkq_format::DType;

pub use matmul::{MatPart, matmul};
pub use portable::{Q8Block, quantize_activations};

/// A row's dot product: its blocks' bytes, the activations' blocks.
pub(crate) type Dot = fn(&[u8], &[Q8Block]) -> f32;
/// A row's dot products with four tokens' activations.
pub(crate) type Dot4 = fn(&[u8], [&[Q8Block]; 4]) -> [f32; 4];

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 with FMA and F16C.
    Avx2,
}

impl Isa {
    /// Its name, for reports (`avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
        }
    }
}

/// The kernels of one block type: the portable dot product, and the
/// SIMD ones (one token, four tokens) where an instruction set has them.
#[derive(Debug)]
pub struct Kernels {
    /// The block type.
    pub dtype: DType,
    portable: Dot,
    avx2: Option<(Dot, Dot4)>,
}

/// The AVX2 kernels of type `T` (none off x86-64).
const fn avx2_of<T: types::Ty>() -> Option<(Dot, Dot4)> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(avx2::kernels::<T>())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The kernels of every block type that has them, the one table of them:
/// a new type is an entry (the K types are multiplied by candle's kernels,
/// and have none yet).
pub static KERNELS: [Kernels; 5] = {
    use types::*;
    [
        kernels(DType::Q4_0, portable::dot_q4_0, avx2_of::<Q4_0>()),
        kernels(DType::Q4_1, portable::dot_q4_1, avx2_of::<Q4_1>()),
        kernels(DType::Q5_0, portable::dot_q5_0, avx2_of::<Q5_0>()),
        kernels(DType::Q5_1, portable::dot_q5_1, avx2_of::<Q5_1>()),
        kernels(DType::Q8_0, portable::dot_q8_0, avx2_of::<Q8_0>()),
    ]
};

/// One entry of [`KERNELS`].
const fn kernels(dtype: DType, portable: Dot, avx2: Option<(Dot, Dot4)>) -> Kernels {
    Kernels {
        dtype,
        portable,
        avx2,
    }
}

/// The dot product of rows of one block type with quantized activations.
#[derive(Clone, Copy, Debug)]
pub struct RowDot {
    dtype: DType,
    block_bytes: usize,
    isa: Isa,
    kernel: Dot,
    /// Four tokens at a time, where a SIMD kernel has it.
    kernel4: Option<Dot4>,
}

impl RowDot {
    /// The kernel of `dtype`, the CPU's fastest; `None` for a type
    /// without kernels.
    pub fn of(dtype: DType) -> Option<RowDot> {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            let k = KERNELS.iter().find(|k| k.dtype == dtype)?;
            if let Some((kernel, four)) = k.avx2 {
                return Some(RowDot {
                    isa: Isa::Avx2,
                    kernel,
                    kernel4: Some(four),
                    ..RowDot::portable(dtype)?
                });
            }
        }
        RowDot::portable(dtype)
    }

    /// The portable kernel of `dtype`, whatever the CPU (for tests).
    pub fn portable(dtype: DType) -> Option<RowDot> {
        let k = KERNELS.iter().find(|k| k.dtype == dtype)?;
        let (_, block_bytes) = dtype.block()?;
        Some(RowDot {
            dtype,
            block_bytes: usize::try_from(block_bytes).ok()?,
            isa: Isa::Portable,
            kernel: k.portable,
            kernel4: None,
        })
    }

    /// The instruction set of the kernel.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The block type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// `w · a`: `w` a row of whole blocks, `a` one block per 32 of its
    /// values. `None` when their lengths disagree.
    pub fn dot(&self, w: &[u8], a: &[Q8Block]) -> Option<f32> {
        (w.len() == a.len() * self.block_bytes).then(|| (self.kernel)(w, a))
    }

    /// `[w · a[0], …, w · a[3]]`, each block of `w` read once. `None` when
    /// a length disagrees.
    pub fn dot4(&self, w: &[u8], a: [&[Q8Block]; 4]) -> Option<[f32; 4]> {
        if a.iter().any(|a| w.len() != a.len() * self.block_bytes) {
            return None;
        }
        Some(match self.kernel4 {
            Some(k) => k(w, a),
            None => a.map(|a| (self.kernel)(w, a)),
        })
    }
}

#[cfg(test)]
mod tests;
