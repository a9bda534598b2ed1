//! Parallel reads ([`crate::parallel`]) over a local file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::BytesMut;
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::gate::{Gate, Parallelism, ReadCheck};
use crate::local::LocalStore;
use crate::parallel::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn file(len: usize) -> (tempfile::TempDir, String, Vec<u8>) {
    let tmp = tempfile::tempdir().expect("tmp");
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let p = tmp.path().join("object");
    std::fs::write(&p, &data).expect("write");
    let loc = p.display().to_string();
    (tmp, loc, data)
}

fn local(max_read_bytes: u64) -> LocalStore {
    LocalStore::new(&crate::StoreConfig {
        max_read_bytes,
        ..Default::default()
    })
}

fn gate(part_size: u64) -> Gate {
    Gate::new(Parallelism {
        part_size,
        max_parallel: 3,
        connections: 2,
    })
}

/// Parts are cut from one allocation and joined again without a copy:
/// the joined buffer is the very memory the parts were read into.
#[test]
fn parts_are_cut_from_one_buffer_and_joined_without_a_copy() {
    let whole = BytesMut::zeroed(100_003);
    let at = whole.as_ptr();
    let parts = cut(whole, 4096, 0, 1);
    assert_eq!(parts.len(), 25);
    assert!(parts.windows(2).all(|w| w[0].0 + 4096 == w[1].0));
    let joined = join(parts.into_iter().map(|p| p.1));
    assert_eq!((joined.as_ptr(), joined.len()), (at, 100_003));
}

/// Issue 32: part boundaries fall on multiples of the part size in the
/// object, whatever the range's start, so that a slice cache sees the
/// same ranges from every node; unless the check's unit forbids it.
#[test]
fn parts_are_aligned_to_the_object() {
    let offsets = |start: u64, align: u64| -> Vec<u64> {
        cut(BytesMut::zeroed(20_000), 4096, start, align)
            .iter()
            .map(|(o, _)| start + o)
            .collect()
    };
    assert_eq!(offsets(1000, 1), [1000, 4096, 8192, 12288, 16384, 20480]);
    assert_eq!(offsets(8192, 1), [8192, 12288, 16384, 20480, 24576]);
    // a unit of 1,000 bytes: 3,096 is not a multiple, cut from the start
    assert_eq!(offsets(1000, 1000)[1], 5096);
}

#[test]
fn parts_are_read_and_the_digest_follows_them() {
    let (_t, loc, data) = file(100_003);
    let store = local(1 << 30);
    let want: [u8; 32] = Sha256::digest(&data[7..90_007]).into();
    let got = rt()
        .block_on(read_parts(
            &store,
            &gate(4096),
            &loc,
            (7, 90_000),
            None,
            ReadCheck::Sha256(want),
        ))
        .expect("verified");
    assert!(got[..] == data[7..90_007]);
    assert_eq!(part_size(gate(4096).config(), &ReadCheck::None), 4096);
}

#[test]
fn a_wrong_digest_returns_nothing_and_names_both() {
    let (_t, loc, _) = file(50_000);
    let store = local(1 << 30);
    let e = rt()
        .block_on(read_parts(
            &store,
            &gate(8192),
            &loc,
            (0, 50_000),
            None,
            ReadCheck::Sha256([7; 32]),
        ))
        .expect_err("mismatch");
    match &e {
        StoreError::Digest {
            start: 0,
            end: 49_999,
            expected,
            found,
            ..
        } => {
            assert_eq!(expected, &"07".repeat(32));
            assert_eq!(found.len(), 64);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parts_are_aligned_checked_and_a_failing_one_fetched_twice() {
    let (_t, loc, data) = file(10_000);
    let store = local(1 << 30);
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let check = ReadCheck::Parts {
        align: 1000,
        check: Arc::new(move |off, bytes: &[u8]| {
            assert!(off.is_multiple_of(1000) && bytes.len().is_multiple_of(1000));
            if off == 2000 {
                s.fetch_add(1, Ordering::Relaxed);
                return Err("chunk 2 does not hash to its root".into());
            }
            Ok(())
        }),
    };
    // part size 2500 rounds down to 2000: parts at 0, 2000, … 8000
    assert_eq!(part_size(gate(2500).config(), &check), 2000);
    let e = rt()
        .block_on(read_parts(
            &store,
            &gate(2500),
            &loc,
            (0, 10_000),
            None,
            check,
        ))
        .expect_err("a bad part");
    assert!(
        matches!(
            e,
            StoreError::PartCheck {
                start: 2000,
                end: 3999,
                ..
            }
        ),
        "{e:?}"
    );
    let ok = ReadCheck::Parts {
        align: 1000,
        check: Arc::new(|_, _: &[u8]| Ok(())),
    };
    let got = rt()
        .block_on(read_parts(&store, &gate(2500), &loc, (0, 10_000), None, ok))
        .expect("read");
    assert!(got[..] == data[..]);
    // the bad part was fetched and checked twice, then the read failed
    assert_eq!(seen.load(Ordering::Relaxed), 2);
}

#[test]
fn empty_and_oversized_ranges() {
    let (_t, loc, _) = file(10);
    let store = local(1 << 20);
    let empty: [u8; 32] = Sha256::digest([]).into();
    let rt = rt();
    let g = gate(4);
    let got = rt.block_on(read_parts(
        &store,
        &g,
        &loc,
        (3, 0),
        None,
        ReadCheck::Sha256(empty),
    ));
    assert_eq!(got.expect("empty").len(), 0);
    let e = rt.block_on(read_parts(
        &store,
        &g,
        &loc,
        (0, 2 << 20),
        None,
        ReadCheck::None,
    ));
    assert!(matches!(e, Err(StoreError::TooLarge { .. })), "{e:?}");
    let e = rt.block_on(read_parts(&store, &g, &loc, (5, 10), None, ReadCheck::None));
    assert!(
        matches!(e, Err(StoreError::PastEnd { len: 10, .. })),
        "short file: {e:?}"
    );
}
