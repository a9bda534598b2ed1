//! `cargo xtask local-servers`: refuses taken ports, stops its servers on SIGTERM.

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One test, so the two scenarios never race for the fixed ports.
#[test]
fn local_servers_ports_and_sigterm() {
    assert!(
        !listening(8014) && !listening(8080),
        "ports 8014/8080 must be free for this test"
    );
    // a taken port: refused, with the reason
    let blocker = std::net::TcpListener::bind("127.0.0.1:8014").expect("bind 8014");
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("local-servers")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("127.0.0.1:8014 is already in use"), "{err}");
    drop(blocker);

    // SIGTERM stops s3s-fs and nginx too
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("local-servers")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for("both servers", || listening(8014) && listening(8080));
    // the lines a user pastes: an export of the keys, and the upload
    let mut err = child.stderr.take().expect("stderr");
    let mut seen = String::new();
    let t = Instant::now();
    while !seen.contains("cargo xtask upload") && t.elapsed() < Duration::from_secs(10) {
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut err, &mut buf).expect("read");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(
        seen.contains("export R2_ACCESS_KEY_ID=") && seen.contains(" R2_SECRET_ACCESS_KEY="),
        "{seen}"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    wait_for("ports to close", || !listening(8014) && !listening(8080));
}
