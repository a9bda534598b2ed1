//! AFL++ harness: `gkq_fuzz::knot` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::knot(data);
    });
}
