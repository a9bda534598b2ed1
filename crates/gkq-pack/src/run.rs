//! The one pass of [`crate::pack`] over the source: every tensor read once,
//! in chunks, by the prefetcher; role tensors cast to the block dtype and
//! to each row file's dtype, checked for exactness and hashed into Merkle
//! leaves; every byte fed to its source file's hasher on the way; disk
//! writeback started in the background as the files grow.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

use gkq_format::{CastReport, DType, Header, KNOT_NAME, KnotWriter, Role, Value};
use gkq_source::{SourceModel, SourceTensor};
use sha2::{Digest, Sha256};

use crate::Progress;
use crate::error::{IoContext, PackError, Result, format_err};
use crate::options::PackOptions;
use crate::output::{Output, flush_file};
use crate::prefetch;
use crate::report::{CastSummary, ColumnarReport, FileReport};
use crate::rows::{RoleOut, RowSink, cast_rows, finish_row_file, overflow_error};

/// Bytes of source read per step.
const CHUNK: usize = 8 << 20;
/// Source bytes between two background writeback requests.
const WRITEBACK_STEP: u64 = 128 << 20;

/// Background writeback: every [`WRITEBACK_STEP`] bytes a thread syncs the
/// files written so far, so the final fsync before commit has little left
/// and disk writes overlap the CPU work. Errors here are not lost: the
/// final sync reports them.
struct Writeback {
    knot: File,
    tx: Sender<File>,
    since: u64,
    thread: JoinHandle<()>,
}

impl Writeback {
    fn start(knot: File) -> Writeback {
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
    fn advance(&mut self, n: u64, also: Option<&File>) {
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

    fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// What the pass produced, before the final sync and commit.
pub(crate) struct Finished {
    pub(crate) knot_id: String,
    pub(crate) knot_path: PathBuf,
    pub(crate) tensors: usize,
    pub(crate) columnar: Vec<ColumnarReport>,
    pub(crate) casts: Vec<CastSummary>,
    /// Every file written, to sync before the commit (the knot last).
    pub(crate) files: Vec<(File, PathBuf)>,
}

/// The package being written.
pub(crate) struct Run<'a> {
    opts: &'a PackOptions,
    progress: &'a dyn Progress,
    knot_tmp: PathBuf,
    writer: KnotWriter<BufWriter<File>>,
    roles: Vec<RoleOut>,
    hashers: Vec<Sha256>,
    writeback: Writeback,
    /// The payloads of the spectral blocks, by name (computed before the
    /// knot was laid out; written when the pass reaches their tensor).
    pub(crate) spectral: std::collections::HashMap<String, Vec<u8>>,
}

/// A cast's summary for the report.
fn summary(tensor: &str, from: DType, to: DType, r: &CastReport) -> CastSummary {
    CastSummary {
        tensor: tensor.to_owned(),
        from: from.to_string(),
        to: to.to_string(),
        max_abs_error: r.max_abs_error,
        overflowed: r.first_overflow.is_some(),
    }
}

/// Refuses a cast that made a finite value infinite, unless `--allow-lossy`.
fn check_overflow(
    allow_lossy: bool,
    t: &SourceTensor,
    r: &CastReport,
    values: &[u8],
    (from, to): (DType, DType),
    first_row: u64,
) -> Result<()> {
    match r.first_overflow {
        Some(idx) if !allow_lossy => Err(overflow_error(
            &t.name, values, from, to, first_row, t.shape[1], idx,
        )),
        _ => Ok(()),
    }
}

/// The row files of each role block, created in `out` (the block's own
/// dtype first, as `plan` puts it).
fn role_outs(header: &Header, embed: &str, out: &mut Output) -> Result<Vec<RoleOut>> {
    let mut roles = Vec::new();
    for (i, b) in header.blocks.iter().enumerate() {
        if b.columnar.is_empty() {
            continue;
        }
        let mut files = Vec::new();
        for d in &b.columnar {
            let (path, w) = out.create(&d.object)?;
            files.push(RowSink {
                dtype: d.dtype,
                path,
                w,
                hasher: (d.dtype != b.dtype).then(Sha256::new),
                leaves: Vec::with_capacity(usize::try_from(d.rows).unwrap_or(0)),
                source_exact: true,
                block_exact: true,
                vs_source: 0.0,
                cast: CastReport::default(),
            });
        }
        debug_assert_eq!(files.first().map(|f| f.dtype), Some(b.dtype));
        roles.push(RoleOut {
            block: i,
            role: if b.name == embed {
                Role::TokenEmbd
            } else {
                Role::LmHead
            },
            files,
            casts: Vec::new(),
        });
    }
    Ok(roles)
}

impl<'a> Run<'a> {
    /// Creates the knot and the row files in `out` and reads the source
    /// files' safetensors headers into their hashers.
    pub(crate) fn start(
        opts: &'a PackOptions,
        progress: &'a dyn Progress,
        out: &mut Output,
        header: Header,
        embed: &str,
        src: &SourceModel,
    ) -> Result<Run<'a>> {
        let (knot_tmp, knot_file) = out.create(KNOT_NAME)?;
        let writeback = Writeback::start(knot_file.get_ref().try_clone().at(&knot_tmp)?);
        let writer = KnotWriter::new(knot_file, header).map_err(|e| format_err(&knot_tmp, e))?;
        let roles = role_outs(writer.header(), embed, out)?;
        let mut hashers = Vec::with_capacity(src.files.len());
        for i in 0..src.files.len() {
            let mut h = Sha256::new();
            h.update(src.read_header(i)?);
            hashers.push(h);
        }
        Ok(Run {
            opts,
            progress,
            knot_tmp,
            writer,
            roles,
            hashers,
            writeback,
            spectral: std::collections::HashMap::new(),
        })
    }

    fn fmt_err(&self, e: gkq_format::Error) -> PackError {
        format_err(&self.knot_tmp, e)
    }

    /// Reads every source tensor once and writes it where it goes.
    pub(crate) fn tensors(&mut self, src: &SourceModel) -> Result<()> {
        let header = self.writer.header();
        // the block each tensor fills (none for a tied lm_head's alias),
        // and the role (row files) it feeds
        let targets: Vec<(Option<usize>, Option<usize>)> = src
            .tensors
            .iter()
            .map(|t| {
                let index = header
                    .block_index(&t.name)
                    .filter(|&i| header.blocks[i].encoding.payload().is_some());
                let role = self.roles.iter().position(|r| Some(r.block) == index);
                (index, role)
            })
            .collect();
        let read_plan: Vec<(usize, u64, usize)> = src
            .tensors
            .iter()
            .zip(&targets)
            .enumerate()
            .flat_map(|(ti, (t, (_, role)))| {
                prefetch::plan(t, role.is_some(), CHUNK)
                    .into_iter()
                    .map(move |(at, n)| (ti, at, n))
            })
            .collect();
        self.progress.start(src.total_bytes());
        prefetch::with_prefetch(src, &read_plan, |pf| {
            for (t, &(index, role)) in src.tensors.iter().zip(&targets) {
                match (index, role) {
                    (Some(index), Some(role)) => self.role_tensor(pf, t, index, role)?,
                    (index, _) => self.plain_tensor(pf, t, index)?,
                }
            }
            Ok(())
        })
    }

    /// A plain block, a spectral block (its payload computed before: the
    /// tensor is read only for its source file's digest), or a tied lm_head
    /// identical to the embedding (an alias: read only for the digest).
    fn plain_tensor(
        &mut self,
        pf: &mut prefetch::Prefetch,
        t: &SourceTensor,
        index: Option<usize>,
    ) -> Result<()> {
        let factors = index.and(self.spectral.remove(&t.name));
        let copy = if factors.is_some() { None } else { index };
        for (_, n) in prefetch::plan(t, false, CHUNK) {
            let buf = pf.next()?;
            let hasher = &mut self.hashers[t.file];
            match copy {
                Some(i) => {
                    let (w, ()) =
                        rayon::join(|| self.writer.write_chunk(i, &buf), || hasher.update(&buf));
                    w.map_err(|e| format_err(&self.knot_tmp, e))?;
                }
                None => hasher.update(&buf),
            }
            self.progress.advance(n as u64);
            self.writeback.advance(n as u64, None);
            pf.recycle(buf);
        }
        if let (Some(i), Some(f)) = (index, &factors) {
            self.writer.write_chunk(i, f).map_err(|e| self.fmt_err(e))?;
        }
        if let Some(i) = index {
            self.writer.end_payload(i).map_err(|e| self.fmt_err(e))?;
        }
        Ok(())
    }

    /// The embedding or lm_head: the block in its dtype, and every row file.
    fn role_tensor(
        &mut self,
        pf: &mut prefetch::Prefetch,
        t: &SourceTensor,
        index: usize,
        role: usize,
    ) -> Result<()> {
        let block_dtype = self.writer.header().blocks[index].dtype;
        let row_bytes = (t.shape[1] * t.dtype.itemsize()) as usize;
        let mut block_report = CastReport::default();
        for (at, len) in prefetch::plan(t, true, CHUNK) {
            let buf = pf.next()?;
            let first_row = at / row_bytes as u64;
            block_report.merge(self.role_chunk(t, index, role, first_row, &buf)?, 0);
            self.progress.advance(len as u64);
            let also = self.roles[role].files.first().map(|f| f.w.get_ref());
            self.writeback.advance(len as u64, also);
            pf.recycle(buf);
        }
        self.writer
            .end_payload(index)
            .map_err(|e| self.fmt_err(e))?;
        let r = &mut self.roles[role];
        if t.dtype != block_dtype {
            r.casts
                .push(summary(&t.name, t.dtype, block_dtype, &block_report));
        }
        let casts: Vec<CastSummary> = r.files[1..]
            .iter()
            .map(|f| summary(&t.name, block_dtype, f.dtype, &f.cast))
            .collect();
        r.casts.extend(casts);
        Ok(())
    }

    /// One chunk of whole rows of a role tensor: cast to the block dtype,
    /// written to the knot and to the row file of that dtype at once, then
    /// cast to each other row file's dtype. Returns the block cast's report.
    fn role_chunk(
        &mut self,
        t: &SourceTensor,
        index: usize,
        role: usize,
        first_row: u64,
        chunk: &[u8],
    ) -> Result<CastReport> {
        let block_dtype = self.writer.header().blocks[index].dtype;
        let cols = t.shape[1] as usize;
        let hasher = &mut self.hashers[t.file];
        let ((block_bytes, r), ()) = rayon::join(
            || {
                cast_rows(
                    chunk,
                    t.dtype,
                    block_dtype,
                    cols * t.dtype.itemsize() as usize,
                )
            },
            || hasher.update(chunk),
        );
        let lossy = self.opts.allow_lossy;
        check_overflow(lossy, t, &r, chunk, (t.dtype, block_dtype), first_row)?;
        let src = (chunk, t.dtype);
        let blk = (&block_bytes[..], block_dtype);
        let (first, rest) = self.roles[role]
            .files
            .split_first_mut()
            .expect("the block dtype's row file");
        let writer = &mut self.writer;
        let (k, w) = rayon::join(
            || writer.write_chunk(index, &block_bytes),
            || first.push(&block_bytes, src, blk, cols),
        );
        k.map_err(|e| format_err(&self.knot_tmp, e))?;
        w?;
        let out_row_bytes = cols * block_dtype.itemsize() as usize;
        for f in rest {
            let (bytes, fr) = cast_rows(&block_bytes, block_dtype, f.dtype, out_row_bytes);
            check_overflow(
                lossy,
                t,
                &fr,
                &block_bytes,
                (block_dtype, f.dtype),
                first_row,
            )?;
            f.cast.merge(fr, 0);
            f.push(&bytes, src, blk, cols)?;
        }
        Ok(r)
    }

    /// Records the source digests, closes every row file (proof objects,
    /// flags, roots) and writes the knot's header.
    pub(crate) fn finish(mut self, out: &mut Output) -> Result<Finished> {
        let source_sha: Vec<String> = std::mem::take(&mut self.hashers)
            .into_iter()
            .map(|h| gkq_format::hex(&h.finalize()))
            .collect();
        if let Some(Value::StrList(list)) = self
            .writer
            .metadata_mut()
            .get_mut(gkq_format::keys::SOURCE_SHA256)
        {
            *list = source_sha;
        }
        let mut columnar = Vec::new();
        let mut casts = Vec::new();
        let mut files = Vec::new();
        let out_dir = self.opts.out_dir.clone();
        for r in std::mem::take(&mut self.roles) {
            let block_name = self.writer.header().blocks[r.block].name.clone();
            for f in r.files {
                let (report, synced) =
                    finish_row_file(out, &mut self.writer, r.block, f, &self.knot_tmp)?;
                files.extend(synced);
                columnar.push(ColumnarReport {
                    tensor: block_name.clone(),
                    role: r.role.as_str().to_owned(),
                    path: out_dir.join(&report.path),
                    proof: FileReport {
                        path: out_dir.join(&report.proof.path),
                        ..report.proof
                    },
                    runs: report.runs.map(|r| FileReport {
                        path: out_dir.join(&r.path),
                        ..r
                    }),
                    ..report
                });
            }
            casts.extend(r.casts);
        }
        let tensors = self.writer.header().blocks.len();
        let Run {
            writer,
            knot_tmp,
            writeback,
            ..
        } = self;
        let (knot_writer, written) = writer.finish().map_err(|e| format_err(&knot_tmp, e))?;
        writeback.stop();
        files.push((flush_file(knot_writer, &knot_tmp)?, knot_tmp.clone()));
        Ok(Finished {
            knot_id: gkq_format::hex(&written.preamble().header_sha256),
            knot_path: knot_tmp,
            tensors,
            columnar,
            casts,
            files,
        })
    }
}
