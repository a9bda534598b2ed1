//! Reads source chunks on a second thread, a few chunks ahead of the
//! consumer, so that copying bytes in overlaps casting, hashing and writing.
//! Memory is bounded by `DEPTH + 2` chunk buffers, which are recycled.

use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};

use crate::error::{PackError, Result};
use gkq_source::{SourceModel, SourceTensor};

/// Chunks read ahead.
const DEPTH: usize = 2;

/// Bytes per step: whole rows for a 2-D role tensor (or one converted row
/// by row), `chunk` otherwise.
pub(crate) fn plan(t: &SourceTensor, whole_rows: bool, chunk: usize) -> Vec<(u64, usize)> {
    let step = match (whole_rows, t.shape.get(1)) {
        (true, Some(&cols)) => {
            let rb = t.dtype.row_bytes(cols).unwrap_or(0).max(1) as usize;
            (chunk / rb).max(1) * rb
        }
        _ => chunk,
    } as u64;
    let mut out = Vec::new();
    let mut at = 0;
    while at < t.len {
        let n = (t.len - at).min(step);
        out.push((at, n as usize));
        at += n;
    }
    out
}

/// The consumer side: chunks arrive in plan order.
pub(crate) struct Prefetch {
    rx: Receiver<Result<Vec<u8>>>,
    back: Sender<Vec<u8>>,
}

impl Prefetch {
    /// The next chunk of the plan.
    pub(crate) fn next(&mut self) -> Result<Vec<u8>> {
        self.rx
            .recv()
            .expect("the reader thread sends one result per planned chunk")
    }

    /// Returns a buffer for reuse.
    pub(crate) fn recycle(&mut self, buf: Vec<u8>) {
        let _ = self.back.send(buf);
    }
}

/// Runs `body` while a scoped thread reads `plan` (tensor index, offset,
/// length) from `src` in order.
pub(crate) fn with_prefetch<R>(
    src: &SourceModel,
    plan: &[(usize, u64, usize)],
    body: impl FnOnce(&mut Prefetch) -> Result<R>,
) -> Result<R> {
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Result<Vec<u8>>>(DEPTH);
        let (back, spare) = channel::<Vec<u8>>();
        s.spawn(move || {
            for &(t, at, len) in plan {
                let mut buf = spare.try_recv().unwrap_or_default();
                buf.resize(len, 0);
                let r = src
                    .read(&src.tensors[t], at, &mut buf)
                    .map(|()| buf)
                    .map_err(PackError::from);
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    break;
                }
            }
        });
        let mut pf = Prefetch { rx, back };
        body(&mut pf)
        // `pf` (and its receiver) drops here, which stops the reader early on error.
    })
}
