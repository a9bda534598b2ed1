//! llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm` in
//! `llama-vocab.cpp`), for a GGUF whose `tokenizer.ggml.model` is `llama`
//! (Gemma 3, Llama 2): the text is cut at special tokens first, each
//! piece of text gets `▁` for every space (and one in front when the
//! vocabulary says so), and adjacent symbols are merged, best score
//! first (the leftmost pair on a tie), while their concatenation is a
//! token; what never became a token is spelled with byte tokens
//! (`<0xE2>`). Written from llama.cpp rather than taken from Hugging
//! Face's BPE because a GGUF carries scores, not merges, and llama.cpp's
//! ids are the reference.

use std::collections::{BinaryHeap, HashMap};

/// A GGUF token's type (`tokenizer.ggml.token_type`).
pub(crate) mod kind {
    pub(crate) const UNKNOWN: u32 = 2;
    pub(crate) const CONTROL: u32 = 3;
    pub(crate) const USER_DEFINED: u32 = 4;
    pub(crate) const UNUSED: u32 = 5;
    pub(crate) const BYTE: u32 = 6;
}

/// The special tokens that cut a text before it is tokenized, longest
/// first, as llama.cpp's `tokenizer_st_partition`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Specials {
    /// `(text, id, control)`: control and unknown tokens are matched only
    /// when specials are parsed; user-defined ones always.
    tokens: Vec<(String, u32, bool)>,
}

/// A piece of a partitioned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Text to tokenize.
    Text(&'a str),
    /// A special token.
    Token(u32),
}

impl Specials {
    /// The specials of `(id, text, type)` triples.
    pub(crate) fn new<'a>(tokens: impl Iterator<Item = (u32, &'a str, u32)>) -> Specials {
        let mut t: Vec<(String, u32, bool)> = tokens
            .filter(|(_, text, ty)| {
                !text.is_empty()
                    && matches!(*ty, kind::CONTROL | kind::USER_DEFINED | kind::UNKNOWN)
            })
            .map(|(id, text, ty)| (text.to_owned(), id, ty != kind::USER_DEFINED))
            .collect();
        t.sort_by_key(|x| std::cmp::Reverse(x.0.len()));
        Specials { tokens: t }
    }

    /// `text` cut at every special token, longest first.
    pub(crate) fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut out = vec![Fragment::Text(text)];
        for (special, id, control) in &self.tokens {
            if *control && !parse_special {
                continue;
            }
            let mut next = Vec::with_capacity(out.len());
            for f in out {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    let (left, right) = rest.split_at(at);
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(*id));
                    rest = right.get(special.len()..).unwrap_or_default();
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            out = next;
        }
        out
    }
}

/// A SentencePiece vocabulary with scores.
#[derive(Clone, Debug, Default)]
pub(crate) struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    bytes: Vec<Option<u32>>,
    /// A space in front of the text, and after each special token.
    pub(crate) add_space_prefix: bool,
}

/// A candidate merge.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// The best score first; on a tie, the leftmost (llama.cpp's comparator).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A symbol of the text being merged: a byte range, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    /// The vocabulary of `(text, score)` per id; a later id with the text of
    /// an earlier one takes it (llama.cpp's `token_to_id`).
    pub(crate) fn new<'a>(tokens: impl Iterator<Item = (&'a str, f32)>) -> Spm {
        let mut s = Spm::default();
        for (id, (text, score)) in tokens.enumerate() {
            let id = u32::try_from(id).unwrap_or(u32::MAX);
            s.ids.insert(text.to_owned(), id);
            s.scores.push(score);
        }
        s.bytes = (0..=255u8)
            .map(|b| s.ids.get(&format!("<0x{b:02X}>")).copied())
            .collect();
        s
    }

    fn token(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The ids of `fragments` (after [`Specials::partition`]); a character
    /// that is no token and whose bytes have no byte token (`<0xE2>`) is an
    /// error naming it, as llama.cpp refuses it (it never drops one).
    pub(crate) fn encode(
        &self,
        fragments: &[Fragment<'_>],
        out: &mut Vec<u32>,
    ) -> crate::Result<()> {
        let mut prev_special = true;
        for f in fragments {
            match f {
                Fragment::Token(id) => {
                    out.push(*id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut text = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        text.push(' ');
                    }
                    text.push_str(t);
                    let escaped = text.replace(' ', "\u{2581}");
                    self.encode_text(&escaped, out)?;
                    prev_special = false;
                }
            }
        }
        Ok(())
    }

    fn try_bigram(&self, text: &str, syms: &[Symbol], (l, r): (usize, usize)) -> Option<Bigram> {
        let (a, b) = (syms.get(l)?, syms.get(r)?);
        let piece = text.get(a.start..b.start + b.len)?;
        let id = self.token(piece)?;
        Some(Bigram {
            score: *self.scores.get(id as usize)?,
            left: l,
            right: r,
            size: piece.len(),
        })
    }

    /// Merges the characters of `text` (spaces already `▁`).
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) -> crate::Result<()> {
        let mut syms: Vec<Symbol> = Vec::new();
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = None;
        }
        let mut queue = BinaryHeap::new();
        for i in 1..syms.len() {
            queue.extend(self.try_bigram(text, &syms, (i - 1, i)));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            // a side merged away since, or grown: stale
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            syms[b.left].len += r.len;
            syms[b.right].len = 0;
            syms[b.left].next = r.next;
            if let Some(n) = r.next {
                syms[n].prev = Some(b.left);
            }
            if let Some(p) = syms[b.left].prev {
                queue.extend(self.try_bigram(text, &syms, (p, b.left)));
            }
            if let Some(n) = syms[b.left].next {
                queue.extend(self.try_bigram(text, &syms, (b.left, n)));
            }
        }
        let mut at = if syms.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = syms[i];
            let piece = text.get(s.start..s.start + s.len).unwrap_or_default();
            match self.token(piece) {
                Some(id) => out.push(id),
                // never a token: its bytes (byte fallback)
                None => {
                    for b in piece.bytes() {
                        let id = self.bytes[b as usize].ok_or_else(|| {
                            crate::TextError::Tokenizer(format!(
                                "{piece:?} is no token of the vocabulary, and it has no byte token <0x{b:02X}> to spell it with (llama.cpp refuses such a text)"
                            ))
                        })?;
                        out.push(id);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: merges follow the scores, not the order.
    fn toy() -> Spm {
        let mut toks: Vec<(String, f32)> = vec![
            ("▁".into(), -1.0),
            ("a".into(), -1.0),
            ("b".into(), -1.0),
            ("ab".into(), -3.0),
            ("▁a".into(), -2.0),
            ("▁ab".into(), -0.5),
        ];
        for b in 0..=255u8 {
            toks.push((format!("<0x{b:02X}>"), 0.0));
        }
        let mut s = Spm::new(toks.iter().map(|(t, s)| (t.as_str(), *s)));
        s.add_space_prefix = true;
        s
    }

    #[test]
    fn merges_best_score_first_and_falls_back_to_bytes() {
        let s = toy();
        let mut out = Vec::new();
        // " ab": "▁a" (-2) beats "ab" (-3), then "▁ab"
        s.encode(&[Fragment::Text("ab")], &mut out).expect("encode");
        assert_eq!(out, [5]);
        out.clear();
        // "é" is no token: its two bytes
        s.encode(&[Fragment::Text("é")], &mut out).expect("encode");
        assert_eq!(out, [0, 6 + 0xc3, 6 + 0xa9]);
    }

    /// Issue 57, J6: without byte tokens, a character that is no token is
    /// an error naming it (it was dropped).
    #[test]
    fn a_character_without_tokens_or_byte_tokens_is_refused() {
        let toks = [("▁", -1.0f32), ("a", -1.0)];
        let mut s = Spm::new(toks.iter().map(|(t, s)| (*t, *s)));
        s.add_space_prefix = true;
        let mut out = Vec::new();
        let e = s
            .encode(&[Fragment::Text("aé")], &mut out)
            .expect_err("refused");
        assert!(
            e.to_string().contains("\"é\" is no token") && e.to_string().contains("<0xC3>"),
            "{e}"
        );
    }

    #[test]
    fn specials_cut_the_text_longest_first() {
        let sp = Specials::new(
            [
                (7, "<a>", kind::CONTROL),
                (8, "<a><a>", kind::CONTROL),
                (9, "\n", kind::USER_DEFINED),
            ]
            .into_iter(),
        );
        assert_eq!(
            sp.partition("x<a><a>y<a>\n", true),
            [
                Fragment::Text("x"),
                Fragment::Token(8),
                Fragment::Text("y"),
                Fragment::Token(7),
                Fragment::Token(9)
            ]
        );
        // control tokens only when specials are parsed; user-defined always
        assert_eq!(
            sp.partition("<a>\n", false),
            [Fragment::Text("<a>"), Fragment::Token(9)]
        );
    }
}
