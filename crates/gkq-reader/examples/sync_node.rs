//! A sync node: open a published package by URL, look up the rows of a
//! prompt, and make the lm_head resident. Run it against any package:
//!
//! ```sh
//! cargo run -p gkq-reader --example sync_node -- https://HOST/PREFIX/model.knot 17,42,900
//! ```
//!
//! (`--ca-cert`-style trust for a private CA: set `SSL_CERT_FILE`.)

use gkq_reader::{Reader, ReaderConfig, Serve};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let knot = args.next().ok_or("usage: sync_node KNOT_URL [IDS]")?;
    let ids: Vec<u32> = args
        .next()
        .unwrap_or_else(|| "0,1,2".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    // the package's base URL: the row files sit next to the knot
    let base = knot.rsplit_once('/').map_or(knot.as_str(), |(b, _)| b);
    let config = ReaderConfig {
        columnar_embed: Some(format!("{base}/")),
        require_columnar: true,
        ..ReaderConfig::default()
    };
    let reader = Reader::open(&knot, config, Serve::ALL)?;
    let lm = reader.lm_head()?;
    lm.start_background(); // pulled while the rows are looked up

    let emb = reader.embedding()?;
    let rows = emb.rows(&ids)?;
    let values = rows.to_f32()?;
    for (id, row) in ids.iter().zip(values.chunks(rows.cols())) {
        let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
        println!("row {id}: {} values, sum {sum:.6}", row.len());
    }
    let m = lm.matrix()?;
    println!(
        "lm_head resident: {} x {} {} ({} bytes); {}",
        m.rows(),
        m.cols(),
        m.dtype(),
        m.bytes().len(),
        lm.resolution().reason()
    );
    println!("requests {}", reader.net_stats().requests);
    Ok(())
}
