//! `gkq-decode`: decoding a knot through gkq-reader. Flags
//! ([`gkq_decode::run::Args`]) into options, then the library's `run`.

use std::process::ExitCode;

use clap::Parser;
use gkq_decode::DecodeError;
use gkq_decode::run::{Args, Out, llama_cpp_flag};

#[allow(unsafe_code)]
fn main() -> ExitCode {
    let started = std::time::Instant::now();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            // a llama.cpp habit gets what gkq-decode does instead
            let flag = e
                .get(clap::error::ContextKind::InvalidArg)
                .map(|v| v.to_string());
            if let Some(m) = flag.as_deref().and_then(llama_cpp_flag) {
                eprintln!("gkq-decode: usage: {m}");
                return ExitCode::from(2);
            }
            e.exit()
        }
    };
    // SAFETY: no other thread runs yet (nothing above starts one)
    let threads = unsafe { gkq_decode::run::set_threads(args.threads()) };
    gkq_cli::init_logging();
    let (stdout, stderr) = (&mut std::io::stdout(), &mut std::io::stderr());
    let result = args
        .options(started, threads)
        .and_then(|o| gkq_decode::run::run(&o, &mut Out { stdout, stderr }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(DecodeError::Io { error, .. }) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(DecodeError::Usage(m)) => {
            eprintln!("gkq-decode: usage: {m}");
            ExitCode::from(2)
        }
        Err(e) => gkq_cli::exit("gkq-decode", Err(e.into())),
    }
}
