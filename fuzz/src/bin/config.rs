//! AFL++ harness: `gkq_fuzz::config` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::config(data);
    });
}
