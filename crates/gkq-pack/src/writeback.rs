//! Background writeback of the files being written.

use std::fs::File;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

/// Source bytes between two background writeback requests.
const WRITEBACK_STEP: u64 = 128 << 20;

/// Background writeback: every [`WRITEBACK_STEP`] bytes a thread syncs the
/// files written so far, so the final fsync before commit has little left
/// and disk writes overlap the CPU work. Errors here are not lost: the
/// final sync reports them.
pub(crate) struct Writeback {
    knot: File,
    tx: Sender<File>,
    since: u64,
    thread: JoinHandle<()>,
}

impl Writeback {
    pub(crate) fn start(knot: File) -> Writeback {
        let (tx, rx) = std::sync::mpsc::channel::<File>();
        let thread = std::thread::spawn(move || {
            for f in rx {
                let _ = f.sync_data();
            }
        });
        Writeback {
            knot,
            tx,
            since: 0,
            thread,
        }
    }

    /// Counts `n` more bytes; at each step, asks for the knot and `also` to be synced.
    pub(crate) fn advance(&mut self, n: u64, also: Option<&File>) {
        self.since += n;
        if self.since < WRITEBACK_STEP {
            return;
        }
        self.since = 0;
        let files = also.and_then(|f| f.try_clone().ok()).into_iter();
        for f in files.chain(self.knot.try_clone().ok()) {
            let _ = self.tx.send(f);
        }
    }

    pub(crate) fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}
