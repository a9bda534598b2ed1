//! An async node in a tokio service: the package is opened once, the
//! reader is shared across tasks (a clone is an `Arc`), concurrent lookups
//! are served while the lm_head is pulled in the background, and each
//! answer is a verified row.
//!
//! ```sh
//! cargo run -p gkq-reader --example tokio_node -- https://HOST/PREFIX/model.knot
//! ```
//!
//! It prints one line per session and a summary; the tests run it against
//! nginx and compare its rows with the blocking reader's.

use gkq_reader::{AsyncReader, ReaderConfig, Serve};

/// Eight sessions of prompt ids, as a tokenizer would give them.
fn sessions(vocab: u64) -> Vec<Vec<u32>> {
    (0..8u64)
        .map(|s| {
            (0..6u64)
                .map(|i| u32::try_from((s * 7919 + i * 104_729) % vocab).unwrap_or(0))
                .collect()
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let knot = std::env::args()
        .nth(1)
        .ok_or("usage: tokio_node KNOT_URL")?;
    let base = knot
        .rsplit_once('/')
        .map_or(knot.as_str(), |(b, _)| b)
        .to_owned();
    let config = ReaderConfig {
        columnar_embed: Some(format!("{base}/")),
        require_columnar: true,
        ..ReaderConfig::default()
    };
    // open once; the reader is shared by every task below
    let reader = AsyncReader::open(&knot, config, Serve::ALL).await?;
    reader.lm_head()?.start_background();

    let vocab = reader.embedding()?.vocab();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, ids) in sessions(vocab).into_iter().enumerate() {
        let r = reader.clone();
        tasks.spawn(async move {
            let rows = r.embedding()?.rows(&ids).await?;
            let sum: f64 = rows.to_f32()?.iter().map(|&v| f64::from(v)).sum();
            Ok::<_, gkq_reader::ReaderError>((n, ids, sum))
        });
    }
    let mut lines = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (n, ids, sum) = done??;
        lines.push(format!("session {n}: ids {ids:?} sum {sum:.6}"));
    }
    lines.sort();
    for l in lines {
        println!("{l}");
    }
    let lm = reader.lm_head()?;
    let m = lm.matrix().await?; // the background pull, awaited
    println!(
        "lm_head resident: {} x {} {}, {} bytes",
        m.rows(),
        m.cols(),
        m.dtype(),
        m.bytes().len()
    );
    let stats = reader.embedding()?.cache_stats();
    println!(
        "rows fetched {}, requests {}",
        stats.rows_fetched,
        reader.net_stats().requests
    );
    Ok(())
}
