//! The pack report and the `--analyze` table as the lines gkq-pack
//! prints (the library prints nothing; the binary decides where).

use std::fmt::Write as _;

use crate::{AnalyzeReport, ColumnarReport, PackReport};

/// A row file's lines: the rows, the proof object, the runs object.
fn row_file(s: &mut String, c: &ColumnarReport) {
    let exact = match (c.source_exact, c.block_exact) {
        (true, true) => "exact (source and block)",
        (true, false) => "exact (source)",
        (false, true) => "exact (block)",
        (false, false) => "not exact",
    };
    // FORMAT.md 7e: the records inline, the file a runs object's layout
    let inline = match c.bytes.checked_div(c.rows) {
        Some(stride) if stride > c.row_bytes => {
            format!(", each followed by its record ({stride} B strides)")
        }
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "  {}  {} rows x {} bytes{inline} ({} {})  sha256 {}  max abs error vs source {:e}, {exact}",
        c.path.display(),
        c.rows,
        c.row_bytes,
        c.role,
        c.dtype,
        c.sha256,
        c.max_abs_error_vs_source
    );
    let _ = writeln!(
        s,
        "  {}  {} bytes  merkle root {}  proof height {} ({} B per row fetched)",
        c.proof.path.display(),
        c.proof.bytes,
        c.merkle_root,
        c.proof_height,
        32 * u32::from(c.proof_height)
    );
    if let Some(runs) = &c.runs {
        let _ = writeln!(
            s,
            "  {}  {} bytes  each row with its record ({} B strides: one range per run of rows)",
            runs.path.display(),
            runs.bytes,
            c.row_bytes + 32 * u64::from(c.proof_height)
        );
    }
    if let Some(warm) = &c.warm {
        let _ = writeln!(
            s,
            "  {}  {} bytes  the chunk table and the warm rows with their records (one range warms a node)",
            warm.path.display(),
            warm.bytes,
        );
    }
}

/// The report as the lines gkq-pack prints on stderr.
pub fn text(r: &PackReport) -> String {
    let mut s = String::new();
    let s = &mut s;
    let _ = writeln!(
        s,
        "packed {} tensors ({} source bytes) in {:.2}s, {}",
        r.tensors,
        r.source_bytes,
        r.seconds,
        match (&r.lm_head, r.tied) {
            (None, _) => "no lm_head (the architecture has no output projection)".to_owned(),
            (Some(_), true) => "lm_head tied to the embedding".to_owned(),
            (Some(name), false) => format!("lm_head {name} untied"),
        }
    );
    if let Some(id) = &r.model_id {
        let _ = writeln!(
            s,
            "  source {id}{}",
            r.revision
                .as_ref()
                .map_or_else(String::new, |rev| format!(" @ {rev}"))
        );
    }
    let _ = writeln!(s, "  {}  {} bytes", r.knot.path.display(), r.knot.bytes);
    let _ = writeln!(s, "  knot id {} (pin it with --knot-id)", r.knot_id);
    if r.stale_signature {
        let _ = writeln!(
            s,
            "  removed the replaced package's model.sig, which signed another knot: re-sign with gkq-sign"
        );
    }
    if let Some(w) = &r.warm {
        let from = match w.from.as_str() {
            "corpus" => format!("the ids most of the corpus's {} sessions use", w.sessions),
            _ => "--warm-ids".to_owned(),
        };
        let _ = writeln!(s, "  warm set of {} rows: {from}", w.rows);
    }
    for c in &r.columnar {
        row_file(s, c);
    }
    for c in &r.companions {
        let _ = writeln!(
            s,
            "  {}  {} bytes  sha256 {}",
            c.path.display(),
            c.bytes,
            c.sha256
        );
    }
    tensors(s, r);
    let package = r.package_bytes();
    let _ = writeln!(
        s,
        "package {package} bytes from {} source bytes ({:.2}x)",
        r.source_bytes,
        package as f64 / r.source_bytes.max(1) as f64
    );
    std::mem::take(s)
}

/// The lines of the tensors that changed type: quantized, fallen back,
/// spectral, cast.
fn tensors(s: &mut String, r: &PackReport) {
    for q in &r.quantized {
        let _ = writeln!(
            s,
            "  {} {}  {} bytes  rmse {:.3e}  max abs error {:.3e} (vs source)",
            q.dtype, q.tensor, q.bytes, q.rmse, q.max_abs_error
        );
    }
    for f in &r.fallbacks {
        let _ = writeln!(
            s,
            "  fell back: {} in {}, not {}: {}",
            f.tensor, f.stored, f.asked, f.reason
        );
    }
    for sp in &r.spectral {
        let _ = writeln!(
            s,
            "  spectral {}  {}x{} rank {}  {} factors{}  {} bytes ({:.1} % of dense)  rel. Frobenius error {:.3e}  energy kept {:.6}",
            sp.tensor,
            sp.shape[0],
            sp.shape[1],
            sp.rank,
            sp.factor_dtype,
            if sp.quant == 1 { " (quant 1)" } else { "" },
            sp.bytes,
            100.0 * sp.bytes as f64 / sp.dense_bytes as f64,
            sp.rel_frobenius_error,
            sp.energy_kept
        );
    }
    for c in &r.casts {
        let _ = writeln!(
            s,
            "  cast {} {} -> {}: max abs error {:e}",
            c.tensor, c.from, c.to, c.max_abs_error
        );
    }
}

/// The --analyze table: one line per tensor.
pub fn analysis_text(r: &AnalyzeReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}", r.method);
    let _ = writeln!(
        s,
        "tensor\tshape\tdtype\trank@99%\trank@99.9%\trank@99.99%\terr@32\terr@64\terr@128\terr@256\tdense B\tq0-16bit B @32/64/128/256\tq1 B @32/64/128/256"
    );
    for t in &r.tensors {
        let e: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| format!("{:.2e}", a.rel_frobenius_error))
            .collect();
        let q0: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| a.bytes_quant0_16bit.to_string())
            .collect();
        let q1: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| a.bytes_quant1.to_string())
            .collect();
        let _ = writeln!(
            s,
            "{}{}\t{}x{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            t.tensor,
            t.role.as_ref().map_or(String::new(), |r| format!(" ({r})")),
            t.shape[0],
            t.shape[1],
            t.dtype,
            t.rank_for_energy[0],
            t.rank_for_energy[1],
            t.rank_for_energy[2],
            e.join("\t"),
            t.dense_bytes,
            q0.join("/"),
            q1.join("/"),
        );
    }
    s
}
