//! Fuzz targets for every parser that takes untrusted bytes, on the stable
//! toolchain: the harnesses in `src/bin/` run them under AFL++ (`cargo afl`,
//! coverage-guided); `tests/corpus.rs` replays the committed corpora
//! (`fuzz/corpus/<target>/`) through the same functions in every test run.
//!
//! Each target must never panic. Two of them also check a property: the
//! Merkle checks never accept bytes other than the rows they were built
//! for, and a config accepted against a knot never yields sizes whose
//! products overflow.
//!
//! [`mutate`] is a bounded mutation fuzzer of the knot parser that needs no
//! AFL++ (`cargo xtask fuzz`, and a 10-second run in every test run).

pub mod mutate;

use gkq_format::merkle::{self, ProofLayout};
use gkq_format::runs::{RunsLayout, check_runs, write_runs};
use gkq_format::{ColumnarDescriptor, DType, Encoding, Knot, Prefix, RowProof, SpectralParts};
use sha2::{Digest, Sha256};

/// The knot parser: whole knots, prefixes, payloads and spectral blocks;
/// then the same bytes with the header checksum made right ([`reseal`]),
/// so that a mutated header reaches the decoder and the validator instead
/// of stopping at the checksum.
pub fn knot(data: &[u8]) {
    exercise_knot(data);
    let mut sealed = data.to_vec();
    if reseal(&mut sealed) && sealed != data {
        exercise_knot(&sealed);
    }
}

/// One input through the knot parser; whether it parsed as a whole knot.
pub(crate) fn exercise_knot(data: &[u8]) -> bool {
    let parsed = Knot::parse(data);
    if let Ok(k) = &parsed {
        for i in 0..=k.blocks().len() {
            let _ = k.verify_payload(i);
            let (Some(b), Some(p)) = (k.blocks().get(i), k.payload(i)) else {
                continue;
            };
            if matches!(b.encoding, Encoding::Spectral { .. })
                && let Ok(parts) = SpectralParts::decode(b, p)
            {
                let _ = parts.reconstruct();
            }
            if b.dtype.is_quantized() {
                let mut values = Vec::new();
                let _ = gkq_format::decode_f32(p, b.dtype, &mut values);
            }
        }
    }
    for cut in [72, data.len() / 2, data.len()] {
        if let Ok(Prefix::Complete(h)) = gkq_format::parse_prefix(&data[..cut.min(data.len())]) {
            for i in 0..=h.header().blocks.len() {
                let _ = (h.payload_of(i), h.payload_len(i), h.home_of(i));
            }
        }
    }
    parsed.is_ok()
}

/// Writes the header checksum a knot's preamble and header call for over
/// the one `b` carries (FORMAT.md 2: SHA-256 of the preamble's first 40
/// bytes and the header); `false` when `b` is too short to hold them.
pub fn reseal(b: &mut [u8]) -> bool {
    let Some(len) = b.get(16..24).and_then(|x| <[u8; 8]>::try_from(x).ok()) else {
        return false;
    };
    let end = usize::try_from(u64::from_le_bytes(len))
        .ok()
        .and_then(|n| n.checked_add(72))
        .filter(|&e| e <= b.len());
    let Some(end) = end else {
        return false;
    };
    let mut h = Sha256::new();
    h.update(&b[..40]);
    h.update(&b[72..end]);
    let d: [u8; 32] = h.finalize().into();
    b[40..72].copy_from_slice(&d);
    true
}

/// Reads a little-endian value from `data` at `at`, 0 past the end.
fn byte(data: &[u8], at: usize) -> u8 {
    data.get(at).copied().unwrap_or(0)
}

/// The Merkle proof checks (FORMAT.md 7a). The first bytes choose a small
/// row file (rows, row bytes, proof height, the row to check); its rows
/// come from the rest of the input. The proof object is built honestly,
/// then the input's tail is XORed over the table, the record and the row
/// fetched: the checks may accept only when what they were given is what
/// was built.
pub fn merkle(data: &[u8]) {
    let rows = u64::from(byte(data, 0) % 48) + 1;
    let row_bytes = u64::from(byte(data, 1) % 12) + 1;
    let height = byte(data, 2) % 7;
    let pick = u64::from(byte(data, 3)) % rows;
    let body: Vec<u8> = (0..rows * row_bytes)
        .map(|i| byte(data, 8 + (i as usize % data.len().max(1))))
        .collect();
    let leaves: Vec<merkle::Hash> = body
        .chunks(row_bytes as usize)
        .map(merkle::leaf_hash)
        .collect();
    let mut proof = Vec::new();
    let Ok(Some(root)) = merkle::write_proof(&leaves, height, &mut proof) else {
        return;
    };
    let Some(mut desc) = ColumnarDescriptor::for_shape(rows, row_bytes, DType::U8, "f.rows".into())
    else {
        return;
    };
    desc.proof = Some(RowProof { height, root });
    let Some(layout) = ProofLayout::new(rows, height) else {
        return;
    };
    let table_len = layout.table_len() as usize;
    let (rec_at, rec_end) = layout.records_range(pick, 1).unwrap_or((0, 0));
    let (rec_at, rec_len) = (rec_at as usize, (rec_end - rec_at) as usize);
    let row_at = (pick * row_bytes) as usize;
    // what a server sends: table, record and row, each maybe altered
    let mut table = proof[..table_len.min(proof.len())].to_vec();
    let mut record = proof
        .get(rec_at..rec_at + rec_len)
        .unwrap_or_default()
        .to_vec();
    let mut row = body[row_at..row_at + row_bytes as usize].to_vec();
    let mask = data.get(4..8).unwrap_or_default();
    let flip = |v: &mut Vec<u8>, salt: u8| {
        if let Some((&at, &x)) = mask.first().zip(mask.get(1))
            && !v.is_empty()
        {
            let i = usize::from(at ^ salt) % v.len();
            v[i] ^= x;
        }
    };
    match byte(data, 4) % 4 {
        0 => {}
        1 => flip(&mut table, 0),
        2 => flip(&mut record, 1),
        _ => flip(&mut row, 2),
    }
    let honest = table == proof[..table_len.min(proof.len())]
        && record == proof.get(rec_at..rec_at + rec_len).unwrap_or_default()
        && row == body[row_at..row_at + row_bytes as usize];
    match merkle::check_table(&desc, &table) {
        Ok(roots) => {
            let ok = merkle::check_row(&desc, &roots, pick, &row, &record).is_ok();
            assert_eq!(
                ok, honest,
                "check_row accepted altered bytes, or refused honest ones"
            );
            let chunk = pick / layout.chunk_rows();
            let first = (chunk * layout.chunk_rows() * row_bytes) as usize;
            let count = layout.chunk_rows().min(rows - chunk * layout.chunk_rows());
            let mut rows_of_chunk = body[first..first + (count * row_bytes) as usize].to_vec();
            if byte(data, 4) % 4 == 3 {
                flip(&mut rows_of_chunk, 2);
            }
            let whole = rows_of_chunk == body[first..first + (count * row_bytes) as usize];
            let chunk_ok = merkle::check_chunk(&desc, &roots, chunk, &rows_of_chunk).is_ok();
            assert_eq!(chunk_ok, whole, "check_chunk disagrees with the bytes");
        }
        Err(_) => assert!(!honest, "an honest chunk table was refused"),
    }
}

/// The runs checks (FORMAT.md 7b). As for [`merkle()`], the first bytes
/// choose a small row file, now with a proof height of 1 or more; its runs
/// object is written honestly with `write_runs`, and a range of runs is
/// "fetched" and maybe altered: a byte flipped, two strides swapped, a
/// stride cut short or a byte added. `check_runs` must accept the honest
/// range, and whatever it accepts must be the very rows of the file.
pub fn runs(data: &[u8]) {
    let rows = u64::from(byte(data, 0) % 48) + 1;
    let rb = u64::from(byte(data, 1) % 12) + 1;
    let height = byte(data, 2) % 6 + 1;
    let first = u64::from(byte(data, 3)) % rows;
    let count = u64::from(byte(data, 5)) % (rows - first) + 1;
    let body: Vec<u8> = (0..rows * rb)
        .map(|i| byte(data, 8 + (i as usize % data.len().max(1))))
        .collect();
    let leaves: Vec<merkle::Hash> = body.chunks(rb as usize).map(merkle::leaf_hash).collect();
    let mut proof = Vec::new();
    let Ok(Some(root)) = merkle::write_proof(&leaves, height, &mut proof) else {
        return;
    };
    let (Some(mut desc), Some(layout)) = (
        ColumnarDescriptor::for_shape(rows, rb, DType::U8, "f.rows".into()),
        ProofLayout::new(rows, height),
    ) else {
        return;
    };
    desc.proof = Some(RowProof { height, root });
    let runs = RunsLayout::of(&desc).expect("height 1 or more has a runs object");
    let (table, records) = proof.split_at(layout.table_len() as usize);
    let mut object = Vec::new();
    write_runs(&runs, &mut &body[..], &mut &records[..], &mut object).expect("in memory");
    let roots = merkle::check_table(&desc, table).expect("an honest table");
    let (a, b) = runs.range(first, count).expect("in range");
    let sent = &object[a as usize..b as usize];
    let mut got = sent.to_vec();
    let (at, x) = (usize::from(byte(data, 6)), byte(data, 7));
    let stride = runs.stride() as usize;
    match byte(data, 4) % 5 {
        0 => {}
        1 => got[at * 7 % sent.len()] ^= x,
        2 if count >= 2 => got[..2 * stride].rotate_left(stride),
        3 => got.truncate(sent.len() - 1 - at % stride.min(sent.len())),
        _ => got.push(x),
    }
    let honest = got == sent;
    match check_runs(&desc, &roots, first, &got) {
        // a cut to whole strides is an honest shorter range: what matters
        // is that every row returned is the row (callers check the count)
        Ok(out) => {
            let n = (got.len() / stride) as u64;
            let want = &body[(first * rb) as usize..((first + n) * rb) as usize];
            assert!(out == want, "check_runs returned a row that is not the row");
        }
        Err(_) => assert!(!honest, "check_runs refused an honest range"),
    }
}

/// `config.json` as gkq-decode reads it, then checked against a small
/// knot's shapes: never a panic, and never sizes that overflow once
/// accepted.
pub fn config(data: &[u8]) {
    let Ok(cfg) = gkq_decode::Config::from_json(data) else {
        return;
    };
    let _ = cfg.position_limit();
    let header = tiny_header();
    if cfg.check(&header).is_ok() {
        assert!(cfg.heads.checked_mul(cfg.head_dim).is_some());
        assert!(
            cfg.layers <= 1,
            "more layers than the knot holds were accepted"
        );
    }
}

/// A one-layer Llama-shaped header (hidden 8, 2 heads of 4, intermediate 16).
fn tiny_header() -> gkq_format::Header {
    use gkq_format::{Block, Header, Metadata, Value, keys};
    let mut md = Metadata::new();
    md.insert(
        keys::ROLE_TOKEN_EMBD.into(),
        Value::Str("model.embed_tokens.weight".into()),
    );
    let block = |name: &str, shape: Vec<u64>| Block::dense(name, DType::F32, shape).expect("small");
    let p = "model.layers.0";
    Header {
        metadata: md,
        blocks: vec![
            block("model.embed_tokens.weight", vec![32, 8]),
            block(&format!("{p}.self_attn.q_proj.weight"), vec![8, 8]),
            block(&format!("{p}.self_attn.k_proj.weight"), vec![8, 8]),
            block(&format!("{p}.self_attn.o_proj.weight"), vec![8, 8]),
            block(&format!("{p}.mlp.gate_proj.weight"), vec![16, 8]),
        ],
    }
}

/// The safetensors header reader gkq-pack and gkq-verify use.
pub fn safetensors(data: &[u8]) {
    if let Ok(tensors) = gkq_source::header_tensors(data) {
        for t in tensors {
            assert!(t.offset >= 8, "a tensor starts inside the length prefix");
        }
    }
}

/// `gkq-pack --spectral PATTERN=SPEC`.
pub fn spectral(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = s.parse::<gkq_pack::SpectralSpec>();
    }
}

/// The block types (FORMAT.md 3.5): dtype names and codes parse without
/// panicking; any bytes of whole blocks dequantize to one value per
/// element, the same through `decode_f32`; quantizing those values again
/// gives whole blocks of the type. The first byte picks the type.
pub fn quant(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = DType::parse_row(s);
        let _ = DType::parse_quantized(s);
    }
    let Some(dtype) = DType::from_code(byte(data, 0)).filter(|d| d.is_quantized()) else {
        return;
    };
    let (per, size) = dtype.block().expect("a block type");
    let (per, size) = (per as usize, size as usize);
    let blocks = &data[1.min(data.len())..];
    let whole = &blocks[..blocks.len() / size * size];
    let mut values = Vec::new();
    assert!(gkq_format::quant::dequantize(whole, dtype, &mut values));
    assert_eq!(values.len(), whole.len() / size * per);
    let mut again = Vec::new();
    assert!(gkq_format::decode_f32(whole, dtype, &mut again));
    assert!(
        values
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    let mut requantized = Vec::new();
    assert!(gkq_format::quant::quantize(
        &values,
        dtype,
        &mut requantized
    ));
    assert_eq!(requantized.len(), whole.len());
    // a length that is not whole blocks is refused, not read past
    if !blocks.len().is_multiple_of(size) {
        assert!(!gkq_format::quant::dequantize(blocks, dtype, &mut values));
    }
}

/// The GGUF parser (issue 30): never a panic; what it accepts has every
/// tensor inside the file, and its key/values re-encode to the very bytes
/// they were read from (the metadata travels losslessly).
pub fn gguf(data: &[u8]) {
    let Ok(g) = gkq_format::gguf::Gguf::parse(data) else {
        return;
    };
    for t in &g.tensors {
        let end = t.offset.checked_add(t.len).expect("checked by the parser");
        assert!(end <= data.len() as u64, "{} ends past the file", t.name);
    }
    let (s, e) = g.kv_bytes;
    let raw = data.get(s as usize..e as usize).expect("within the file");
    assert_eq!(
        gkq_format::gguf::encode_kv(&g.kv),
        raw,
        "key/values re-encode to their bytes"
    );
}

/// The key of FORMAT.md 7c's golden vector (the P-256 scalar
/// SHA-256("gkq test key, never a real one")), which signs [`sig`]'s seed.
pub fn test_key() -> p256::ecdsa::SigningKey {
    p256::ecdsa::SigningKey::from_slice(&Sha256::digest(b"gkq test key, never a real one"))
        .expect("a valid scalar")
}

/// [`sig`]'s seeds: FORMAT.md 7c's golden statement signed by the test
/// key, and the same naming its package.
pub fn sig_seeds() -> Vec<Vec<u8>> {
    use gkq_format::sig;
    use p256::ecdsa::signature::Signer as _;
    let key = test_key();
    let resources =
        [("model.knot", &b"knot"[..]), ("config.json", b"{}")].map(|(name, b)| sig::Resource {
            name: name.into(),
            digest: Sha256::digest(b).into(),
        });
    let id = gkq_format::KnotId::from_digest([0x11; 32]);
    let hint = sig::PublicKey::from_key(*key.verifying_key())
        .hint()
        .to_owned();
    [None, Some("tiny")]
        .map(|package| {
            let payload = sig::statement_for("tiny", &resources, id, package);
            let der: p256::ecdsa::Signature = key.sign(&sig::pae(&payload));
            sig::bundle(&payload, der.to_der().as_bytes(), &hint)
        })
        .to_vec()
}

/// A signature object as a mirror may serve it (FORMAT.md 7c): `open`
/// against the test key's public half, and the unverified readings of its
/// statement (`claimed_knot`, `claimed_package`). Whatever `open` accepts
/// claims the knot and the package it was signed for.
pub fn sig(data: &[u8]) {
    use gkq_format::sig;
    let claimed = sig::claimed_knot(data);
    let package = sig::claimed_package(data);
    let trusted = [sig::PublicKey::from_key(*test_key().verifying_key())];
    let Ok(signed) = sig::open(data, &trusted) else {
        return;
    };
    if let Ok(Some(id)) = claimed {
        assert!(
            signed.check_knot(id).is_ok(),
            "open and claimed_knot disagree"
        );
    }
    assert!(
        package.is_ok(),
        "a statement open accepts has a readable name"
    );
}
