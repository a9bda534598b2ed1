//! AFL++ harness: `gkq_fuzz::merkle` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::merkle(data);
    });
}
