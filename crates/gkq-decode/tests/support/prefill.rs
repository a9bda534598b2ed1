//! Batched prefill against token-by-token prefill (issue 45), shared by
//! `real.rs` (quantized) and `prefill.rs` (dequantized, its own process).

use gkq_decode::{Stage, StageRoles};

/// SmolLM2's chat prompt of `real.rs`, 37 ids.
pub(crate) const CHAT: [u32; 37] = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
];

/// The last position's logits of [`CHAT`] through the knot at `knot`: the
/// prompt in one forward pass, then (after a reset) one token at a time.
pub(crate) fn prefill_both_ways(knot: &str) -> (Vec<f32>, Vec<f32>) {
    let config = gkq_reader::ReaderConfig::default();
    let mut stage = Stage::open(knot, config, StageRoles::All, None).expect("open");
    let logits = |stage: &mut Stage, ids: &[u32]| -> Vec<f32> {
        let x = stage.embed(ids).expect("embed");
        let x = stage.forward(&x).expect("forward");
        stage.logits(&x).expect("logits").to_vec1().expect("f32")
    };
    let batched = logits(&mut stage, &CHAT);
    stage.reset();
    let mut one = Vec::new();
    for &id in &CHAT {
        one = logits(&mut stage, &[id]);
    }
    (batched, one)
}
