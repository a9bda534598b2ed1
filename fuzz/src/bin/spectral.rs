//! AFL++ harness: `gkq_fuzz::spectral` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::spectral(data);
    });
}
