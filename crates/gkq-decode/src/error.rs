/// `Result` with [`DecodeError`].
pub type Result<T, E = DecodeError> = std::result::Result<T, E>;

/// Everything a decode can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The reader failed (knot, network, rows, lm_head).
    #[error(transparent)]
    Reader(#[from] gkq_reader::ReaderError),
    /// `config.json` is missing something or names an architecture this
    /// crate does not run.
    #[error("{0}")]
    Config(String),
    /// A block the architecture needs is missing or has the wrong shape.
    #[error("{0}")]
    Weights(String),
    /// A tensor operation failed.
    #[error("compute: {0}")]
    Compute(#[from] candle_core::Error),
    /// Tokenizer problems: a tokenizer.json that does not load, or is not
    /// this model's (more ids than the embedding has rows).
    #[error(transparent)]
    Tokenizer(#[from] gkq_text::TextError),
    /// A range of layers the model does not have.
    #[error("layers {start}..{end} are outside the model's 0..{layers}")]
    Layers {
        /// First layer asked for.
        start: usize,
        /// End of the range asked for.
        end: usize,
        /// The model's layer count.
        layers: usize,
    },
    /// Stages chained in a way that cannot run.
    #[error("{0}")]
    Stages(String),
    /// A file that cannot be read or written (`--hidden-out`, `--logits-out`, stdout).
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// Arguments that cannot run with this model (a usage error: exit 2).
    #[error("{0}")]
    Usage(String),
}
