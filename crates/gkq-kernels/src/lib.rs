//! The compute kernels of ggml's block types (docs/FORMAT.md 3.5 gives
//! their bytes, which `gkq-format` knows): the dot product of a quantized
//! row with quantized activations, and the quantized matmul over it.
//!
//! - [`quantize_activations`]: activations to 8-bit blocks of 32
//!   ([`Q8Block`]), for the 32-value types; [`quantize_activations_k`]: to
//!   blocks of 256 with a scale per 32 ([`Q8KBlock`]), for the K types.
//! - [`RowDot`]: the dot product of one block type, the fastest kernel this
//!   CPU has (detected at run time: AVX-512 F/BW, then AVX2 with FMA and
//!   F16C, for Q4_K and Q6_K; AVX2 for the 32-value types), else the
//!   portable one; the kernels of a type are one entry of [`KERNELS`].
//! - [`matmul`]: the rows of one or more matrices among rayon's threads,
//!   each row meeting a tile of tokens while it is in cache.
//!
//! The 32-value types' f32 results are candle 0.11's bit for bit (its
//! kernels were the decoder's before these): activation quantization turns
//! a last-bit difference into another 8-bit code in the next layer. The K
//! types' are their portable kernels' bit for bit, in one order whatever
//! the vector width (`kquant.rs`).
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
#[cfg(target_arch = "x86_64")]
mod avx2k;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kquant;
mod matmul;
mod portable;
#[cfg(target_arch = "x86_64")]
mod simd256;
mod types;

use gkq_format::DType;

pub use kquant::{Q8KBlock, quantize_activations_k};
pub use matmul::{MatPart, matmul};
pub use portable::{Q8Block, quantize_activations};

/// A row's dot product: its blocks' bytes, the activations' blocks.
pub(crate) type Dot = fn(&[u8], &[Q8Block]) -> f32;
/// A row's dot products with four tokens' activations.
pub(crate) type Dot4 = fn(&[u8], [&[Q8Block]; 4]) -> [f32; 4];
/// A K type's row dot product, with 256-value activation blocks.
pub(crate) type DotK = fn(&[u8], &[Q8KBlock]) -> f32;
/// A K type's row dot products with four tokens' activations.
pub(crate) type DotK4 = fn(&[u8], [&[Q8KBlock]; 4]) -> [f32; 4];

/// One token's quantized activations, in the forms the kernels take (a
/// form not needed may be empty).
#[derive(Clone, Copy, Debug, Default)]
pub struct Token<'a> {
    /// Blocks of 32, for the 32-value types.
    pub q8: &'a [Q8Block],
    /// Blocks of 256, for the K types.
    pub q8k: &'a [Q8KBlock],
}

/// A block type's kernels: which activations they take, one token's and
/// (where the instruction set has it) four tokens'.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kern {
    /// With blocks of 32 ([`Q8Block`]).
    Q8(Dot, Option<Dot4>),
    /// With blocks of 256 ([`Q8KBlock`]).
    Q8K(DotK, Option<DotK4>),
}

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F and BW.
    Avx512,
}

impl Isa {
    /// Its name, for reports (`avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU has it.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The kernels of one block type: the portable dot product, and the
/// SIMD ones (one token, four tokens) where an instruction set has them,
/// the widest first.
#[derive(Debug)]
pub struct Kernels {
    /// The block type.
    pub dtype: DType,
    portable: Kern,
    simd: [Option<(Isa, Kern)>; 2],
    /// Whether the portable kernel multiplies when the CPU lacks the SIMD
    /// one (else the caller's fallback does: candle's, for the K types).
    portable_serves: bool,
}

/// The AVX2 kernels of type `T` (none off x86-64).
const fn avx2_of<T: types::Ty>() -> Option<(Isa, Kern)> {
    #[cfg(target_arch = "x86_64")]
    {
        let (one, four) = avx2::kernels::<T>();
        Some((Isa::Avx2, Kern::Q8(one, Some(four))))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// The AVX-512 and AVX2 kernels of a K type.
#[cfg(target_arch = "x86_64")]
const fn k_simd(avx512: (DotK, DotK4), avx2: (DotK, DotK4)) -> [Option<(Isa, Kern)>; 2] {
    [
        Some((Isa::Avx512, Kern::Q8K(avx512.0, Some(avx512.1)))),
        Some((Isa::Avx2, Kern::Q8K(avx2.0, Some(avx2.1)))),
    ]
}

/// The kernels of every block type that has them, the one table of them:
/// a new type is an entry (Q5_K is multiplied by candle's kernels, and has
/// none yet).
pub static KERNELS: [Kernels; 7] = {
    use types::*;
    #[cfg(target_arch = "x86_64")]
    let (q4k, q6k) = (
        k_simd(avx512::Q4_K, avx2k::Q4_K),
        k_simd(avx512::Q6_K, avx2k::Q6_K),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (q4k, q6k) = ([None, None], [None, None]);
    [
        small(DType::Q4_0, portable::dot_q4_0, avx2_of::<Q4_0>()),
        small(DType::Q4_1, portable::dot_q4_1, avx2_of::<Q4_1>()),
        small(DType::Q5_0, portable::dot_q5_0, avx2_of::<Q5_0>()),
        small(DType::Q5_1, portable::dot_q5_1, avx2_of::<Q5_1>()),
        small(DType::Q8_0, portable::dot_q8_0, avx2_of::<Q8_0>()),
        k_type(DType::Q4_K, kquant::dot_q4_k, q4k),
        k_type(DType::Q6_K, kquant::dot_q6_k, q6k),
    ]
};

/// An entry of [`KERNELS`] for a 32-value type.
const fn small(dtype: DType, portable: Dot, simd: Option<(Isa, Kern)>) -> Kernels {
    Kernels {
        dtype,
        portable: Kern::Q8(portable, None),
        simd: [simd, None],
        portable_serves: true,
    }
}

/// An entry of [`KERNELS`] for a K type: on a CPU without its SIMD kernel
/// candle's kernels are faster than the portable one.
const fn k_type(dtype: DType, portable: DotK, simd: [Option<(Isa, Kern)>; 2]) -> Kernels {
    Kernels {
        dtype,
        portable: Kern::Q8K(portable, None),
        simd,
        portable_serves: false,
    }
}

/// The dot product of rows of one block type with quantized activations.
#[derive(Clone, Copy, Debug)]
pub struct RowDot {
    dtype: DType,
    block_bytes: usize,
    isa: Isa,
    kern: Kern,
}

impl RowDot {
    /// The kernel of `dtype`, the CPU's fastest; `None` for a type
    /// without kernels, or a K type on a CPU without its SIMD kernel.
    pub fn of(dtype: DType) -> Option<RowDot> {
        let k = KERNELS.iter().find(|k| k.dtype == dtype)?;
        match k.simd.iter().flatten().find(|(isa, _)| isa.available()) {
            Some(&(isa, kern)) => Some(RowDot {
                isa,
                kern,
                ..RowDot::portable(dtype)?
            }),
            None => RowDot::portable(dtype).filter(|_| k.portable_serves),
        }
    }

    /// The kernel of `dtype` for instruction set `isa`, if it has one and
    /// this CPU has `isa` (for tests and benchmarks).
    pub fn with_isa(dtype: DType, isa: Isa) -> Option<RowDot> {
        if isa == Isa::Portable {
            return RowDot::portable(dtype);
        }
        let k = KERNELS.iter().find(|k| k.dtype == dtype)?;
        let &(isa, kern) = k.simd.iter().flatten().find(|(i, _)| *i == isa)?;
        isa.available().then_some(())?;
        Some(RowDot {
            isa,
            kern,
            ..RowDot::portable(dtype)?
        })
    }

    /// The portable kernel of `dtype`, whatever the CPU (for tests).
    pub fn portable(dtype: DType) -> Option<RowDot> {
        let k = KERNELS.iter().find(|k| k.dtype == dtype)?;
        let (_, block_bytes) = dtype.block()?;
        Some(RowDot {
            dtype,
            block_bytes: usize::try_from(block_bytes).ok()?,
            isa: Isa::Portable,
            kern: k.portable,
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

    /// Whether it takes blocks of 256 activations ([`Token::q8k`]).
    pub fn takes_q8k(&self) -> bool {
        matches!(self.kern, Kern::Q8K(..))
    }

    /// The blocks `a` holds for this kernel.
    fn blocks(&self, a: &Token<'_>) -> usize {
        match self.kern {
            Kern::Q8(..) => a.q8.len(),
            Kern::Q8K(..) => a.q8k.len(),
        }
    }

    /// `w · a`: `w` a row of whole blocks, `a` one block per block of it.
    /// `None` when their lengths disagree.
    pub fn dot(&self, w: &[u8], a: Token<'_>) -> Option<f32> {
        (w.len() == self.blocks(&a) * self.block_bytes).then(|| match self.kern {
            Kern::Q8(one, _) => one(w, a.q8),
            Kern::Q8K(one, _) => one(w, a.q8k),
        })
    }

    /// `[w · a[0], …, w · a[3]]`, each block of `w` read once. `None` when
    /// a length disagrees.
    pub fn dot4(&self, w: &[u8], a: [Token<'_>; 4]) -> Option<[f32; 4]> {
        if a.iter()
            .any(|a| w.len() != self.blocks(a) * self.block_bytes)
        {
            return None;
        }
        Some(match self.kern {
            Kern::Q8(_, Some(k)) => k(w, a.map(|a| a.q8)),
            Kern::Q8K(_, Some(k)) => k(w, a.map(|a| a.q8k)),
            Kern::Q8(k, None) => a.map(|a| k(w, a.q8)),
            Kern::Q8K(k, None) => a.map(|a| k(w, a.q8k)),
        })
    }
}

#[cfg(test)]
mod ktests;
#[cfg(test)]
mod tests;
