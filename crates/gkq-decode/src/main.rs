//! `gkq-decode`: decoding a knot through gkq-reader. Flags (`run/args.rs`)
//! into options, then the run (`run/`) over the library's stages.

use std::process::ExitCode;

use clap::Parser;
use gkq_decode::DecodeError;
mod run;

use run::{Args, Out, llama_cpp_flag, long_forms};

#[allow(unsafe_code)]
fn main() -> ExitCode {
    let started = std::time::Instant::now();
    // llama.cpp's flags that gkq-decode does not take, before clap: it
    // would read -ngl as -n with a value, and name the value of -j 1 as
    // the unexpected argument
    let argv = long_forms(std::env::args());
    if let Some(m) = argv
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .filter(|a| a.starts_with('-'))
        .find_map(|a| llama_cpp_flag(a))
    {
        return usage(&m);
    }
    let args = match Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) => {
            // a llama.cpp habit gets what gkq-decode does instead
            let flag = e
                .get(clap::error::ContextKind::InvalidArg)
                .map(|v| v.to_string());
            if let Some(m) = flag.as_deref().and_then(llama_cpp_flag) {
                return usage(&m);
            }
            if gkq_cli::json_asked() && e.use_stderr() {
                return usage(e.render().to_string().lines().next().unwrap_or(""));
            }
            e.exit()
        }
    };
    // SAFETY: no other thread runs yet (nothing above starts one)
    let (threads, asked) = unsafe {
        run::keep_freed_buffers();
        run::set_threads(args.threads())
    };
    if args.logging() {
        gkq_cli::init_logging();
    }
    if let Some(asked) = asked {
        eprintln!(
            "gkq-decode: note: {asked} threads asked for; this machine has {threads} cores, so {threads} are used"
        );
    }
    let (stdout, stderr) = (&mut std::io::stdout(), &mut std::io::stderr());
    let stdin = &mut std::io::BufReader::new(std::io::stdin());
    let result = args.options(started, threads).and_then(|o| {
        run::run(
            &o,
            &mut Out {
                stdin,
                stdout,
                stderr,
            },
        )
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(DecodeError::Io { error, .. }) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(DecodeError::Usage(m)) => usage(&m),
        Err(e) => gkq_cli::exit("gkq-decode", Err(e.into())),
    }
}

/// A usage error: exit 2, as JSON with `--json`.
fn usage(message: &str) -> ExitCode {
    if gkq_cli::json_asked() {
        let e = std::io::Error::other(message.trim_start_matches("error: ").to_owned());
        eprintln!("{}", gkq_cli::json_failure("gkq-decode", Some("usage"), &e));
    } else {
        eprintln!("gkq-decode: usage: {message}");
    }
    ExitCode::from(2)
}
