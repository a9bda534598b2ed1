//! `fuzz-mutate [--seconds N] [--seed S]`: the bounded mutation fuzzer of
//! the knot parser (`gkq_fuzz::mutate`), on the stable toolchain and
//! without AFL++; `cargo xtask fuzz` runs it.

fn main() -> std::process::ExitCode {
    let (mut seconds, mut seed) = (60u64, 1u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (a.as_str(), value) {
            ("--seconds", Some(v)) => seconds = v,
            ("--seed", Some(v)) => seed = v,
            _ => {
                eprintln!("usage: fuzz-mutate [--seconds N] [--seed S]");
                return std::process::ExitCode::from(2);
            }
        }
    }
    match gkq_fuzz::mutate::run(seconds, seed) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
