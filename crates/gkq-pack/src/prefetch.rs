//! Reads source chunks on a second thread, a few chunks ahead of the
//! consumer, so that copying bytes in overlaps casting, hashing and writing.
//! Memory is bounded by `DEPTH + 2` chunk buffers, which are recycled.

use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};

use crate::error::{PackError, Result};
use gkq_source::{SourceModel, SourceTensor};
use sha2::{Digest, Sha256};

/// Chunks read ahead: 64 MiB, so that the reader, whose hashing of the
/// source is the pass's longest serial chain, seldom waits for the
/// consumer (`--quant q4_0` of bench quantize's bf16 GGUF on two cores: a
/// median of 1.31 s with 2, 1.06 s with 8, in five alternations).
const DEPTH: usize = 8;

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

/// Runs `body` while a scoped thread reads `plan` (each tensor's chunks,
/// in tensor order) from `src` and hashes what it reads, with the bytes
/// after each tensor (a GGUF's padding), into its file's hasher: the source
/// digests are of the bytes converted, and hashing them overlaps the work.
pub(crate) fn with_prefetch<R>(
    src: &SourceModel,
    plan: &[Vec<(u64, usize)>],
    hashers: &mut [Sha256],
    body: impl FnOnce(&mut Prefetch) -> Result<R>,
) -> Result<R> {
    std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Result<Vec<u8>>>(DEPTH);
        let (back, spare) = channel::<Vec<u8>>();
        let reader = s.spawn(move || -> Result<()> {
            for (t, chunks) in src.tensors.iter().zip(plan) {
                let hasher = hashers.get_mut(t.file).expect("a hasher per source file");
                for &(at, len) in chunks {
                    let mut buf = spare.try_recv().unwrap_or_default();
                    buf.resize(len, 0);
                    let r = src.read(t, at, &mut buf).map(|()| buf);
                    if let Ok(buf) = &r {
                        hasher.update(buf);
                    }
                    let failed = r.is_err();
                    if tx.send(r.map_err(PackError::from)).is_err() || failed {
                        return Ok(());
                    }
                }
                if t.pad > 0 {
                    hasher.update(src.read_pad(t)?);
                }
            }
            Ok(())
        });
        let mut pf = Prefetch { rx, back };
        let out = body(&mut pf)?;
        // `pf` (and its receiver) drops on error, which stops the reader early
        drop(pf);
        reader.join().expect("the reader thread does not panic")?;
        Ok(out)
    })
}
