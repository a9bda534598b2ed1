//! Pure arithmetic of byte ranges: the checks made before a request is
//! sent, the `Content-Range` a `206` must carry, the split of a large range
//! into parts, and the deadline a request of `n` bytes gets. No I/O here.

use std::time::Duration;

use crate::error::{Result, StoreError};

/// Refuses a reversed range, or one longer than `cap`, before anything is
/// asked for or allocated. `end` is inclusive.
pub(crate) fn check_read(url: &str, start: u64, end: u64, cap: u64) -> Result<u64> {
    let Some(len) = end.checked_sub(start).map(|d| d.saturating_add(1)) else {
        return Err(StoreError::EmptyRange {
            url: url.into(),
            start,
            end,
        });
    };
    if len > cap {
        return Err(StoreError::TooLarge {
            url: url.into(),
            start,
            end,
            len,
            cap,
        });
    }
    Ok(len)
}

/// The inclusive end of a read of `len` bytes at `start` (a destination
/// buffer's length), after the checks of [`check_read`]: an empty buffer is
/// an empty range.
pub(crate) fn check_dest(url: &str, start: u64, len: u64, cap: u64) -> Result<u64> {
    if len == 0 {
        return Err(StoreError::EmptyRange {
            url: url.into(),
            start,
            end: start.wrapping_sub(1),
        });
    }
    let end = start.saturating_add(len).saturating_sub(1);
    check_read(url, start, end, cap)?;
    Ok(end)
}

/// `(start, end, total)` of `bytes a-b/t`.
pub(crate) fn parse_content_range(cr: &str) -> Option<(u64, u64, u64)> {
    let (range, total) = cr.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b, t) = (a.parse().ok()?, b.parse().ok()?, total.parse().ok()?);
    (a <= b && b < t).then_some((a, b, t))
}

/// What the Content-Range of a 206 must say.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Expect {
    /// Exactly the range asked for, of an object of this length when known.
    Exact(Option<u64>),
    /// `bytes 0-E/T` with `E = min(end, T - 1)`: a prefix of any object.
    Prefix,
}

impl Expect {
    /// The end of the range the body covers and the object's length, or
    /// the header that was expected.
    pub(crate) fn check(
        self,
        cr: &str,
        start: u64,
        end: u64,
    ) -> std::result::Result<(u64, u64), String> {
        let parsed = parse_content_range(cr);
        match self {
            Expect::Exact(total) => match parsed {
                Some((a, b, t)) if a == start && b == end && total.is_none_or(|x| x == t) => {
                    Ok((end, t))
                }
                _ => Err(format!(
                    "bytes {start}-{end}/{}",
                    total.map_or("*".to_string(), |t| t.to_string())
                )),
            },
            Expect::Prefix => match parsed {
                Some((0, b, t)) if b == end.min(t - 1) => Ok((b, t)),
                _ => Err(format!(
                    "bytes 0-{end}/T, or bytes 0-(T-1)/T for a shorter object"
                )),
            },
        }
    }
}

/// The parts `[start, end)` of `len` bytes cut into pieces of `part` bytes
/// (the last one shorter), as `(offset, len)` pairs relative to the range.
pub fn split_parts(len: u64, part: u64) -> Vec<(u64, u64)> {
    let part = part.max(1);
    let mut out = Vec::with_capacity(usize::try_from(len.div_ceil(part)).unwrap_or(0));
    let mut at = 0;
    while at < len {
        let n = part.min(len - at);
        out.push((at, n));
        at += n;
    }
    out
}

/// How long one request for `bytes` bytes may take from send to last body
/// byte: the floor plus the time the bytes take at the minimum throughput.
/// A server that stalls or drips past it is cut off, and the attempt fails
/// as a timeout (docs of `StoreConfig::min_throughput`).
pub fn deadline(floor: Duration, min_throughput: u64, bytes: u64) -> Duration {
    if min_throughput == 0 {
        return floor;
    }
    let secs = bytes as f64 / min_throughput as f64;
    floor.saturating_add(Duration::from_secs_f64(secs.min(86_400.0 * 365.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reversed_and_oversized_ranges_are_refused() {
        assert!(matches!(
            check_read("u", 10, 9, 100),
            Err(StoreError::EmptyRange {
                start: 10,
                end: 9,
                ..
            })
        ));
        assert!(matches!(
            check_read("u", 0, 100, 100),
            Err(StoreError::TooLarge {
                len: 101,
                cap: 100,
                ..
            })
        ));
        assert_eq!(check_read("u", 5, 5, 100).ok(), Some(1));
        assert!(matches!(
            check_read("u", 0, u64::MAX, u64::MAX),
            Ok(u64::MAX)
        ));
    }

    #[test]
    fn destinations_give_the_range_they_fill() {
        assert_eq!(check_dest("u", 10, 5, 100).ok(), Some(14));
        // an empty buffer is an empty range, also at offset 0 (where the
        // inclusive end cannot be written)
        for start in [0, 7] {
            assert!(matches!(
                check_dest("u", start, 0, 100),
                Err(StoreError::EmptyRange { .. })
            ));
        }
        assert!(matches!(
            check_dest("u", 0, 101, 100),
            Err(StoreError::TooLarge { len: 101, .. })
        ));
    }

    #[test]
    fn content_range_parses_only_well_formed_headers() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, 10)));
        assert_eq!(parse_content_range("bytes 9-0/10"), None, "reversed");
        assert_eq!(parse_content_range("bytes 0-10/10"), None, "past the end");
        assert_eq!(parse_content_range("bytes 0-9/*"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
        assert_eq!(parse_content_range("items 0-9/10"), None);
        assert_eq!(parse_content_range(""), None);
        assert_eq!(parse_content_range("bytes 0-9/-1"), None);
    }

    #[test]
    fn content_range_rules() {
        let exact = Expect::Exact(Some(100));
        assert_eq!(exact.check("bytes 10-19/100", 10, 19), Ok((19, 100)));
        assert!(exact.check("bytes 10-19/101", 10, 19).is_err());
        assert!(exact.check("bytes 11-20/100", 10, 19).is_err());
        assert_eq!(
            Expect::Exact(None).check("bytes 10-19/70", 10, 19),
            Ok((19, 70))
        );
        let p = Expect::Prefix;
        assert_eq!(
            p.check("bytes 0-65535/1000000", 0, 65535),
            Ok((65535, 1000000))
        );
        assert_eq!(p.check("bytes 0-4119/4120", 0, 65535), Ok((4119, 4120)));
        assert!(p.check("bytes 0-4118/4120", 0, 65535).is_err());
        assert!(p.check("bytes 1-4119/4120", 0, 65535).is_err());
        assert!(p.check("bytes 0-65535/*", 0, 65535).is_err());
        assert!(p.check("", 0, 65535).is_err());
    }

    #[test]
    fn parts_cover_the_range_once() {
        assert_eq!(split_parts(0, 8), vec![]);
        assert_eq!(split_parts(8, 8), vec![(0, 8)]);
        assert_eq!(split_parts(20, 8), vec![(0, 8), (8, 8), (16, 4)]);
        assert_eq!(split_parts(3, 0), vec![(0, 1), (1, 1), (2, 1)]);
        let parts = split_parts(1_000_003, 65_536);
        assert_eq!(parts.iter().map(|p| p.1).sum::<u64>(), 1_000_003);
        assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    }

    #[test]
    fn deadlines_scale_with_the_bytes() {
        let floor = Duration::from_secs(10);
        assert_eq!(deadline(floor, 0, 1 << 40), floor);
        assert_eq!(deadline(floor, 1 << 20, 0), floor);
        assert_eq!(deadline(floor, 1 << 20, 8 << 20), Duration::from_secs(18));
        // a 1,792-byte row dripped at 1 byte/s is cut off after about 10 s
        assert!(deadline(floor, 64 << 10, 1792) < Duration::from_millis(10_100));
        // no overflow on absurd sizes
        assert!(deadline(floor, 1, u64::MAX) > floor);
    }
}
