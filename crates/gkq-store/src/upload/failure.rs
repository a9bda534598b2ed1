//! What an S3 call's failure means to the user, in one short line.

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What an S3 call's failure means to the user.
#[derive(Debug)]
pub(crate) enum Failure {
    /// HTTP 403.
    Denied,
    /// No HTTP answer: connection refused, DNS, TLS.
    Unreachable(String),
    /// Anything else, as one short line.
    Other(String),
}

/// The innermost cause of an error, which is the part that says what happened
/// (`Connection refused (os error 111)`), without the SDK's debug structure.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// One short line for an SDK error; [`DisplayErrorContext`] only as a last
/// resort, for errors that carry nothing better.
pub(crate) fn describe<E>(e: &SdkError<E, HttpResponse>) -> Failure
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            if status == 403 {
                return Failure::Denied;
            }
            let err = s.err();
            match (err.code(), err.message()) {
                (Some(c), Some(m)) => Failure::Other(format!("{c}: {m} (HTTP {status})")),
                (Some(c), None) => Failure::Other(format!("{c} (HTTP {status})")),
                _ => Failure::Other(format!("HTTP {status}")),
            }
        }
        SdkError::DispatchFailure(d) if !d.is_timeout() => Failure::Unreachable(root_cause(e)),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
            Failure::Other(format!("timed out: {}", root_cause(e)))
        }
        SdkError::ResponseError(_) => {
            Failure::Other(format!("the response could not be read: {}", root_cause(e)))
        }
        _ => Failure::Other(DisplayErrorContext(e).to_string()),
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
