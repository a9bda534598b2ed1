//! AFL++ harness: `gkq_fuzz::gguf` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::gguf(data);
    });
}
