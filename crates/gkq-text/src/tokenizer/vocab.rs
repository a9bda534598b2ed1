//! What a tokenizer knows of each id besides how to find it: the bytes it
//! renders as (none for a control token), which ids end a generation, and
//! the BOS/EOS a prompt gets. The pieces are held flat (one buffer and one
//! end per id): Gemma 3's 262,144 ids cost about their bytes.

use std::collections::BTreeSet;

/// The texts llama.cpp takes for end-of-generation tokens whatever their
/// ids (`llama-vocab.cpp`, "auto-detect special tokens by text").
pub(crate) const EOG_TEXTS: [&str; 16] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<｜end▁of▁sentence｜>",
];

/// How an id renders as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Render {
    /// Its bytes.
    Bytes,
    /// Nothing: a control token (`<|im_end|>`, `<bos>`), as llama.cpp
    /// renders it unless asked to show specials.
    Hidden,
}

/// The pieces and specials of a vocabulary.
#[derive(Clone, Debug, Default)]
pub(crate) struct Vocab {
    bytes: Vec<u8>,
    ends: Vec<u32>,
    hidden: Vec<bool>,
    longest: usize,
    /// The beginning-of-sequence id.
    pub(crate) bos: Option<u32>,
    /// The end-of-sequence id.
    pub(crate) eos: Option<u32>,
    /// Whether a prompt starts with BOS (`add_bos_token`).
    pub(crate) add_bos: bool,
    /// Whether a prompt ends with EOS (`add_eos_token`).
    pub(crate) add_eos: bool,
    /// The ids that end a generation.
    pub(crate) eog: BTreeSet<u32>,
    /// The texts of BOS and EOS (what a chat template's `bos_token` is).
    pub(crate) bos_text: String,
    pub(crate) eos_text: String,
}

impl Vocab {
    /// Appends the next id's piece.
    pub(crate) fn push(&mut self, bytes: &[u8], render: Render) {
        self.longest = self.longest.max(bytes.len());
        self.bytes.extend_from_slice(bytes);
        self.ends
            .push(u32::try_from(self.bytes.len()).unwrap_or(u32::MAX));
        self.hidden.push(render == Render::Hidden);
    }

    /// The bytes of the longest piece (control tokens' texts included).
    pub(crate) fn longest(&self) -> usize {
        self.longest
    }

    /// Ids known.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The bytes `id` renders as: empty for a control token or an id past
    /// the vocabulary.
    pub(crate) fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if self.hidden.get(i).copied().unwrap_or(true) {
            return &[];
        }
        let end = self.ends.get(i).copied().unwrap_or(0) as usize;
        let start = match i.checked_sub(1) {
            Some(p) => self.ends.get(p).copied().unwrap_or(0) as usize,
            None => 0,
        };
        self.bytes.get(start..end).unwrap_or_default()
    }

    /// The end-of-generation ids: EOS, and every id whose text llama.cpp
    /// takes for one (`texts` gives each id's text).
    pub(crate) fn find_eog<'a>(&mut self, texts: impl Iterator<Item = (u32, &'a str)>) {
        for (id, t) in texts {
            if EOG_TEXTS.contains(&t) {
                self.eog.insert(id);
            }
        }
        if let Some(e) = self.eos {
            self.eog.insert(e);
        }
    }
}

/// Text from bytes that arrive a token at a time: each call gives what is
/// complete UTF-8 so far; a character split over tokens waits for its
/// last byte; bytes that can never be UTF-8 come out as U+FFFD.
#[derive(Clone, Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds `bytes`, returns the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(
                        self.pending.get(..good).unwrap_or_default(),
                    ));
                    match e.error_len() {
                        // an incomplete sequence at the end: wait for more
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is left when the stream ends (an incomplete character, as U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_over_tokens_waits_for_its_last_byte() {
        let mut s = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(s.push(b"caf"), "caf");
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.push(&e[1..]), "é");
        let emoji = "🤖".as_bytes();
        assert_eq!(s.push(&emoji[..3]), "");
        assert_eq!(s.push(&emoji[3..]), "🤖");
        assert_eq!(s.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(s.push(&e[..1]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }

    #[test]
    fn control_tokens_render_as_nothing() {
        let mut v = Vocab::default();
        v.push(b"<|im_end|>", Render::Hidden);
        v.push(b"hi", Render::Bytes);
        assert_eq!(v.piece(0), b"");
        assert_eq!(v.piece(1), b"hi");
        assert_eq!(v.piece(7), b"");
        assert_eq!(v.len(), 2);
    }
}
