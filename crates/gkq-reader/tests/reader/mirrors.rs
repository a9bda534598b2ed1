//! Multi-source reads (issue 32): `ReaderConfig::mirrors` spreads row runs
//! and bulk parts over the origin and its mirrors, every answer verified;
//! each kind of bad mirror is dropped with its evidence and no wrong byte
//! is returned. Origin and mirrors are real nginx servers on 127.0.0.1.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::servers::{Nginx, NginxOptions, Staller};
use gkq_format::DType;
use gkq_reader::{Reader, ReaderConfig, ReaderError, Serve, with_timeout};

struct Site {
    tmp: tempfile::TempDir,
    origin: Nginx,
    pkg: PathBuf,
}

/// The qwen2-tiny preset packed into `www/m`, served by the origin nginx.
fn site() -> Site {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    fixtures::write_model(&src, &fixtures::preset("qwen2-tiny-f32").expect("preset"))
        .expect("model");
    let pkg = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &pkg);
    opts.dtypes = vec![DType::F32];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let origin = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    Site { tmp, origin, pkg }
}

/// A copy of the package under `name/m`, served by its own nginx, after
/// `edit` changed the copy.
fn mirror(s: &Site, name: &str, opts: &NginxOptions, edit: impl Fn(&Path)) -> (Nginx, String) {
    let root = s.tmp.path().join(name);
    let dir = root.join("m");
    fs::create_dir_all(&dir).expect("dir");
    for e in fs::read_dir(&s.pkg).expect("pkg") {
        let p = e.expect("entry").path();
        fs::copy(&p, dir.join(p.file_name().expect("name"))).expect("copy");
    }
    edit(&dir);
    let nginx =
        Nginx::start(&root, &s.tmp.path().join(format!("nginx-{name}")), opts).expect("nginx");
    let base = format!("{}/m/", nginx.url());
    (nginx, base)
}

/// Another package of the same shape (other weights), in `other-pkg`.
fn other_package(s: &Site) -> PathBuf {
    let other = s.tmp.path().join("other-src");
    let mut spec = fixtures::preset("qwen2-tiny-f32").expect("preset");
    spec.seed = spec.seed.wrapping_add(1);
    fixtures::write_model(&other, &spec).expect("model");
    let pkg = s.tmp.path().join("other-pkg");
    let mut opts = gkq_pack::PackOptions::new(&other, &pkg);
    opts.dtypes = vec![DType::F32];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    pkg
}

/// Flips a byte at `at`, or `-at` from the end when negative.
fn flip(path: &Path, at: isize) {
    let mut b = fs::read(path).expect("read");
    let i = if at < 0 {
        b.len() - at.unsigned_abs()
    } else {
        at as usize
    };
    b[i] ^= 0x55;
    fs::write(path, b).expect("write");
}

fn config(s: &Site, mirrors: &[&str]) -> ReaderConfig {
    let mut c = with_timeout(ReaderConfig::default(), Duration::from_secs(2));
    c.columnar_embed = Some(format!("{}/m/", s.origin.url()));
    c.mirrors = mirrors.iter().map(|m| (*m).to_owned()).collect();
    c.store.retry.attempts = 1;
    c
}

/// Every row of the vocabulary and the lm_head, read through `mirrors`,
/// equal the ones read from the origin alone; the reader's source report.
fn read_all(s: &Site, mirrors: &[&str]) -> Vec<gkq_store::SourceReport> {
    let knot = format!("{}/m/model.knot", s.origin.url());
    let plain = Reader::open(&knot, config(s, &[]), Serve::ALL).expect("origin");
    let ids: Vec<u64> = (0..512).collect();
    let want = plain
        .embedding()
        .expect("embedding")
        .rows(&ids)
        .expect("rows");
    let want_lm = plain
        .lm_head()
        .expect("lm_head")
        .matrix()
        .expect("lm_head")
        .bytes()
        .clone();
    let r = Reader::open(&knot, config(s, mirrors), Serve::ALL).expect("open with mirrors");
    let e = r.embedding().expect("embedding");
    for chunk in ids.chunks(7) {
        let got = e.rows(chunk).expect("rows");
        for (k, id) in chunk.iter().enumerate() {
            assert!(got.bytes(k) == want.bytes(*id as usize), "row {id}");
        }
    }
    assert!(
        *r.lm_head()
            .expect("lm_head")
            .matrix()
            .expect("lm_head")
            .bytes()
            == want_lm
    );
    r.sources()
}

#[test]
fn a_good_mirror_shares_the_work() {
    let s = site();
    let (_m, base) = mirror(&s, "good", &NginxOptions::default(), |_| {});
    let report = read_all(&s, &[&base]);
    assert_eq!(report.len(), 2);
    assert!(report.iter().all(|r| r.dropped.is_none()), "{report:?}");
    assert!(
        report[1].requests > 0 && report[0].requests > 0,
        "both served: {report:?}"
    );
}

#[test]
fn bad_mirrors_are_dropped_with_their_evidence() {
    let s = site();
    // flipped bytes in the row file and in the lm_head's payload
    let (_a, flipped) = mirror(&s, "flipped", &NginxOptions::default(), |d| {
        flip(&d.join("token_embd.f32.rows"), 4096 * 3 + 17);
        flip(&d.join("token_embd.f32.rows.proof"), -5);
    });
    // another package's row file under the same name (same shape, other weights)
    let other_pkg = other_package(&s);
    let (_b, foreign) = mirror(&s, "foreign", &NginxOptions::default(), |d| {
        for name in ["token_embd.f32.rows", "token_embd.f32.rows.proof"] {
            fs::copy(other_pkg.join(name), d.join(name)).expect("copy");
        }
    });
    // a 200 to every Range request
    let (_c, no_range) = mirror(
        &s,
        "norange",
        &NginxOptions {
            ignore_ranges: true,
            ..Default::default()
        },
        |_| {},
    );
    // down, and stalled
    let down = format!(
        "http://127.0.0.1:{}/m/",
        fixtures::servers::free_port().expect("port")
    );
    let staller = Staller::start().expect("staller");
    let stalled = format!("{}/m/", staller.url());
    let all = [
        flipped.as_str(),
        foreign.as_str(),
        no_range.as_str(),
        down.as_str(),
        stalled.as_str(),
    ];
    let report = read_all(&s, &all);
    for (r, why) in
        report[1..]
            .iter()
            .zip(["failed verification", "failed verification", "", "", ""])
    {
        let d = r
            .dropped
            .as_deref()
            .unwrap_or_else(|| panic!("{} not dropped: {report:?}", r.base));
        assert!(d.contains(&r.base) && d.contains(why), "{d}");
    }
    assert!(report[0].dropped.is_none());
}

#[test]
fn every_source_bad_is_one_error_naming_each() {
    let mut s = site();
    let down = format!(
        "http://127.0.0.1:{}/m/",
        fixtures::servers::free_port().expect("port")
    );
    let (_a, flipped) = mirror(&s, "flipped", &NginxOptions::default(), |d| {
        for row in [1, 2, 3, 400] {
            flip(&d.join("token_embd.f32.rows"), row * 256 + 10);
        }
    });
    let knot = format!("{}/m/model.knot", s.origin.url());
    let r = Reader::open(&knot, config(&s, &[&down, &flipped]), Serve::INPUT).expect("open");
    // the origin goes away after the header
    fs::create_dir_all(s.tmp.path().join("empty")).expect("dir");
    s.origin = Nginx::start(
        &s.tmp.path().join("empty"),
        &s.tmp.path().join("nginx-gone"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let e = r
        .embedding()
        .expect("embedding")
        .rows(&[1u64, 2, 3, 400])
        .expect_err("no source left");
    let text = gkq_format::error_chain(&e);
    assert!(text.contains(&down) && text.contains(&flipped), "{text}");
    assert!(!matches!(e, ReaderError::TokenOutOfRange { .. }));
}

/// A slow mirror (every request held 400 ms at a proxy) among fast
/// sources: its requests are hedged to another source, which wins; it is
/// not dropped (slow is not wrong), and every row is right.
#[test]
fn a_slow_mirror_is_hedged() {
    let s = site();
    let (_fast, fast) = mirror(&s, "fast", &NginxOptions::default(), |_| {});
    let (slow_nginx, _) = mirror(&s, "slow", &NginxOptions::default(), |_| {});
    let proxy = fixtures::servers::DelayProxy::start(slow_nginx.port(), Duration::from_millis(400))
        .expect("proxy");
    let slow = format!("{}/m/", proxy.url());
    let report = read_all(&s, &[&fast, &slow]);
    assert!(report.iter().all(|r| r.dropped.is_none()), "{report:?}");
    let hedges: u64 = report.iter().map(|r| r.hedges_won).sum();
    assert!(hedges > 0, "no request was hedged: {report:?}");
}

fn lines(log: &str) -> usize {
    log.lines().filter(|l| !l.trim().is_empty()).count()
}

/// A fleet behind a real cache tier (nginx `proxy_cache` with the `slice`
/// module, as CDNs cache large ranged objects): three nodes boot cold
/// through it and the origin sends each slice once; a cache restarted
/// mid-boot keeps its slices; when the origin replaces the package at the
/// same URL while the cache still holds the old one, a node pinned to the
/// new knot is refused the stale one, and no node ever gets a mixed row.
#[test]
fn a_fleet_behind_a_slice_cache() {
    let s = site();
    let cache = s.tmp.path().join("slices");
    fs::create_dir_all(s.tmp.path().join("tier-root")).expect("dir");
    let opts = NginxOptions::slice_cache(s.origin.port(), &cache);
    let start_tier = |opts: &NginxOptions| {
        Nginx::start(
            &s.tmp.path().join("tier-root"),
            &s.tmp.path().join("nginx-tier"),
            opts,
        )
        .expect("cache tier")
    };
    let tier = start_tier(&opts);
    let node = |base: &str, pin: Option<gkq_format::KnotId>| {
        let mut c = config(&s, &[]);
        c.columnar_embed = Some(format!("{base}/m/"));
        c.knot_id = pin;
        Reader::open(&format!("{base}/m/model.knot"), c, Serve::ALL)
    };
    let ids: Vec<u64> = (0..512).collect();
    let rows_of = |r: &Reader| {
        let got = r.embedding().expect("embedding").rows(&ids).expect("rows");
        let lm = r
            .lm_head()
            .expect("lm_head")
            .matrix()
            .expect("matrix")
            .bytes()
            .clone();
        (
            (0..ids.len())
                .map(|i| got.bytes(i).expect("row").to_vec())
                .collect::<Vec<_>>(),
            lm,
        )
    };
    let want = rows_of(&node(&s.origin.url(), None).expect("origin"));
    let before = lines(&s.origin.access_log());
    assert_eq!(rows_of(&node(&tier.url(), None).expect("node 1")), want);
    let filled = lines(&s.origin.access_log());
    assert!(
        filled > before,
        "the first node filled the cache from the origin"
    );
    for n in 2..=3 {
        assert_eq!(
            rows_of(&node(&tier.url(), None).expect("node")),
            want,
            "node {n}"
        );
    }
    assert_eq!(
        lines(&s.origin.access_log()),
        filled,
        "nodes 2 and 3: every slice from the cache"
    );
    // the cache restarts on the same port and directory
    let port = tier.port();
    drop(tier);
    let tier = start_tier(&NginxOptions {
        port: Some(port),
        ..opts.clone()
    });
    assert_eq!(
        rows_of(&node(&tier.url(), None).expect("after a restart")),
        want
    );
    assert_eq!(
        lines(&s.origin.access_log()),
        filled,
        "the slices survived the restart"
    );
    // the origin replaces the package at the same URL
    let src = s.tmp.path().join("src-new");
    let mut spec = fixtures::preset("qwen2-tiny-f32").expect("preset");
    spec.seed = spec.seed.wrapping_add(7);
    fixtures::write_model(&src, &spec).expect("model");
    let mut p = gkq_pack::PackOptions::new(&src, &s.pkg);
    p.dtypes = vec![DType::F32];
    p.force = true;
    gkq_pack::pack(&p, &gkq_pack::NoProgress).expect("repack");
    let new_id = gkq_sign::knot_id_of(&s.pkg).expect("id");
    let e = node(&tier.url(), Some(new_id)).expect_err("the cache serves the old knot");
    assert!(matches!(e, ReaderError::KnotId { .. }), "{e}");
    let fresh =
        rows_of(&node(&s.origin.url(), Some(new_id)).expect("the origin serves the new one"));
    assert_ne!(fresh, want);
    // an unpinned node through the stale cache: the old package, whole
    let stale = node(&tier.url(), None).expect("stale");
    assert_eq!(rows_of(&stale), want, "never a mix of the two");
}

/// An object replaced at its URL during a session is noticed: every range
/// after the first carries `If-Range` with the ETag first seen, and nginx
/// answers the new object whole; the reader refuses to mix the two.
#[test]
fn an_object_replaced_in_place_is_noticed() {
    let s = site();
    let knot = format!("{}/m/model.knot", s.origin.url());
    let r = Reader::open(&knot, config(&s, &[]), Serve::INPUT).expect("open");
    let e = r.embedding().expect("embedding");
    e.rows(&[1u64, 2]).expect("rows");
    // nginx's ETag is the file's mtime (seconds) and length
    std::thread::sleep(Duration::from_millis(1100));
    flip(&s.pkg.join("token_embd.f32.rows"), 300 * 256 + 1);
    let err = e.rows(&[300u64]).expect_err("the row file changed");
    let text = gkq_format::error_chain(&err);
    assert!(text.contains("the object changed at this URL"), "{text}");
}

/// The knot header from a mirror (issue 32, item 1), only when trust does
/// not depend on the channel. The origin cannot be reached (an air-gapped
/// site): without a pin or a key the node cannot open; with a pinned id,
/// or a trusted key, it opens from a mirror and says which served the
/// header. A mirror serving another package's knot under the same name,
/// or a signature by another key, is dropped with why, and the next
/// source asked; every row is right.
#[test]
fn the_header_comes_from_a_mirror_only_when_trust_does_not_depend_on_the_channel() {
    use sha2::Digest;
    let s = site();
    let key =
        p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    // named as published (…/m/): a header from a mirror must be bound to it
    gkq_sign::sign_named(&s.pkg, &key, Some("m")).expect("sign");
    let id = gkq_sign::knot_id_of(&s.pkg).expect("id");
    let (_g, good) = mirror(&s, "good", &NginxOptions::default(), |_| {});
    // another package's knot and signature (another key) under the same names
    let other_pkg = other_package(&s);
    let intruder =
        p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"intruder")).expect("key");
    gkq_sign::sign_package(&other_pkg, &intruder).expect("sign");
    let (_f, foreign) = mirror(&s, "foreign", &NginxOptions::default(), |d| {
        fs::copy(other_pkg.join("model.knot"), d.join("model.knot")).expect("copy");
    });
    let (_b, badsig) = mirror(&s, "badsig", &NginxOptions::default(), |d| {
        fs::copy(other_pkg.join("model.sig"), d.join("model.sig")).expect("copy");
    });
    let port = fixtures::servers::free_port().expect("port");
    let knot = format!("http://127.0.0.1:{port}/m/model.knot");
    let open = |mirrors: &[&str], trust: (Option<gkq_format::KnotId>, bool)| {
        let mut c = config(&s, mirrors);
        c.columnar_embed = Some(format!("http://127.0.0.1:{port}/m/"));
        c.knot_id = trust.0;
        if trust.1 {
            c.trust = vec![gkq_format::sig::PublicKey::from_key(*key.verifying_key())];
        }
        Reader::open(&knot, c, Serve::INPUT)
    };
    // the channel's trust: the origin's header or nothing
    let e = open(&[&good], (None, false)).expect_err("no origin, no trust");
    assert!(
        gkq_format::error_chain(&e).contains(&format!("127.0.0.1:{port}")),
        "{e}"
    );
    let plain = Reader::open(
        &format!("{}/m/model.knot", s.origin.url()),
        config(&s, &[]),
        Serve::INPUT,
    )
    .expect("origin");
    let ids: Vec<u64> = (0..512).step_by(7).collect();
    let want = plain.embedding().expect("e").rows(&ids).expect("rows");
    let check = |r: &Reader| {
        let got = r.embedding().expect("e").rows(&ids).expect("rows");
        for (i, id) in ids.iter().enumerate() {
            assert!(got.bytes(i) == want.bytes(i), "row {id}");
        }
    };
    for (mirrors, trust, dropped) in [
        (vec![good.as_str()], (Some(id), false), None),
        (vec![good.as_str()], (None, true), None),
        (
            vec![foreign.as_str(), good.as_str()],
            (Some(id), false),
            Some(&foreign),
        ),
        (
            vec![badsig.as_str(), good.as_str()],
            (None, true),
            Some(&badsig),
        ),
    ] {
        let r = open(&mirrors, trust).expect("opens from a mirror");
        assert_eq!(r.knot().header_from(), Some(good.as_str()), "{mirrors:?}");
        assert_eq!(r.knot_id(), id.to_string());
        check(&r);
        let report = r.sources();
        if let Some(bad) = dropped {
            let d = report
                .iter()
                .find(|x| &x.base == bad)
                .and_then(|x| x.dropped.clone())
                .unwrap_or_else(|| panic!("{bad} not dropped: {report:?}"));
            assert!(d.contains("model."), "the evidence names the object: {d}");
        }
    }
}

/// Issue 42, item 1: another model signed by the same publisher key,
/// served by a mirror at the requested package's URL while the origin is
/// down, is refused under every trust setting that does not pin the id,
/// with a message naming both packages: a signature that names another
/// package (gkq-sign --name), or one that names none, served away from
/// the origin. The right package through a mirror still opens.
#[test]
fn another_model_signed_by_the_same_key_is_refused_through_a_mirror() {
    use sha2::Digest;
    let s = site();
    let key =
        p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    gkq_sign::sign_named(&s.pkg, &key, Some("m")).expect("sign");
    let asked_id = gkq_sign::knot_id_of(&s.pkg).expect("id");
    let other = other_package(&s);
    let other_id = gkq_sign::knot_id_of(&other).expect("id");
    let serve_other = |name: &str, package: Option<&str>| {
        gkq_sign::sign_named(&other, &key, package).expect("sign other");
        mirror(&s, name, &NginxOptions::default(), |d| {
            for f in fs::read_dir(&other).expect("other") {
                let p = f.expect("entry").path();
                fs::copy(&p, d.join(p.file_name().expect("name"))).expect("copy");
            }
        })
    };
    let (_n, named) = serve_other("named", Some("other/v1"));
    let (_u, unnamed) = serve_other("unnamed", None);
    let (_g, good) = mirror(&s, "good", &NginxOptions::default(), |_| {});
    let port = fixtures::servers::free_port().expect("port");
    let knot = format!("http://127.0.0.1:{port}/m/model.knot");
    let open = |mirror: &str, keys: bool, package: Option<&str>| {
        let mut c = config(&s, &[mirror]);
        c.columnar_embed = None;
        if keys {
            c.trust = vec![gkq_format::sig::PublicKey::from_key(*key.verifying_key())];
        }
        c.package = package.map(str::to_owned);
        Reader::open(&knot, c, Serve::INPUT)
    };
    for (mirror, keys, package) in [
        (&named, false, None),
        (&named, true, None),
        (&named, true, Some("m")),
        (&unnamed, false, None),
        (&unnamed, true, None),
        (&unnamed, true, Some("m")),
    ] {
        let e = open(mirror, keys, package).expect_err("another model is refused");
        let text = gkq_format::error_chain(&e);
        if !keys {
            // the channel's trust: the origin is down, no header is taken
            assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
            continue;
        }
        assert!(
            text.contains(&other_id.to_string()),
            "names the package served: {text}"
        );
        let asked = if package.is_some() {
            "package \"m\""
        } else {
            "package \"m\" (the path of the URL)"
        };
        assert!(text.contains(asked), "names the package asked for: {text}");
        if mirror == &named {
            assert!(text.contains("package \"other/v1\""), "{text}");
        } else {
            assert!(
                text.contains("naming no package") && text.contains(mirror.as_str()),
                "{text}"
            );
        }
    }
    // the package asked for, through a mirror: opens, and its rows are its own
    let r = open(&good, true, None).expect("the right package through a mirror");
    assert_eq!(r.knot_id(), asked_id.to_string());
    let r = open(&good, true, Some("m")).expect("with --package");
    assert_eq!(r.knot_id(), asked_id.to_string());
    let e = open(&good, true, Some("other/v1")).expect_err("asked for another name");
    assert!(gkq_format::error_chain(&e).contains("package \"m\""), "{e}");
}

/// Issue 42, item 7: with two and three mirrors serving wrong bytes of
/// every block and a healthy origin, every dense block read ends at the
/// origin with the right bytes (each bad mirror dropped with its
/// evidence), as rows already did: the origin is the source of last resort.
#[test]
fn dense_blocks_reach_a_healthy_origin_past_every_bad_mirror() {
    let s = site();
    let knot = format!("{}/m/model.knot", s.origin.url());
    let plain = Reader::open(&knot, config(&s, &[]), Serve::NONE).expect("origin");
    let names: Vec<String> = plain
        .knot()
        .header()
        .header()
        .blocks
        .iter()
        .filter(|b| !matches!(b.encoding, gkq_format::Encoding::Alias { .. }))
        .map(|b| b.name.clone())
        .collect();
    let want: Vec<_> = names
        .iter()
        .map(|n| plain.block_payload(n).expect("block"))
        .collect();
    let len = fs::metadata(s.pkg.join("model.knot")).expect("knot").len() as isize;
    let bad = |name: &str| {
        mirror(&s, name, &NginxOptions::default(), |d| {
            // a byte in every 4 KiB of the payloads (the header left alone)
            for at in (64 << 10..len).step_by(4096) {
                flip(&d.join("model.knot"), at);
            }
        })
    };
    let mirrors: Vec<(Nginx, String)> = (0..3).map(|i| bad(&format!("bad{i}"))).collect();
    for n in [2, 3] {
        let bases: Vec<&str> = mirrors[..n].iter().map(|(_, b)| b.as_str()).collect();
        let r = Reader::open(&knot, config(&s, &bases), Serve::NONE).expect("open");
        for (name, want) in names.iter().zip(&want) {
            let got = r
                .block_payload(name)
                .unwrap_or_else(|e| panic!("{n} bad mirrors, block {name}: {e}"));
            assert!(got == *want, "block {name}");
        }
        let report = r.sources();
        let dropped = report.iter().filter(|x| x.dropped.is_some()).count();
        assert_eq!(dropped, n, "every bad mirror dropped: {report:?}");
        assert!(report[0].dropped.is_none(), "the origin is never dropped");
    }
}
