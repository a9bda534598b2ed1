//! The report as Markdown: the proposal's tables, which a publisher pastes.

use std::fmt::Write as _;

use super::Report;
use super::amortise::WarmFrom;

fn kb(b: u64) -> String {
    format!("{:.2} KB", b as f64 / 1000.0)
}

/// The report as Markdown.
pub fn markdown(r: &Report) -> String {
    let mut out = String::new();
    let files: Vec<String> = r
        .files
        .iter()
        .map(|f| {
            format!(
                "{} ({} B/row, {} MB)",
                f.dtype,
                f.row_bytes,
                f.file_len / 1_000_000
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "Knot {}, token embedding {} rows; row files: {}.\n",
        r.knot_id,
        r.vocab,
        files.join(", ")
    );
    workloads(&mut out, r);
    amortised(&mut out, r);
    out
}

fn workloads(out: &mut String, r: &Report) {
    let heads: Vec<String> = r
        .files
        .iter()
        .map(|f| {
            format!(
                "{}: bytes per cold session, computed (saved vs dense)",
                f.dtype
            )
        })
        .collect();
    let on = r
        .workloads
        .iter()
        .find_map(|w| w.measured_object.as_deref())
        .and_then(|o| r.files.iter().find(|f| f.object == o))
        .map_or(String::new(), |f| format!(", on the {} row file", f.dtype));
    let _ = writeln!(
        out,
        "| workload | sessions | tokens per session | distinct ids per session | {} | measured per cold session{on} (requests, round trips, bytes) |",
        heads.join(" | ")
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|{}---|",
        "---:|".repeat(heads.len())
    );
    for w in &r.workloads {
        let cells: Vec<String> = w
            .cost
            .iter()
            .map(|c| format!("{} ({:.3} %)", kb(c.total), c.saved_pct))
            .collect();
        let m = w.measured.map_or("-".to_owned(), |m| {
            format!("{}, {}, {}", m.requests, m.round_trips, kb(m.bytes))
        });
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {} | {m} |",
            w.name,
            w.sessions,
            w.tokens,
            w.distinct,
            cells.join(" | ")
        );
    }
}

fn amortised(out: &mut String, r: &Report) {
    let a = &r.amortised;
    let from = match a.warm_from {
        WarmFrom::Package => "the package's warm object",
        WarmFrom::Texts => {
            "the texts' top ids (the package has no warm object: the warm-up fetches them as runs of rows)"
        }
    };
    let _ = writeln!(
        out,
        "\n{} sessions drawn from the mix on one node, {} distinct ids; warm set of {} rows: {from}.\n",
        a.sessions, a.distinct, a.warm
    );
    let _ = writeln!(
        out,
        "| row file | warm-up bytes, once per node (requests) | cold tail bytes over the {} sessions (requests, round trips) | total bytes | saved vs dense per session |",
        a.sessions
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for c in &a.cost {
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {} ({}, {}) | {} | {:.6} % |",
            c.dtype,
            kb(c.warm_bytes),
            c.warm_requests,
            kb(c.cold_bytes),
            c.cold_requests,
            c.cold_round_trips,
            kb(c.total_bytes),
            c.saved_pct
        );
    }
    if let Some(m) = &a.measured {
        let _ = writeln!(
            out,
            "\nMeasured on a fresh node reading {}: warm-up {} requests in {} round trips, {}; the sessions {} requests in {} round trips, {}; total {}.",
            m.object,
            m.warm.requests,
            m.warm.round_trips,
            kb(m.warm.bytes),
            m.cold.requests,
            m.cold.round_trips,
            kb(m.cold.bytes),
            kb(m.warm.bytes + m.cold.bytes)
        );
    }
}
