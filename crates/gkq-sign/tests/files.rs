//! Issue 42, item 2: gkq-sign reads only regular files: a FIFO as the knot
//! or as any file of the package is refused at once (it hung), a link in
//! the package is refused, and a key that is a device is refused before
//! a byte is read.

use std::fs;
use std::path::Path;
use std::process::Command;

use p256::pkcs8::{EncodePrivateKey, LineEnding};
use sha2::{Digest, Sha256};

fn packed(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    out
}

fn sign(pkg: &Path, key: &Path) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gkq-sign"));
    c.arg(pkg).arg("--key").arg(key);
    fixtures::output_within(&mut c, 60)
}

fn fails(out: &std::process::Output, needles: &[&str]) {
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    for n in needles {
        assert!(text.contains(n), "{n:?} not in {text}");
    }
    assert!(!text.contains("panicked"), "{text}");
}

#[test]
fn fifos_links_and_devices_are_refused_at_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path());
    let k = p256::ecdsa::SigningKey::from_slice(&Sha256::digest(b"publisher")).expect("key");
    let key = tmp.path().join("key.pem");
    fs::write(
        &key,
        k.to_pkcs8_pem(LineEnding::LF).expect("pem").as_bytes(),
    )
    .expect("key");
    // a FIFO among the package's files
    let fifo = pkg.join("notes.txt");
    fixtures::fifo(&fifo);
    fails(
        &sign(&pkg, &key),
        &["notes.txt", "a FIFO, not a regular file"],
    );
    assert!(!pkg.join("model.sig").exists());
    fs::remove_file(&fifo).expect("rm");
    // the knot itself a FIFO (given as the knot path, as other tools take it)
    let knot = pkg.join("model.knot");
    let saved = fs::read(&knot).expect("knot");
    fs::remove_file(&knot).expect("rm");
    fixtures::fifo(&knot);
    fails(
        &sign(&knot, &key),
        &["model.knot", "a FIFO, not a regular file"],
    );
    fs::remove_file(&knot).expect("rm");
    fs::write(&knot, saved).expect("restore");
    // a link in the package
    std::os::unix::fs::symlink("/etc/hostname", pkg.join("link.txt")).expect("link");
    fails(&sign(&pkg, &key), &["link.txt", "symbolic link"]);
    fs::remove_file(pkg.join("link.txt")).expect("rm");
    // the key a device
    fails(
        &sign(&pkg, Path::new("/dev/zero")),
        &["/dev/zero", "a device, not a regular file"],
    );
    // and the package as it is, given as its knot path: signed
    let ok = sign(&knot, &key);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(pkg.join("model.sig").is_file());
}
