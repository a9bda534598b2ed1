//! AFL++ harness: `gkq_fuzz::runs` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::runs(data);
    });
}
