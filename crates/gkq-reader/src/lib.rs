//! Runtime reader: priority resolution, columnar row fetch, lm_head residency. Not implemented yet: see issue 6.
