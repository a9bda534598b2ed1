//! A bounded run of the mutation fuzzer of the knot parser (`cargo xtask
//! fuzz`) as part of the suite: the `fuzz-mutate` binary this test build
//! made, for `GKQ_FUZZ_SECONDS` (default 10, on every core).

use std::process::Command;

#[test]
fn the_knot_parser_survives_a_bounded_fuzz_run() {
    let seconds = std::env::var("GKQ_FUZZ_SECONDS").unwrap_or_else(|_| "10".into());
    let o = Command::new(env!("CARGO_BIN_EXE_fuzz-mutate"))
        .args(["--seconds", &seconds])
        .output()
        .expect("run fuzz-mutate");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}{err}");
    assert!(format!("{out}{err}").contains("no panics"), "{out}{err}");
}
