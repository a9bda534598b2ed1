//! The blocking facade over the async core: a runtime of its own (two I/O
//! worker threads, at most [`MAX_BLOCKING_THREADS`] on its blocking pool)
//! that blocking APIs drive with `block_on`.
//!
//! Calling it from inside a tokio runtime is refused with
//! [`StoreError::InsideRuntime`], which names the async call to use: a
//! blocking wait there would stall a worker, and tokio panics when a
//! runtime is started or dropped inside another. Dropping it waits for its
//! threads to end ([`SHUTDOWN_WAIT`] at most): a thread left running is
//! detached while it exits, and glibc's `pthread_detach` of an exiting
//! thread crashed a process at exit (`gkq-decode`, about 1 run in 300 under
//! load). Only inside another runtime, where no wait is allowed, is it
//! shut down in the background.

use std::future::Future;

use crate::error::{Result, StoreError};

/// Locks `m`, also after a panic in another holder: the data guarded in
/// this workspace (caches, counters, slots) stays usable, so a poisoned
/// lock is not a reason to fail. The one poison-tolerant lock of the crates.
pub fn lock<T: ?Sized>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The most threads the facade's blocking pool starts (local reads, part
/// checks, hashing): reads queue for them instead of starting one thread
/// each (a local package's pull started about 300).
pub const MAX_BLOCKING_THREADS: usize = 8;

/// How long dropping the runtime waits for its threads.
pub const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A runtime for blocking callers.
#[derive(Debug)]
pub struct Runtime {
    rt: Option<tokio::runtime::Runtime>,
}

/// Whether this thread is inside a tokio runtime (a worker, a `block_on`,
/// or a `spawn_blocking` closure of some runtime).
pub fn inside_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

impl Runtime {
    /// Starts the runtime. `call` and `instead` name the blocking call and
    /// its async counterpart for the error given inside a runtime.
    pub fn new(call: &'static str, instead: &'static str) -> Result<Runtime> {
        if inside_runtime() {
            return Err(StoreError::InsideRuntime { call, instead });
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(MAX_BLOCKING_THREADS)
            .thread_name("gkq-io")
            .enable_all()
            .build()
            .map_err(StoreError::Runtime)?;
        Ok(Runtime { rt: Some(rt) })
    }

    /// Runs `f` to completion on this runtime, or refuses inside another
    /// runtime (see the module docs).
    pub fn block_on<F: Future>(
        &self,
        call: &'static str,
        instead: &'static str,
        f: F,
    ) -> Result<F::Output> {
        if inside_runtime() {
            return Err(StoreError::InsideRuntime { call, instead });
        }
        Ok(self.rt().block_on(f))
    }

    /// A handle to spawn background work on this runtime.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.rt().handle()
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt
            .as_ref()
            .expect("the runtime is only taken out by drop")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            if inside_runtime() {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(SHUTDOWN_WAIT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_inside_a_runtime_and_dropped_there_safely() {
        let rt = Runtime::new("Reader::open", "AsyncReader::open").expect("runtime");
        assert_eq!(rt.block_on("a", "b", async { 7 }).expect("outside"), 7);
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("outer runtime");
        outer.block_on(async {
            let e = rt.block_on("Reader::open", "AsyncReader::open", async { 1 });
            assert!(
                matches!(
                    e,
                    Err(StoreError::InsideRuntime {
                        instead: "AsyncReader::open",
                        ..
                    })
                ),
                "{e:?}"
            );
            let e = Runtime::new("Reader::open", "AsyncReader::open").expect_err("refused");
            assert!(e.to_string().contains("use AsyncReader::open"), "{e}");
            drop(rt); // no panic: shut down in the background
        });
    }
}
