//! The accessors that the async handles and the blocking ones share,
//! declared once: each face expands the same macro in its `impl`, over its
//! own `core()`/`inner()`, so the two APIs cannot drift.

/// The reader's accessors that need no I/O (`knot`, `knot_id`,
/// `net_stats`, `disk_stats`), over `self.inner()`.
macro_rules! reader_accessors {
    () => {
        /// The knot.
        pub fn knot(&self) -> &crate::knot::KnotHandle {
            &self.inner().knot
        }

        /// The knot id (hex of its `header_sha256`).
        pub fn knot_id(&self) -> String {
            self.inner().knot_id()
        }

        /// What each source did, with why a mirror was dropped (empty
        /// without `--mirror`).
        pub fn sources(&self) -> Vec<gkq_store::SourceReport> {
            self.inner().store.sources()
        }

        /// Network counters of everything this reader fetched.
        pub fn net_stats(&self) -> gkq_store::NetStats {
            self.inner().store.stats()
        }

        /// The most bulk parts that have been in flight at once (at most
        /// `ReaderConfig`'s `max_parallel`).
        pub fn peak_parts_in_flight(&self) -> usize {
            gkq_store::RangeRead::gate(&*self.inner().store).peak_in_flight()
        }

        /// Counters of the persistent cache (zero without one).
        pub fn disk_stats(&self) -> crate::cache::DiskStats {
            self.inner()
                .disk
                .as_ref()
                .map(|d| d.stats())
                .unwrap_or_default()
        }
    };
}

/// The embedding's accessors that need no I/O, over `self.core()`.
macro_rules! embedding_accessors {
    () => {
        /// The current resolution (it changes to dense if the row file turns
        /// out unusable).
        pub fn resolution(&self) -> crate::resolve::Resolution {
            self.core().resolution()
        }

        /// Rows of the embedding (the vocabulary size).
        pub fn vocab(&self) -> u64 {
            self.core().vocab()
        }

        /// The columnar backend, when that is the current path.
        pub fn columnar(&self) -> Option<crate::columnar::ColumnarEmbedBackend> {
            self.core().columnar()
        }

        /// What the last warm-up did (`warm`, or `ReaderConfig::warm` at
        /// open), if there was one.
        pub fn warm_report(&self) -> Option<crate::columnar::WarmReport> {
            self.core().warm_report()
        }

        /// Row cache counters (zero on the dense path).
        pub fn cache_stats(&self) -> crate::columnar::CacheStats {
            self.core().cache_stats()
        }

        /// Bytes the embedding moved over the network so far: rows and their
        /// proofs, or the dense block.
        pub fn fetched_bytes(&self) -> u64 {
            self.core().fetched_bytes()
        }
    };
}

/// The lm_head's accessors that need no I/O, over `self.core()`.
macro_rules! lm_head_accessors {
    () => {
        /// How the lm_head is pulled (row file or block), and why.
        pub fn resolution(&self) -> crate::resolve::Resolution {
            self.core().resolution()
        }

        /// Whether the matrix is resident.
        pub fn is_resident(&self) -> bool {
            self.core().is_resident()
        }

        /// Bytes the lm_head pull moved over the network.
        pub fn fetched_bytes(&self) -> u64 {
            self.core().fetched_bytes()
        }
    };
}

pub(crate) use {embedding_accessors, lm_head_accessors, reader_accessors};
