//! The end of a `main`, shared by the reader's binaries.

use std::process::ExitCode;

/// Exit 0 on success and when the reader of stdout went away (`| head`);
/// otherwise print the error chain on one line as `NAME: error: …` and exit 1.
pub(crate) fn exit(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
