//! Issue 45: batched prefill against token-by-token prefill with every
//! weight dequantized (`CANDLE_DEQUANTIZE_ALL`, set for this process alone:
//! this binary holds one test). Without 8-bit activations the two agree to
//! f32 rounding: within 1e-5 of the largest logit (measured: 3.2e-5 of
//! 25.3, 1.3e-6).

#[path = "support/prefill.rs"]
mod support;

#[test]
#[allow(unsafe_code)]
fn batched_prefill_equals_token_by_token_prefill_dequantized() {
    // SAFETY: the only test of this binary, before any thread of its own
    unsafe { std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1") };
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::smollm2(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let knot = out.join("model.knot");
    let (batched, one) = support::prefill_both_ways(knot.to_str().expect("utf8"));
    let big = one.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = batched
        .iter()
        .zip(&one)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    println!("largest difference {diff} of the largest logit {big}");
    assert!(diff <= 1e-5 * big, "largest difference {diff} of {big}");
}
