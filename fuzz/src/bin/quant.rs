//! AFL++ harness: `gkq_fuzz::quant` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::quant(data);
    });
}
