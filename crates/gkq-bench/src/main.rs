//! Benchmarks. Each prints its figures next to a reference measured in the
//! same run on the same files (`cp -r`, `sha256sum`), because these machines
//! are noisy; the ratio is the number to compare with the targets.
//!
//! `cargo xtask bench WHICH` runs this binary (release); each bench builds
//! the release binaries it times first.

mod big;
mod coldstart;
mod common;
mod decode;
mod fleet;
mod llama_cold;
mod llama_cpp;
mod lm_quality;
mod pack;
mod quant;
mod quantize;
mod qwen;
mod reader;
mod report;
mod size;
mod spectral;
mod stress;
mod verify;
mod wire;

use clap::{Parser, Subcommand};

/// `cargo xtask bench`: the benchmarks (release builds, same-run
/// reference timings).
#[derive(Parser)]
#[command(name = "cargo xtask bench")]
struct Cli {
    #[command(subcommand)]
    which: Which,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 3, global = true)]
    reps: usize,
}

/// The benchmarks, one per `cargo xtask bench` subcommand.
#[derive(Subcommand, Clone, Copy)]
enum Which {
    /// Pack the qwen2.5-0.5b preset (bf16, f32, both) against `cp -r` and the Python reference converter.
    Pack,
    /// The GGUF row of `pack` alone: the preset as a q4_0 GGUF (gguf-py) packed as it is, against `cp` of the GGUF and `cp -r` of the output.
    PackGguf,
    /// Pack and verify a Llama-3-70B-shaped embedding and untied lm_head (128256 x 8192, bf16, 4.2 GB): peak RSS and the same ratios.
    Big,
    /// Verify the packed qwen2.5-0.5b preset with --source against `sha256sum`.
    Verify,
    /// Replay token sessions through gkq-rows against nginx (and a 20 ms proxy), then `wire`.
    Reader,
    /// Cold sessions over TLS (HTTP/2 and HTTP/1.1) behind a 20 ms RTT proxy that counts wire bytes.
    Wire,
    /// A cold node decoding 32 + 32 tokens over TLS behind the 20 ms RTT proxy, columnar against dense embedding.
    Decode,
    /// `--analyze` and `--spectral` times on the qwen2.5-0.5b shapes, and the preset with spectral k_proj against dense.
    Spectral,
    /// Quantized packages (qwen2.5-0.5b bf16, q8_0, q4_0; a Llama shape bf16 and q4_k) on the coldstart setup: wire bytes, TTFT, peak RSS, tokens/s, lm_head bytes, session bytes, logits error; RMSE per type on real MiniLM.
    Quant,
    /// `gkq-pack --quant q4_0` and `Q4_K_M` against llama-quantize on the same bf16 GGUF of the qwen2.5-0.5b preset: wall times, interleaved pairs.
    Quantize,
    /// 8 nodes boot the qwen2.5-0.5b preset at once: straight to a 100 MB/s origin, through an nginx slice cache, from a gkq-mirror copy, and with a hostile mirror: origin egress and ready times.
    Fleet,
    /// gkq-report on the qwen2.5-0.5b preset with the Qwen2.5 BPE and the six workloads of fixtures/texts, without and with a top-100 warm object: the warm-up's requests and the 100 sessions on the wire against the computed report.
    Report,
    /// gkq-decode against llama.cpp (built from the llama-cpp-python sdist) on SmolLM2 and the qwen2.5-0.5b preset at q4_0: prefill and generation tok/s, time to first token, peak RSS, interleaved; a safetensors-born export loaded by llama.cpp; `--quant Q4_K_M` against llama-quantize's types.
    LlamaCpp,
    /// A cold node ready at link speed: decode from a package behind a 100 MB/s link with 25 MB/s per response, against the sequential pull, curl --parallel and a local-file decode; warm restarts.
    Coldstart,
    /// Qwen2.5-Coder-0.5B and 1.5B-Instruct (real weights; the 0.5B has Qwen2.5-0.5B's shape) over the coldstart network: Phase B's embedding bytes per workload, gkq-report's table, the resident lm_head at each type (bytes, cold load, perplexity and KL divergence by gkq-decode and llama-perplexity), a two-node pipeline.
    Qwen,
    /// The three real GGUFs packed with the defaults (one copy, FORMAT.md 7e) and with --knot-holds-blocks: package bytes against the GGUF, and cold gkq-rows sessions over TLS + HTTP/2 at 20 ms RTT (requests, wire bytes, wall), interleaved.
    Size,
    /// 500 decodes of SmolLM2's local package, two at a time beside a busy process: crashes (signals) and the threads a run holds.
    Stress,
    /// SmolLM2's local package prefilling 1,000, 2,000 and 4,000-token prompts: peak RSS and prefill tok/s.
    Memory,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli.which, cli.reps.max(1)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Builds the release binaries, then runs one benchmark (`reps` repetitions
/// where it repeats).
fn run(which: Which, reps: usize) -> anyhow::Result<()> {
    common::build()?;
    std::fs::create_dir_all(common::bench_dir())?;
    match which {
        Which::Pack => pack::run(reps),
        Which::PackGguf => pack::gguf_only(reps),
        Which::Verify => verify::run(reps),
        Which::Reader => {
            reader::run()?;
            println!();
            wire::run()
        }
        Which::Wire => wire::run(),
        Which::Decode => decode::run(),
        Which::Spectral => spectral::run(reps),
        Which::Big => big::run(),
        Which::Coldstart => coldstart::run(),
        Which::Quant => quant::run(),
        Which::Quantize => quantize::run(reps),
        Which::Fleet => fleet::run(),
        Which::Report => report::run(),
        Which::Qwen => qwen::run(),
        Which::LlamaCpp => llama_cpp::run(),
        Which::Size => size::run(reps),
        Which::Stress => stress::run(),
        Which::Memory => stress::memory(),
    }
}
