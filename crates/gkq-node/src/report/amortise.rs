//! The multi-session amortisation of the proposal's section 8: sessions
//! drawn from the workloads with a seeded RNG, replayed on one node whose
//! LRU keeps what it fetched, after a warm-up: the package's warm object
//! (FORMAT.md 7d) when it has one, else the top K ids of the texts, costed
//! as the warm object `gkq-pack --warm-ids` would write. Computed the way
//! the reader fetches (runs merged across one-row gaps, gap rows cached
//! too, the chunk table once), and with `--url` measured on a fresh node.

use std::collections::HashSet;

use gkq_reader::{Reader, ReaderConfig, Serve};
use serde::Serialize;

use super::{Measured, ReportOptions, RowFile, Workload, bad, runs_of};
use crate::NodeError;

/// Where the warm set came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmFrom {
    /// The package's warm object (`columnar.warm_rows`).
    Package,
    /// The top K ids of the texts (the package has no warm object).
    Texts,
}

/// The amortisation on one row file.
#[derive(Clone, Debug, Serialize)]
pub struct AmortisedCost {
    /// The row file's dtype.
    pub dtype: String,
    /// Bytes of the warm-up (the warm object).
    pub warm_bytes: u64,
    /// Its requests (1, or 0 without a warm set).
    pub warm_requests: u64,
    /// Bytes of the cold tail: rows and records fetched by the sessions.
    pub cold_bytes: u64,
    /// Its requests (one per run from a runs object, two without).
    pub cold_requests: u64,
    /// Its round trips: one per session that misses a row (a session's
    /// runs, and the chunk table with the first, are sent together).
    pub cold_round_trips: u64,
    /// Warm-up and cold tail.
    pub total_bytes: u64,
    /// Percent saved against the dense matrix shipped per session.
    pub saved_pct: f64,
}

/// What a fresh node fetched from the package's URL for the drawn sessions.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredAmortised {
    /// The row file the node read.
    pub object: String,
    /// Its warm-up: the warm object, or without one a prefetch of the
    /// texts' top K ids.
    pub warm: Measured,
    /// The sessions after it.
    pub cold: Measured,
}

/// The amortisation over many sessions on one node.
#[derive(Clone, Debug, Serialize)]
pub struct Amortised {
    /// Sessions drawn.
    pub sessions: usize,
    /// The warm set's size.
    pub warm: usize,
    /// Where it came from.
    pub warm_from: WarmFrom,
    /// Distinct ids over every session drawn.
    pub distinct: usize,
    /// Per row file.
    pub cost: Vec<AmortisedCost>,
    /// With `--url`: measured on the wire.
    pub measured: Option<MeasuredAmortised>,
}

/// xorshift64*: the seeded draw.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `n` sessions drawn from the workloads (a workload, then one of its
/// sessions), one at a time: memory does not grow with `n`.
fn draw(all: &[Workload], n: usize, seed: u64) -> impl Iterator<Item = &[u32]> + Clone {
    let mut state = seed | 1;
    (0..n).map(move |_| {
        let w = &all[(next(&mut state) % all.len() as u64) as usize].1;
        w[(next(&mut state) % w.len() as u64) as usize].as_slice()
    })
}

/// One node on row file `f`: the warm-up, then every session's misses.
fn simulate<'a>(
    f: &RowFile,
    warm: &[u64],
    warm_len: Option<u64>,
    drawn: impl Iterator<Item = &'a [u32]>,
) -> AmortisedCost {
    let stride = f.row_bytes + f.record_len;
    // the warm object in one request, or (a warm set the texts chose) the
    // chunk table and the warm rows' runs, as the reader prefetches them
    let (warm_bytes, warm_requests) = match (warm.is_empty(), warm_len) {
        (true, _) => (0, 0),
        (false, Some(len)) => (len, 1),
        (false, None) => {
            let ids: HashSet<u32> = warm.iter().filter_map(|&i| u32::try_from(i).ok()).collect();
            let runs = runs_of(&ids);
            (
                f.table_len + runs.iter().map(|r| r.count).sum::<u64>() * stride,
                u64::from(f.table_len > 0) + runs.len() as u64 * f.requests_per_run,
            )
        }
    };
    let mut cache: HashSet<u64> = warm.iter().copied().collect();
    let mut table = !warm.is_empty();
    let (mut cold_bytes, mut cold_requests, mut cold_round_trips) = (0, 0, 0);
    let mut n = 0u64;
    for s in drawn {
        n += 1;
        let missing: HashSet<u32> = s
            .iter()
            .copied()
            .filter(|&i| !cache.contains(&u64::from(i)))
            .collect();
        if missing.is_empty() {
            continue;
        }
        let runs = runs_of(&missing);
        cold_round_trips += 1;
        if !table {
            (cold_bytes, cold_requests, table) = (f.table_len, 1, true);
        }
        for r in &runs {
            cold_bytes += r.count * stride;
            cache.extend(r.first..r.first + r.count);
        }
        cold_requests += runs.len() as u64 * f.requests_per_run;
    }
    let dense = f.file_len as f64 * n as f64;
    AmortisedCost {
        dtype: f.dtype.clone(),
        warm_bytes,
        warm_requests,
        cold_bytes,
        cold_requests,
        cold_round_trips,
        total_bytes: warm_bytes + cold_bytes,
        saved_pct: 100.0 * (1.0 - (warm_bytes + cold_bytes) as f64 / dense.max(1.0)),
    }
}

/// The warm set: the package's (its warm object), else the texts' top K.
fn warm_set(package: &[u64], texts: &[u32]) -> (Vec<u64>, WarmFrom) {
    match package.is_empty() {
        false => (package.to_vec(), WarmFrom::Package),
        true => {
            let mut v: Vec<u64> = texts.iter().map(|&i| u64::from(i)).collect();
            v.sort_unstable();
            (v, WarmFrom::Texts)
        }
    }
}

/// The amortisation, computed.
pub(super) fn amortise(
    all: &[Workload],
    files: &[RowFile],
    (package, texts): (&[u64], &[u32]),
    o: &ReportOptions,
) -> Amortised {
    let drawn = draw(all, o.sessions, o.seed);
    let (warm, warm_from) = warm_set(package, texts);
    let distinct: HashSet<u32> = drawn.clone().flat_map(|s| s.iter().copied()).collect();
    let cost = files
        .iter()
        .map(|f| {
            simulate(
                f,
                &warm,
                f.warm_len.filter(|_| warm_from == WarmFrom::Package),
                drawn.clone(),
            )
        })
        .collect();
    Amortised {
        sessions: o.sessions,
        warm: warm.len(),
        warm_from,
        distinct: distinct.len(),
        cost,
        measured: None,
    }
}

/// The same sessions on a fresh node over the package's URL.
pub(super) fn measured(
    mut a: Amortised,
    location: &str,
    config: &ReaderConfig,
    (all, package, texts): (&[Workload], &[u64], &[u32]),
    o: &ReportOptions,
) -> Result<Amortised, NodeError> {
    let drawn = draw(all, o.sessions, o.seed);
    let (warm, from) = warm_set(package, texts);
    let prefetch = if from == WarmFrom::Texts {
        warm
    } else {
        Vec::new()
    };
    let (object, warm, cold) = measure(
        location,
        config,
        (from == WarmFrom::Package, &prefetch),
        drawn,
    )?;
    a.measured = Some(MeasuredAmortised { object, warm, cold });
    Ok(a)
}

/// A fresh node (no disk cache) reading the package's base URL: its
/// warm-up (the warm object, or a prefetch of `prefetch`), then `sessions`
/// one after the other: the row file it read, what each part moved.
pub(super) fn measure<'a>(
    location: &str,
    config: &ReaderConfig,
    (warm_object, prefetch): (bool, &[u64]),
    sessions: impl IntoIterator<Item = &'a [u32]>,
) -> Result<(String, Measured, Measured), NodeError> {
    let mut c = config.clone();
    c.cache.dir = None;
    c.warm = false;
    let knot = gkq_reader::is_url(location)
        .then_some(location)
        .ok_or_else(|| bad("--url needs a package URL"))?;
    c.columnar_embed = Some(gkq_store::url::sibling(knot, ""));
    let r = Reader::open(knot, c, Serve::INPUT)?;
    let e = r.embedding()?;
    let object = e
        .resolution()
        .columnar()
        .map_or_else(|| "the dense block".to_owned(), |p| p.desc.object.clone());
    let s0 = r.net_stats();
    if warm_object {
        e.warm()?;
    } else if !prefetch.is_empty() {
        e.prefetch(prefetch)?;
    }
    let s1 = r.net_stats();
    for s in sessions {
        let ids: Vec<u64> = s.iter().map(|&i| u64::from(i)).collect();
        e.rows(&ids)?;
    }
    let s2 = r.net_stats();
    let m = |a: &gkq_reader::NetStats, b: &gkq_reader::NetStats| {
        let d = b.since(a);
        Measured {
            requests: d.requests,
            round_trips: d.round_trips,
            bytes: d.payload_bytes,
        }
    };
    Ok((object, m(&s0, &s1), m(&s1, &s2)))
}
