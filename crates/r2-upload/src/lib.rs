//! Upload of packed models to Cloudflare R2 (S3 API). Not implemented yet: see issue 5.
