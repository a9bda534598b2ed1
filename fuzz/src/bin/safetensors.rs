//! AFL++ harness: `gkq_fuzz::safetensors` on every input.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        gkq_fuzz::safetensors(data);
    });
}
