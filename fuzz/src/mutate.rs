//! A mutation fuzzer for the knot parser that runs on the stable toolchain
//! (cargo-fuzz needs nightly, which this project's machines do not have).
//!
//! Seeds are valid knots (the golden vector and generated ones with dense,
//! spectral and alias blocks). Each input is a seed with random mutations:
//! bit flips, byte overwrites, interesting integers (0, 1, max, lengths past
//! the end) written over length and offset fields, truncation and
//! extension. Half of the inputs get their header checksum recomputed so
//! that mutations reach the header decoder and validator rather than
//! stopping at the checksum. Every input goes through `Knot::parse` and
//! `parse_prefix`, and for accepted knots through payload access and
//! spectral reconstruction; any panic is a failure and the input is saved.

use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gkq_format::merkle;
use gkq_format::runs::{RunsLayout, write_runs};
use gkq_format::{
    BLOCK_EXACT, Block, COLUMNAR_ELIGIBLE, ColumnarDescriptor, DType, Encoding, Header,
    IN_ROW_FILE, INLINE_PROOF, KnotWriter, Metadata, Payload, Quant, RowProof, SOURCE_EXACT, Value,
    keys,
};
use sha2::{Digest, Sha256};

use fixtures::Rng;

/// Seeds of every layout a writer writes: the golden knot and a generated
/// one with dense, spectral, alias and integer blocks (version 3), one
/// with a block type (version 4), and one with a block stored once in its
/// row file, its records inline (version 5). The knot corpus holds them
/// too (`fuzz/tests/corpus.rs`).
pub fn seeds() -> anyhow::Result<Vec<Vec<u8>>> {
    let golden = std::fs::read(
        fixtures::workspace::root().join("crates/gkq-format/tests/golden/tiny.knot"),
    )?;
    let mut md = Metadata::new();
    md.insert(keys::VOCAB_SIZE.into(), Value::U64(4));
    md.insert(
        keys::SOURCE_FILES.into(),
        Value::StrList(vec!["model.safetensors".into()]),
    );
    md.insert(
        keys::SOURCE_SHA256.into(),
        Value::StrList(vec!["00".repeat(32)]),
    );
    md.insert(keys::ROLE_TOKEN_EMBD.into(), Value::Str("e".into()));
    md.insert(keys::TIE_WORD_EMBEDDINGS.into(), Value::Bool(true));
    let mut e = Block::dense("e", DType::BF16, vec![4, 3]).expect("small");
    e.flags = COLUMNAR_ELIGIBLE;
    for d in [DType::BF16, DType::F32] {
        e.columnar
            .push(ColumnarDescriptor::for_shape(4, 3, d, format!("e.{d}.rows")).expect("small"));
    }
    let spectral = Block {
        name: "s".into(),
        dtype: DType::F32,
        flags: 0,
        shape: vec![3, 2],
        encoding: Encoding::Spectral {
            rank: 1,
            factor_dtype: DType::U8,
            quant: Quant::U8Affine,
            payload: Payload {
                offset: 0,
                len: 3 + 24 + 4 + 2 + 8,
                sha256: [0; 32],
            },
        },
        columnar: vec![],
    };
    let alias = Block {
        name: "a".into(),
        dtype: DType::BF16,
        flags: COLUMNAR_ELIGIBLE,
        shape: vec![4, 3],
        encoding: Encoding::Alias { target: 0 },
        columnar: vec![],
    };
    let ints = Block::dense("i", DType::I64, vec![2]).expect("small");
    let header = Header {
        metadata: md,
        blocks: vec![e, spectral, alias, ints],
    };
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), header)?;
    w.write_payload(0, &[7u8; 24][..])?;
    w.write_payload(1, &[1u8; 41][..])?;
    w.write_payload(3, &[2u8; 16][..])?;
    let generated = w.finish()?.0.into_inner();
    Ok(vec![golden, generated, quantized()?, one_copy()?])
}

/// A knot of the one block `e` (the token embedding of a vocabulary of 2)
/// with `payload`, the digest of its row file of `e`'s dtype `row_file`'s.
fn knot_of(e: Block, payload: &[u8], row_file: &[u8]) -> anyhow::Result<Vec<u8>> {
    let dtype = e.dtype;
    let mut metadata = Metadata::new();
    metadata.insert(keys::VOCAB_SIZE.into(), Value::U64(2));
    metadata.insert(keys::ROLE_TOKEN_EMBD.into(), Value::Str("e".into()));
    let header = Header {
        metadata,
        blocks: vec![e],
    };
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), header)?;
    w.write_payload(0, payload)?;
    w.set_columnar_sha256(0, dtype, Sha256::digest(row_file).into())?;
    Ok(w.finish()?.0.into_inner())
}

/// A Q8_0 embedding of two rows with its Q8_0 row file (version 4).
fn quantized() -> anyhow::Result<Vec<u8>> {
    let mut e = Block::dense("e", DType::Q8_0, vec![2, 32]).expect("small");
    e.flags = COLUMNAR_ELIGIBLE;
    let mut d =
        ColumnarDescriptor::for_shape(2, 32, DType::Q8_0, "e.q8_0.rows".into()).expect("small");
    d.flags = BLOCK_EXACT;
    e.columnar.push(d);
    // per block: the f16 scale 0.5, then 32 codes
    let payload: Vec<u8> = (0..2u8)
        .flat_map(|b| {
            [0x00, 0x38]
                .into_iter()
                .chain((0..32).map(move |i| i * 7 + b))
        })
        .collect();
    knot_of(e, &payload, &payload)
}

/// An f32 embedding of two rows stored once, in its row file with each
/// row's record inline at proof height 1 (version 5, FORMAT.md 7e).
fn one_copy() -> anyhow::Result<Vec<u8>> {
    let rows: Vec<u8> = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let leaves: Vec<_> = rows.chunks(12).map(merkle::leaf_hash).collect();
    let (root, proof) = merkle::build_proof(&leaves, 1).context("a proof of two rows")?;
    let mut e = Block::dense("e", DType::F32, vec![2, 3]).expect("small");
    e.flags = COLUMNAR_ELIGIBLE | IN_ROW_FILE;
    let mut d =
        ColumnarDescriptor::for_shape(2, 3, DType::F32, "e.f32.rows".into()).expect("small");
    d.flags = SOURCE_EXACT | BLOCK_EXACT | INLINE_PROOF;
    d.proof = Some(RowProof { height: 1, root });
    d.byte_len = 2 * (12 + 32);
    let layout = RunsLayout::of(&d).context("the inline layout")?;
    let mut file = Vec::new();
    write_runs(&layout, &mut rows.as_slice(), &mut &proof[32..], &mut file)?;
    e.columnar.push(d);
    knot_of(e, &rows, &file)
}

const INTERESTING: [u64; 9] = [0, 1, 2, 0x7f, 0xff, 0xffff, 0xffff_ffff, u64::MAX, 4096];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(6) {
        // Most mutations land in the preamble and header, where the parser works.
        let span = if rng.below(4) == 0 {
            b.len()
        } else {
            b.len().min(0x200)
        };
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(span);
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(span);
                b[i] = rng.next_u64() as u8;
            }
            2 => {
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1usize, 2, 4, 8][rng.below(4)];
                let i = rng.below(span.saturating_sub(width).max(1));
                if i + width <= b.len() {
                    b[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
                }
            }
            3 => b.truncate(rng.below(b.len() + 1)),
            4 => b.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
            5 if !b.is_empty() => {
                // small integer tweak of a field
                let i = rng.below(span);
                b[i] = b[i].wrapping_add(1 + rng.below(3) as u8);
            }
            _ => {}
        }
    }
    b
}

/// One worker: mutated seeds through [`crate::exercise_knot`] until `deadline` or
/// until `stop`; its inputs and how many parsed, or the input that panicked.
fn worker(
    seeds: &[Vec<u8>],
    seed: u64,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<(u64, u64), Vec<u8>> {
    let mut rng = Rng(seed);
    let (mut execs, mut accepted) = (0u64, 0u64);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        for _ in 0..256 {
            let s = &seeds[rng.below(seeds.len())];
            let mut input = mutate(&mut rng, s);
            if rng.below(2) == 0 {
                crate::reseal(&mut input);
            }
            match catch_unwind(AssertUnwindSafe(|| crate::exercise_knot(&input))) {
                Ok(n) => accepted += u64::from(n),
                Err(_) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(input);
                }
            }
            execs += 1;
        }
    }
    Ok((execs, accepted))
}

/// Fuzzes for `seconds` on every core (worker `i` draws from `seed + i`).
pub fn run(seconds: u64, seed: u64) -> anyhow::Result<()> {
    let seeds = seeds()?;
    for s in &seeds {
        if !crate::exercise_knot(s) {
            bail!("a seed knot does not parse");
        }
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let stop = AtomicBool::new(false);
    std::panic::set_hook(Box::new(|_| {}));
    let started = Instant::now();
    let (seeds, stop) = (&seeds, &stop);
    let results: Vec<_> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..workers)
            .map(|i| sc.spawn(move || worker(seeds, seed.wrapping_add(i), deadline, stop)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let _ = std::panic::take_hook();
    let (mut execs, mut accepted) = (0u64, 0u64);
    for r in results {
        match r {
            Ok(Ok((e, a))) => (execs, accepted) = (execs + e, accepted + a),
            Ok(Err(input)) => {
                let path =
                    fixtures::workspace::root().join(format!("target/fuzz-crash-{seed}.knot"));
                std::fs::write(&path, &input)?;
                bail!("the parser panicked; input saved to {}", path.display());
            }
            Err(_) => bail!("a fuzz worker died outside the parser"),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "fuzz: {execs} inputs in {secs:.1}s on {workers} threads ({:.0}/s), {accepted} accepted as valid knots, no panics",
        execs as f64 / secs
    );
    Ok(())
}
