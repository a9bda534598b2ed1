//! The gate's output, pinned: every line and every JSON report of a set of
//! scenarios (clean, each kind of damage, notes, a spectral block, `--url`
//! clean and damaged, `--quiet`) must stay byte for byte what the files in
//! `tests/pinned/` hold, once times, temporary paths and ports are
//! normalised. Restructuring the gate must not change a byte of what it
//! says. `GKQ_BLESS=1` rewrites the files (only when the change is meant).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use fixtures::servers::{Nginx, NginxOptions};

fn pack(
    spec: &fixtures::Spec,
    dtypes: &[&str],
    dir: &Path,
    spectral: &[&str],
) -> (PathBuf, PathBuf) {
    let src = dir.join("model");
    fixtures::write_model(&src, spec).expect("fixture");
    let out = dir.join("www/out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = dtypes.iter().map(|d| d.parse().expect("dtype")).collect();
    opts.spectral = spectral.iter().map(|s| s.parse().expect("spec")).collect();
    // the outputs pinned before version 5: blocks in the knot
    opts.one_copy = false;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    (src, out)
}

/// Times, temporary paths and ports out of the way.
fn normalise(text: &str, tmp: &Path) -> String {
    let mut s = text.replace(&tmp.display().to_string(), "TMP");
    for (i, _) in s.clone().match_indices("127.0.0.1:") {
        let end = s[i + 10..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(s.len(), |e| i + 10 + e);
        s.replace_range(i + 10..end, &"P".repeat(end - i - 10));
    }
    let s = s
        .replace(&"P".repeat(5), "PORT")
        .replace(&"P".repeat(4), "PORT");
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    // "0.123s" and "\"seconds\": 0.0123…" become fixed strings
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let n = tail
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-'))
            .unwrap_or(tail.len());
        let (num, after) = tail.split_at(n);
        let timed = after.starts_with("s,")
            || after.starts_with("s)")
            || after.starts_with('s') && after[1..].starts_with(char::is_whitespace)
            || out.ends_with("\"seconds\": ");
        if timed && num.contains('.') {
            out.push('T');
        } else {
            out.push_str(num);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn run(args: &[&str], tmp: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
        .args(args)
        .output()
        .expect("run gkq-verify");
    let mut s = normalise(&String::from_utf8_lossy(&o.stdout), tmp);
    for l in String::from_utf8_lossy(&o.stderr).lines() {
        s.push_str(&format!("stderr: {}\n", normalise(l, tmp)));
    }
    s.push_str(&format!("exit {}\n", o.status.code().unwrap_or(-1)));
    s
}

fn pin(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/pinned")
        .join(name);
    if std::env::var_os("GKQ_BLESS").is_some() {
        fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        fs::write(&path, got).expect("bless");
        return;
    }
    let want = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (GKQ_BLESS=1 writes it)", path.display()));
    assert!(
        want == got,
        "{name} changed:\n--- pinned\n{want}\n--- now\n{got}"
    );
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).expect("read");
    b[at] ^= 0x40;
    fs::write(path, b).expect("write");
}

#[test]
fn local_outputs_are_pinned() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    let (src, out) = pack(&spec, &["f32", "bf16"], &t.join("a"), &[]);
    pin("clean.txt", &run(&[s(&out), "--source", s(&src)], t));
    pin(
        "clean.json",
        &run(&[s(&out), "--source", s(&src), "--json"], t),
    );
    // a lossy cast: NOTE lines (f32 source, bf16 rows)
    let f32spec = fixtures::preset("llama-tiny-f32").expect("preset");
    let (src2, out2) = pack(&f32spec, &["bf16", "f32"], &t.join("b"), &[]);
    pin("notes.txt", &run(&[s(&out2), "--source", s(&src2)], t));
    // the wrong source: one failure per tensor
    pin(
        "wrong-source.txt",
        &run(&[s(&out), "--source", s(&src2)], t),
    );
    // issue 58: a check shows 8 NOTE lines and counts the rest; --verbose
    // lists them all
    let all = run(&[s(&out), "--source", s(&src2), "--verbose"], t);
    assert_eq!(all.matches("\tNOTE\t").count(), 19, "{all}");
    assert!(!all.contains("more notes"), "{all}");
    // a spectral block checked against its source
    let low = fixtures::Spec {
        low_rank: Some((16, 1e-4)),
        ..fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::BF16)
    };
    let (src3, out3) = pack(&low, &["bf16"], &t.join("c"), &["*.q_proj.weight=rank:16"]);
    pin(
        "spectral.json",
        &run(&[s(&out3), "--source", s(&src3), "--json"], t),
    );
    // damage: a row byte, a payload byte, a missing row file, a proof byte
    flip(&out.join("token_embd.bf16.rows"), 128 * 5 + 3);
    pin("bad-row.txt", &run(&[s(&out)], t));
    pin("bad-row.json", &run(&[s(&out), "--json"], t));
    pin("bad-row-quiet.txt", &run(&[s(&out), "--quiet"], t));
    flip(&out.join("model.knot"), 20_000);
    pin("bad-payload.txt", &run(&[s(&out), "--source", s(&src)], t));
    fs::remove_file(out2.join("token_embd.f32.rows")).expect("rm");
    flip(&out2.join("token_embd.bf16.rows.proof"), 100);
    pin("missing-rows.txt", &run(&[s(&out2)], t));
}

#[test]
fn remote_outputs_are_pinned() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    let spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    let (_, out) = pack(&spec, &["f32", "bf16"], t, &[]);
    let nginx = Nginx::start(&t.join("www"), &t.join("nginx"), &NginxOptions::default())
        .expect("nginx (scripts/install-test-deps.sh)");
    let url = format!("{}/out", nginx.url());
    pin("remote.txt", &run(&[s(&out), "--url", &url], t));
    pin("remote.json", &run(&[s(&out), "--url", &url, "--json"], t));
    // the published row file differs from the local one
    let served = t.join("www/out/token_embd.f32.rows");
    let local = t.join("local");
    fs::create_dir_all(&local).expect("dir");
    for e in fs::read_dir(&out).expect("out") {
        let p = e.expect("entry").path();
        fs::copy(&p, local.join(p.file_name().expect("name"))).expect("copy");
    }
    flip(&served, 256 * 511 + 9);
    pin("remote-bad-row.txt", &run(&[s(&local), "--url", &url], t));
    drop(nginx);
    pin(
        "remote-down.txt",
        &run(&[s(&local), "--url", &url, "--timeout", "2"], t),
    );
}
