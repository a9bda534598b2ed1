//! AFL++ harness: `gkq_fuzz::sig` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::sig(data);
    });
}
