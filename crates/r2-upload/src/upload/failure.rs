//! What an S3 call's failure means to the user, in one short line.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What an S3 call's failure means to the user.
#[derive(Debug)]
pub(crate) enum SdkFailure {
    /// HTTP 403.
    Denied,
    /// No HTTP answer: connection refused, DNS, TLS.
    Unreachable(String),
    /// Anything else, as one short line.
    Other(String),
}

use gkq_format::root_cause;

/// One short line for an SDK error; [`DisplayErrorContext`] only as a last
/// resort, for errors that carry nothing better.
pub(crate) fn describe<E>(e: &SdkError<E, HttpResponse>) -> SdkFailure
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            if status == 403 {
                return SdkFailure::Denied;
            }
            let err = s.err();
            match (err.code(), err.message()) {
                (Some(c), Some(m)) => SdkFailure::Other(format!("{c}: {m} (HTTP {status})")),
                (Some(c), None) => SdkFailure::Other(format!("{c} (HTTP {status})")),
                _ => SdkFailure::Other(format!("HTTP {status}")),
            }
        }
        SdkError::DispatchFailure(d) if !d.is_timeout() => SdkFailure::Unreachable(root_cause(e)),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
            SdkFailure::Other(format!("timed out: {}", root_cause(e)))
        }
        SdkError::ResponseError(_) => {
            SdkFailure::Other(format!("the response could not be read: {}", root_cause(e)))
        }
        _ => SdkFailure::Other(DisplayErrorContext(e).to_string()),
    }
}

/// Worth another attempt: timeouts, connection failures, 5xx and 429.
pub(crate) fn transient<E>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => {
            let st = s.raw().status().as_u16();
            st >= 500 || st == 429
        }
        _ => false,
    }
}

/// HTTP 412: a conditional write (`If-None-Match: *`) found the key taken.
pub(crate) fn precondition_failed<E>(e: &SdkError<E, HttpResponse>) -> bool {
    matches!(e, SdkError::ServiceError(s) if s.raw().status().as_u16() == 412)
}
