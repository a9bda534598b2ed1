//! The one pass of [`crate::pack`] over the source: every tensor read once,
//! in chunks, by the prefetcher; role tensors cast to the block dtype and
//! to each row file's dtype, checked for exactness and hashed into Merkle
//! leaves; every byte fed to its source file's hasher on the way; disk
//! writeback started in the background as the files grow.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use gkq_format::{CastReport, DType, Header, KNOT_NAME, KnotWriter, Role, Value};
use gkq_source::{SourceModel, SourceTensor};
use sha2::{Digest, Sha256};

use crate::Progress;
use crate::error::{BadValue, IoContext, PackError, Result, format_err};
use crate::options::PackOptions;
use crate::output::{Output, flush_file};
use crate::prefetch;
use crate::quantize::{Measure, convert_rows, figure};
use crate::report::QuantReport;
use crate::report::{CastSummary, ColumnarReport, FileReport};
use crate::rows::{Inline, Origin, RoleOut, RowSink, cast_rows, finish_row_file, row_len};
use crate::writeback::Writeback;

/// Bytes of source read per step.
const CHUNK: usize = 8 << 20;

/// What the pass produced, before the final sync and commit.
pub(crate) struct Finished {
    pub(crate) knot_id: String,
    pub(crate) knot_path: PathBuf,
    pub(crate) tensors: usize,
    pub(crate) columnar: Vec<ColumnarReport>,
    pub(crate) casts: Vec<CastSummary>,
    /// The blocks stored in another type, with their figures.
    pub(crate) quantized: Vec<QuantReport>,
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
    /// What converting each block to its stored type measured, by block.
    figures: std::collections::BTreeMap<usize, (DType, Measure)>,
}

/// Whether tensor `t`'s block `index` is a dense block stored in another
/// type than the tensor's (converted row by row).
fn converts(header: &Header, index: Option<usize>, t: &SourceTensor) -> bool {
    index.is_some_and(|i| {
        let b = &header.blocks[i];
        b.dtype != t.dtype && matches!(b.encoding, gkq_format::Encoding::Dense(_))
    })
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
        Some(idx) if !allow_lossy => Err(PackError::CastOverflow(BadValue::at(
            &t.name,
            (values, from),
            (first_row, t.shape[1]),
            idx as u64,
            to,
        ))),
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
            let inline = d.inline_proof().then(|| Inline {
                height: d.proof.map_or(0, |p| p.height),
                pending: Vec::new(),
                roots: Vec::new(),
            });
            files.push(RowSink {
                dtype: d.dtype,
                path,
                w,
                hasher: (d.dtype != b.dtype || inline.is_some()).then(Sha256::new),
                leaves: Vec::with_capacity(usize::try_from(d.rows).unwrap_or(0)),
                inline,
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
            figures: std::collections::BTreeMap::new(),
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
        let read_plan: Vec<Vec<(u64, usize)>> = src
            .tensors
            .iter()
            .zip(&targets)
            .map(|(t, (index, role))| {
                let rows = role.is_some() || converts(header, *index, t);
                prefetch::plan(t, rows, CHUNK)
            })
            .collect();
        self.progress.start(src.total_bytes());
        let mut hashers = std::mem::take(&mut self.hashers);
        let done = prefetch::with_prefetch(src, &read_plan, &mut hashers, |pf| {
            for (t, &(index, role)) in src.tensors.iter().zip(&targets) {
                match (index, role) {
                    (Some(index), Some(role)) => self.role_tensor(pf, t, index, role)?,
                    (index, _) => self.plain_tensor(pf, t, index)?,
                }
                self.progress.advance(t.pad);
            }
            Ok(())
        });
        self.hashers = hashers;
        done
    }

    /// A plain block, a spectral block (its payload computed before: the
    /// tensor is read only for its source file's digest), or a tied lm_head
    /// identical to the embedding (an alias: read only for the digest). A
    /// block stored in another type is converted row by row.
    fn plain_tensor(
        &mut self,
        pf: &mut prefetch::Prefetch,
        t: &SourceTensor,
        index: Option<usize>,
    ) -> Result<()> {
        let factors = index.and(self.spectral.remove(&t.name));
        let copy = if factors.is_some() { None } else { index };
        let to = converts(self.writer.header(), copy, t).then(|| self.dtype_of(copy));
        for (at, n) in prefetch::plan(t, to.is_some(), CHUNK) {
            let buf = pf.next()?;
            match (copy, to) {
                (Some(i), Some(to)) => {
                    let (bytes, m) = convert_rows(&buf, t.dtype, to, t.shape[1] as usize);
                    self.measured(t, i, to, m, &buf, at)?;
                    self.writer
                        .write_chunk(i, &bytes)
                        .map_err(|e| self.fmt_err(e))?;
                }
                (Some(i), None) => self
                    .writer
                    .write_chunk(i, &buf)
                    .map_err(|e| self.fmt_err(e))?,
                // read for the source file's digest alone (the reader hashes)
                (None, _) => {}
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

    fn dtype_of(&self, index: Option<usize>) -> DType {
        index.map_or(DType::F32, |i| self.writer.header().blocks[i].dtype)
    }

    /// Records what converting rows of `t` (from byte `at`, `chunk` the
    /// source bytes) to `to` for block `index` measured, and refuses a
    /// NaN or infinity being quantized (unless `--allow-nonfinite`) and a
    /// finite value that did not stay finite (unless `--allow-lossy`).
    fn measured(
        &mut self,
        t: &SourceTensor,
        index: usize,
        to: DType,
        m: Measure,
        chunk: &[u8],
        at: u64,
    ) -> Result<()> {
        let cols = t.shape[1];
        let first_row = at / (cols * t.dtype.itemsize()).max(1);
        let bad = |idx: u64| BadValue::at(&t.name, (chunk, t.dtype), (first_row, cols), idx, to);
        let allow = self.opts.quant.allow_nonfinite;
        if let (Some(idx), true, false) = (m.first_nonfinite, to.is_quantized(), allow) {
            return Err(PackError::NonFinite(bad(idx)));
        }
        // a value's block holding NaN or an infinity is not finite either:
        // accepted with the non-finite value
        let accepted = self.opts.allow_lossy || (allow && m.first_nonfinite.is_some());
        if let (Some(idx), false) = (m.first_overflow, accepted) {
            return Err(PackError::CastOverflow(bad(idx)));
        }
        let entry = self
            .figures
            .entry(index)
            .or_insert((to, Measure::default()));
        entry.1.merge(m, 0);
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
        let mut block_report = CastReport::default();
        for (at, len) in prefetch::plan(t, true, CHUNK) {
            let buf = pf.next()?;
            block_report.merge(self.role_chunk(t, (index, role), at, &buf)?, 0);
            self.progress.advance(len as u64);
            let also = self.roles[role].files.first().map(|f| f.w.get_ref());
            self.writeback.advance(len as u64, also);
            pf.recycle(buf);
        }
        self.writer
            .end_payload(index)
            .map_err(|e| self.fmt_err(e))?;
        let r = &mut self.roles[role];
        if t.dtype != block_dtype && !block_dtype.is_quantized() {
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

    /// One chunk of whole rows of a role tensor (from byte `at`): converted
    /// to the block's type, written to the knot and to the row file of that
    /// type at once, then converted to each other row file's type. Returns
    /// the block cast's report (empty for a block type: its figures are
    /// measured instead).
    fn role_chunk(
        &mut self,
        t: &SourceTensor,
        (index, role): (usize, usize),
        at: u64,
        chunk: &[u8],
    ) -> Result<CastReport> {
        let block_dtype = self.writer.header().blocks[index].dtype;
        let cols = t.shape[1] as usize;
        let first_row = at / row_len(t.dtype, cols) as u64;
        let (block_bytes, r) = if block_dtype.is_quantized() && t.dtype != block_dtype {
            let (b, m) = convert_rows(chunk, t.dtype, block_dtype, cols);
            (b, Err(m))
        } else {
            let (b, r) = cast_rows(chunk, t.dtype, block_dtype, cols);
            (b, Ok(r))
        };
        let lossy = self.opts.allow_lossy;
        let (r, measured) = match r {
            Ok(r) => {
                check_overflow(lossy, t, &r, chunk, (t.dtype, block_dtype), first_row)?;
                (r, None)
            }
            Err(m) => {
                self.measured(t, index, block_dtype, m, chunk, at)?;
                (CastReport::default(), Some(m.max_abs))
            }
        };
        let src = (chunk, t.dtype);
        let blk = (&block_bytes[..], block_dtype);
        let (first, rest) = self.roles[role]
            .files
            .split_first_mut()
            .expect("the block dtype's row file");
        let writer = &mut self.writer;
        let (k, w) = rayon::join(
            || writer.write_chunk(index, &block_bytes),
            || first.push(&block_bytes, src, Origin::Own(measured), cols),
        );
        k.map_err(|e| format_err(&self.knot_tmp, e))?;
        w?;
        other_rows(self.opts, rest, t, (src, blk), (first_row, cols))?;
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
                let placed = |r: FileReport| FileReport {
                    path: out_dir.join(&r.path),
                    ..r
                };
                columnar.push(ColumnarReport {
                    tensor: block_name.clone(),
                    role: r.role.as_str().to_owned(),
                    path: out_dir.join(&report.path),
                    proof: placed(report.proof),
                    runs: report.runs.map(placed),
                    warm: report.warm.map(placed),
                    ..report
                });
            }
            casts.extend(r.casts);
        }
        let quantized = self.record_figures();
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
            quantized,
            files,
        })
    }

    /// Writes the measured figures into `quant.rmse` and
    /// `quant.max_abs_error` (in the order of `quant.blocks`), and returns
    /// every converted block's report.
    fn record_figures(&mut self) -> Vec<QuantReport> {
        let header = self.writer.header();
        let reports: Vec<QuantReport> = self
            .figures
            .iter()
            .map(|(&i, (to, m))| {
                let b = &header.blocks[i];
                QuantReport {
                    tensor: b.name.clone(),
                    dtype: to.to_string(),
                    bytes: b.encoding.payload().map_or(0, |p| p.len),
                    rmse: m.rmse(),
                    max_abs_error: m.max_abs,
                }
            })
            .collect();
        let names = header
            .meta_list(gkq_format::keys::QUANT_BLOCKS)
            .unwrap_or_default()
            .to_vec();
        let of = |name: &String| reports.iter().find(|r| r.tensor == *name);
        let rmse: Vec<String> = names
            .iter()
            .map(|n| figure(of(n).map_or(0.0, |r| r.rmse)))
            .collect();
        let max: Vec<String> = names
            .iter()
            .map(|n| figure(of(n).map_or(0.0, |r| r.max_abs_error)))
            .collect();
        let md = self.writer.metadata_mut();
        if !names.is_empty() {
            md.insert(gkq_format::keys::QUANT_RMSE.into(), Value::StrList(rmse));
            md.insert(
                gkq_format::keys::QUANT_MAX_ABS_ERROR.into(),
                Value::StrList(max),
            );
        }
        reports
    }
}

/// Bytes of whole rows, and their dtype.
type Rows<'a> = (&'a [u8], DType);

/// The rows of a chunk in each row file after the first: the block's rows
/// (`blk`) cast to a float dtype or quantized to a block type, checked as
/// the block cast is (overflow, and NaN or infinity being quantized).
fn other_rows(
    opts: &PackOptions,
    rest: &mut [RowSink],
    t: &SourceTensor,
    (src, blk): (Rows<'_>, Rows<'_>),
    (first_row, cols): (u64, usize),
) -> Result<()> {
    let (block_bytes, block_dtype) = blk;
    for f in rest {
        let (bytes, fr) = if f.dtype.is_quantized() {
            let (bytes, m) = convert_rows(block_bytes, block_dtype, f.dtype, cols);
            if let (Some(i), false) = (m.first_nonfinite, opts.quant.allow_nonfinite) {
                let at = (first_row, cols as u64);
                let bad = BadValue::at(&t.name, blk, at, i, f.dtype);
                return Err(PackError::NonFinite(bad));
            }
            let report = CastReport {
                max_abs_error: m.max_abs,
                first_overflow: m.first_overflow.map(|i| i as usize),
            };
            (bytes, report)
        } else {
            cast_rows(block_bytes, block_dtype, f.dtype, cols)
        };
        let pair = (block_dtype, f.dtype);
        check_overflow(opts.allow_lossy, t, &fr, block_bytes, pair, first_row)?;
        f.cast.merge(fr, 0);
        f.push(&bytes, src, Origin::Block(blk), cols)?;
    }
    Ok(())
}
