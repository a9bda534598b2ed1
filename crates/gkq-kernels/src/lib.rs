//! The compute kernels of ggml's block types (docs/FORMAT.md 3.5 gives
//! their bytes, which `gkq-format` knows): the dot product of a quantized
//! row with quantized activations, and the quantized matmul over it.
//!
//! - [`quantize_activations`]: activations to 8 bits with a scale per 32
//!   ([`Q8Acts`]), for the 32-value types; [`quantize_activations_k`]: the
//!   same codes and scales in blocks of 256 ([`Q8KBlock`]), for the K types.
//! - [`RowDot`]: the dot product of one block type, the fastest kernel this
//!   CPU has (detected at run time: AVX-512 F/BW with VNNI, then AVX2 with
//!   FMA and F16C), else the portable one; the kernels of a type are one
//!   entry of [`KERNELS`]. Q4_0's, Q4_K's and Q6_K's take their rows
//!   packed sixteen at a time ([`RowDot::pack`], `packed.rs`).
//! - [`matmul`]: the rows of one or more matrices among rayon's threads,
//!   each row meeting a tile of tokens while it is in cache.
//! - [`quantize_seen`]: weights to a block type, with their dequantized
//!   values (gkq-pack's `--quant`), the 32-value types in AVX2 where the CPU
//!   has it, the reference quantizers' bytes; [`Differences`]: the squared
//!   and largest errors of those values, by lanes, in f64.
//!
//! Every kernel gives its portable kernel's bits, in one order whatever the
//! vector width (`portable.rs`, `packed.rs`): activation quantization turns
//! a last-bit difference into another 8-bit code in the next layer, so a
//! node's tokens do not depend on its CPU.
//!
//! This crate is optimised in test builds (the workspace's profile): its
//! intrinsics are calls, not instructions, at opt-level 0.
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::needless_range_loop
)]
#![deny(missing_docs)]

mod activation;
mod attn;
#[cfg(target_arch = "x86_64")]
mod attn_x86;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512q;
mod kquant;
mod matmul;
mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_x86;
mod portable;
#[cfg(target_arch = "x86_64")]
mod simd256;
mod types;
mod weights;
#[cfg(target_arch = "x86_64")]
mod weights_x86;

use gkq_format::DType;

pub use activation::gelu_tanh_mul;
pub use attn::{KvAxpy, KvDot, KvElem, axpy_kv, dot_kv};
pub use kquant::{Q8KBlock, quantize_activations_k};
pub use matmul::{MatPart, matmul};
pub use portable::{Q8Acts, Q8Token, quantize_activations};
pub use weights::{DIFF_LANES, Differences, quantize_seen};

/// A row's dot product: its blocks' bytes, a token's activations.
pub(crate) type Dot = fn(&[u8], Q8Token<'_>) -> f32;
/// Rows' dot products with the first `n` (1, 4 or [`TILE`]) of `TILE`
/// tokens' activations: `w` whole rows of `row_bytes`, row `r`'s with
/// token `t` at `out[r · steps.row + t · steps.token]`.
pub(crate) type Rows = fn(&[u8], usize, [Q8Token<'_>; TILE], usize, &mut [f32], Steps);
/// A packed type's rows (`packed.rs`): `w` whole groups of packed rows
/// of `row_bytes`, the first `rows` of them real, with the first `n` of
/// `TILE` tokens, placed as [`Rows`] places them.
pub(crate) type Packed = fn(&[u8], usize, usize, [Q8Token<'_>; TILE], usize, &mut [f32], Steps);
/// A packed K type's rows (as [`Packed`]).
pub(crate) type PackedK = fn(&[u8], usize, usize, [&[Q8KBlock]; TILE], usize, &mut [f32], Steps);
/// A block's quantizer (`weights.rs`): its values, its bytes, its
/// dequantized values.
pub(crate) type Quantizer = fn(&[f32], &mut [u8], &mut [f32]);
/// A K type's row dot product, with 256-value activation blocks.
pub(crate) type DotK = fn(&[u8], &[Q8KBlock]) -> f32;

/// The most tokens a kernel call takes.
pub(crate) const TILE: usize = 8;

/// A SIMD kernel's [`Rows`] `$name`, in its target
/// `$features`: each row of `w` through `$dots` (generic over the number
/// of tokens last) with eight tokens' activations of type `$act`, the
/// first four, or the first, inlined into it.
macro_rules! rows_fn {
    ($name:ident $(<$t:ident: $bound:path>)?, $features:literal, $act:ty, $dots:ident) => {
        /// The rows of `w` with `n` (1, 4 or 8) of eight tokens.
        #[target_feature(enable = $features)]
        fn $name $(<$t: $bound>)? (
            w: &[u8],
            row_bytes: usize,
            a: [$act; 8],
            n: usize,
            out: &mut [f32],
            steps: $crate::Steps,
        ) {
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                let o = &mut out[r * steps.row..];
                match n {
                    8 => steps.put(o, &$dots::<$($t,)? 8>(row, a)),
                    4 => steps.put(o, &$dots::<$($t,)? 4>(row, [a[0], a[1], a[2], a[3]])),
                    _ => o[0] = $dots::<$($t,)? 1>(row, [a[0]])[0],
                }
            }
        }
    };
}
pub(crate) use rows_fn;

/// Where [`RowDot::rows`] puts row `r`'s product with token `t`:
/// `out[r · row + t · token]`. Rows after rows (`row` = the tokens,
/// `token` = 1) or tokens after tokens (`row` = 1, `token` = the rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steps {
    /// From one row's products to the next's.
    pub row: usize,
    /// From one token's product to the next's.
    pub token: usize,
}

impl Steps {
    /// `v[t]` to `o[t · token]`.
    #[inline(always)]
    pub(crate) fn put(self, o: &mut [f32], v: &[f32]) {
        for (t, &x) in v.iter().enumerate() {
            o[t * self.token] = x;
        }
    }

    /// Whether `rows` rows' products with `tokens` tokens each have a
    /// place of their own in `len` values.
    fn fit(self, rows: usize, tokens: usize, len: usize) -> bool {
        let (Steps { row, token }, (r, t)) = (self, (rows.max(1), tokens.max(1)));
        let apart = (token >= 1 && row >= t.saturating_mul(token))
            || (row >= 1 && token >= r.saturating_mul(row));
        let last = (r - 1).checked_mul(row).zip((t - 1).checked_mul(token));
        apart && last.is_some_and(|(a, b)| a.checked_add(b).is_some_and(|end| end < len))
    }
}

/// One token's quantized activations, in the forms the kernels take (a
/// form not needed may be empty).
#[derive(Clone, Copy, Debug, Default)]
pub struct Token<'a> {
    /// Scales per 32, for the 32-value types.
    pub q8: Q8Token<'a>,
    /// Blocks of 256, for the K types.
    pub q8k: &'a [Q8KBlock],
}

/// A block type's kernel: a row at a time (the portable ones) or rows
/// and up to eight tokens at a time (the SIMD ones), with a token's [`Q8Token`]
/// or its blocks of 256 ([`Q8KBlock`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kern {
    Q8(Dot),
    Q8Rows(Rows),
    Q8Packed(Packed, &'static packed::Layout),
    Q8K(DotK),
    Q8KPacked(PackedK, &'static packed::Layout),
}

/// The instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F, BW and VNNI.
    Avx512Vnni,
}

impl Isa {
    /// Its name, for reports (`avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Whether this CPU has it.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::available(),
            #[cfg(target_arch = "x86_64")]
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => avx512q::available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The kernels of one block type: the portable dot product, and the
/// SIMD ones (rows and tokens a call) where an instruction set has them,
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

/// The AVX-512 and AVX2 kernels of 32-value type `T` (none off x86-64).
const fn simd_of<T: types::Ty>() -> [Option<(Isa, Kern)>; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        [
            Some((Isa::Avx512Vnni, Kern::Q8Rows(avx512q::kernels::<T>()))),
            Some((Isa::Avx2, Kern::Q8Rows(avx2::kernels::<T>()))),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        [None, None]
    }
}

/// Q4_0's and Q4_K's kernels, on packed rows (`packed.rs`): AVX-512 with
/// VNNI, then AVX2.
#[cfg(target_arch = "x86_64")]
const fn packed_simd(avx512: Kern, avx2: Kern) -> [Option<(Isa, Kern)>; 2] {
    [Some((Isa::Avx512Vnni, avx512)), Some((Isa::Avx2, avx2))]
}

/// The kernels of every block type that has them, the one table of them:
/// a new type is an entry (Q5_K is multiplied by candle's kernels, and has
/// none yet).
pub static KERNELS: [Kernels; 7] = {
    use types::*;
    #[cfg(target_arch = "x86_64")]
    let (q4_0, q4k, q6k) = (
        packed_simd(
            Kern::Q8Packed(packed_x86::Q4_0_AVX512, &packed::Q4_0_LAYOUT),
            Kern::Q8Packed(packed_x86::Q4_0_AVX2, &packed::Q4_0_LAYOUT),
        ),
        packed_simd(
            Kern::Q8KPacked(packed_x86::Q4_K_AVX512, &packed::Q4_K_LAYOUT),
            Kern::Q8KPacked(packed_x86::Q4_K_AVX2, &packed::Q4_K_LAYOUT),
        ),
        packed_simd(
            Kern::Q8KPacked(packed_x86::Q6_K_AVX512, &packed::Q6_K_LAYOUT),
            Kern::Q8KPacked(packed_x86::Q6_K_AVX2, &packed::Q6_K_LAYOUT),
        ),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (q4_0, q4k, q6k) = ([None, None], [None, None], [None, None]);
    [
        small(DType::Q4_0, portable::dot_q4_0, q4_0),
        small(DType::Q4_1, portable::dot_q4_1, simd_of::<Q4_1>()),
        small(DType::Q5_0, portable::dot_q5_0, simd_of::<Q5_0>()),
        small(DType::Q5_1, portable::dot_q5_1, simd_of::<Q5_1>()),
        small(DType::Q8_0, portable::dot_q8_0, simd_of::<Q8_0>()),
        k_type(DType::Q4_K, kquant::dot_q4_k, q4k),
        k_type(DType::Q6_K, kquant::dot_q6_k, q6k),
    ]
};

/// An entry of [`KERNELS`] for a 32-value type.
const fn small(dtype: DType, portable: Dot, simd: [Option<(Isa, Kern)>; 2]) -> Kernels {
    Kernels {
        dtype,
        portable: Kern::Q8(portable),
        simd,
        portable_serves: true,
    }
}

/// An entry of [`KERNELS`] for a K type: on a CPU without its SIMD kernel
/// candle's kernels are faster than the portable one.
const fn k_type(dtype: DType, portable: DotK, simd: [Option<(Isa, Kern)>; 2]) -> Kernels {
    Kernels {
        dtype,
        portable: Kern::Q8K(portable),
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
        matches!(self.kern, Kern::Q8K(_) | Kern::Q8KPacked(..))
    }

    /// The blocks `a` holds for this kernel.
    fn blocks(&self, a: &Token<'_>) -> usize {
        match self.kern {
            Kern::Q8(_) | Kern::Q8Rows(_) | Kern::Q8Packed(..) => a.q8.blocks(),
            Kern::Q8K(_) | Kern::Q8KPacked(..) => a.q8k.len(),
        }
    }

    /// Whether it takes its rows packed ([`RowDot::pack`]).
    pub fn packs(&self) -> bool {
        self.packer().is_some()
    }

    /// How it packs rows, when it does.
    fn packer(&self) -> Option<&'static packed::Layout> {
        match self.kern {
            Kern::Q8Packed(_, p) | Kern::Q8KPacked(_, p) => Some(p),
            _ => None,
        }
    }

    /// `rows` rows of whole blocks `w` as this kernel takes them: packed
    /// for Q4_0's, Q4_K's and Q6_K's (sixteen rows interleaved, the last
    /// group filled up with zeros; no more bytes than the rows but for
    /// that), else `None`: the rows as they are. `None` too when `w` is not
    /// `rows` rows of whole blocks.
    pub fn pack(&self, w: &[u8], rows: usize) -> Option<Vec<u8>> {
        self.packs()
            .then(|| w.to_vec())
            .and_then(|mut v| self.pack_in_place(&mut v, rows).map(|()| v))
    }

    /// [`RowDot::pack`] in `w`'s own bytes, which it extends with the
    /// last group's rows of zeros (one group's copy beside it while it
    /// packs); `None`, `w` as it was, when the kernel does not pack or `w`
    /// is not `rows` rows of whole blocks.
    pub fn pack_in_place<W: AsMut<[u8]> + Extend<u8>>(&self, w: &mut W, rows: usize) -> Option<()> {
        let layout = self.packer()?;
        let len = w.as_mut().len();
        let row_bytes = len.checked_div(rows)?;
        if row_bytes * rows != len || !row_bytes.is_multiple_of(layout.bytes) {
            return None;
        }
        w.extend(std::iter::repeat_n(
            0,
            (packed::padded(rows) - rows) * row_bytes,
        ));
        packed::pack_in_place(layout, w.as_mut(), row_bytes);
        Some(())
    }

    /// Row `r` of `rows` rows `p` of `row_bytes` as [`RowDot::pack`] gave
    /// them, as it was before; `None` when the kernel does not pack, or `p`
    /// is not that many rows, or `r` is not one of them.
    pub fn unpack_row(&self, p: &[u8], rows: usize, row_bytes: usize, r: usize) -> Option<Vec<u8>> {
        let layout = self.packer()?;
        let fits = Some(p.len()) == packed::padded(rows).checked_mul(row_bytes)
            && r < rows
            && row_bytes.is_multiple_of(layout.bytes);
        fits.then(|| packed::unpack_row(layout, p, row_bytes, r))
    }

    /// The rows this kernel holds for `rows` rows: whole groups when it
    /// packs them.
    pub fn stored_rows(&self, rows: usize) -> usize {
        if self.packs() {
            packed::padded(rows)
        } else {
            rows
        }
    }

    /// `w · a`: `w` a row of whole blocks (as they are, packed here if the
    /// kernel packs), `a` one block per block of it. `None` when their
    /// lengths disagree.
    pub fn dot(&self, w: &[u8], a: Token<'_>) -> Option<f32> {
        let mut out = [0f32];
        let w = self
            .pack(w, 1)
            .map_or(std::borrow::Cow::Borrowed(w), Into::into);
        self.rows(&w, 1, &[a], &mut out, Steps { row: 1, token: 1 })?;
        Some(out[0])
    }

    /// `[w · a[0], …, w · a[3]]`, each block of `w` read once (`w` as
    /// [`RowDot::dot`] takes it). `None` when a length disagrees.
    pub fn dot4(&self, w: &[u8], a: [Token<'_>; 4]) -> Option<[f32; 4]> {
        let mut out = [0f32; 4];
        let w = self
            .pack(w, 1)
            .map_or(std::borrow::Cow::Borrowed(w), Into::into);
        self.rows(&w, 1, &a, &mut out, Steps { row: 4, token: 1 })?;
        Some(out)
    }

    /// The dot products of `rows` rows `w` (as [`RowDot::pack`] gives them
    /// when the kernel packs, else whole rows one after the other) with
    /// each token's activations `a`, row `r`'s with token `t` at
    /// `out[r · steps.row + t · steps.token]`, in few calls: eight tokens at
    /// a time over all the rows (then four, then one), each block unpacked
    /// once per call. `None` when a length disagrees or the places overlap
    /// (nothing written).
    pub fn rows(
        &self,
        w: &[u8],
        rows: usize,
        a: &[Token<'_>],
        out: &mut [f32],
        steps: Steps,
    ) -> Option<()> {
        let Some(first) = a.first() else {
            return Some(());
        };
        let row_bytes = self.blocks(first) * self.block_bytes;
        if row_bytes == 0 {
            return None;
        }
        let fits = rows == 0 || steps.fit(rows, a.len(), out.len());
        let stored = self.stored_rows(rows).checked_mul(row_bytes);
        if !fits
            || stored != Some(w.len())
            || a.iter().any(|a| self.blocks(a) != self.blocks(first))
        {
            return None;
        }
        let mut t = 0;
        while t < a.len() {
            let n = match a.len() - t {
                TILE.. => TILE,
                4.. => 4,
                _ => 1,
            };
            let tile = std::array::from_fn(|k| a[(t + k).min(a.len() - 1)]);
            let o = &mut out[t * steps.token..];
            self.run(w, (row_bytes, rows), tile, n, o, steps);
            t += n;
        }
        Some(())
    }

    /// [`RowDot::rows`] for the first `n` (1, 4 or [`TILE`]) of `TILE`
    /// tokens, the lengths checked.
    fn run(
        &self,
        w: &[u8],
        (row_bytes, rows): (usize, usize),
        a: [Token<'_>; TILE],
        n: usize,
        out: &mut [f32],
        steps: Steps,
    ) {
        let each = w.chunks_exact(row_bytes).enumerate();
        match self.kern {
            Kern::Q8Rows(k) => k(w, row_bytes, a.map(|a| a.q8), n, out, steps),
            Kern::Q8Packed(k, _) => k(w, row_bytes, rows, a.map(|a| a.q8), n, out, steps),
            Kern::Q8KPacked(k, _) => k(w, row_bytes, rows, a.map(|a| a.q8k), n, out, steps),
            Kern::Q8(k) => each.for_each(|(r, w)| {
                for (t, a) in a[..n].iter().enumerate() {
                    out[r * steps.row + t * steps.token] = k(w, a.q8);
                }
            }),
            Kern::Q8K(k) => each.for_each(|(r, w)| {
                for (t, a) in a[..n].iter().enumerate() {
                    out[r * steps.row + t * steps.token] = k(w, a.q8k);
                }
            }),
        }
    }
}

#[cfg(test)]
mod ktests;
#[cfg(test)]
mod tests;
