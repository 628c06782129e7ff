//! `RdmaError`: what failed (the C call's name) and why (its errno).

use std::fmt;

/// Every fallible call of this crate returns this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    /// A libibverbs / librdmacm call failed; `errno` is what the library reported.
    #[error("{call} failed: {}", Errno(*errno))]
    Call { call: &'static str, errno: i32 },
    /// `ibv_post_send` / `ibv_post_recv` / `ibv_post_srq_recv` refused the work request at
    /// `index` of the list handed to the wrapper; every request before it was posted, none
    /// after it.
    #[error("{call} failed at work request {index}: {}", Errno(*errno))]
    Post { call: &'static str, errno: i32, index: usize },
    /// The wrapper refused the arguments before calling the library.
    #[error("{call}: {reason}")]
    InvalidArgument { call: &'static str, reason: String },
    /// No verbs device has this name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
}

impl RdmaError {
    /// The errno behind the error, when a library call produced it.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RdmaError::Call { errno, .. } | RdmaError::Post { errno, .. } => Some(*errno),
            RdmaError::InvalidArgument { .. } => Some(libc::EINVAL),
            RdmaError::NoSuchDevice(_) => Some(libc::ENODEV),
        }
    }

    /// The name of the C call (or wrapper function) that failed.
    pub fn call(&self) -> &'static str {
        match self {
            RdmaError::Call { call, .. }
            | RdmaError::Post { call, .. }
            | RdmaError::InvalidArgument { call, .. } => call,
            RdmaError::NoSuchDevice(_) => "ibv_get_device_list",
        }
    }

    /// A failed call whose errno the library left in `errno`.
    pub(crate) fn last(call: &'static str) -> Self {
        RdmaError::Call { call, errno: last_errno() }
    }

    /// A failed call that returned its errno (verbs' `ibv_post_*`, `ibv_req_notify_cq`, ...).
    pub(crate) fn from_ret(call: &'static str, ret: i32) -> Self {
        // Some providers return -1 and set errno instead of returning it.
        let errno = if ret < 0 { last_errno() } else { ret };
        RdmaError::Call { call, errno }
    }

    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        RdmaError::InvalidArgument { call, reason: reason.into() }
    }
}

/// The thread's errno; EIO when the library failed without setting one, so an error never
/// reads "Success".
pub(crate) fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

/// Displays an errno through std's strerror text.
struct Errno(i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // io::Error prints "No such device (os error 19)".
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

pub type Result<T> = std::result::Result<T, RdmaError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_call_and_errno() {
        let e = RdmaError::Call { call: "rdma_bind_addr", errno: libc::ENODEV };
        let s = e.to_string();
        assert!(s.starts_with("rdma_bind_addr failed: "), "{s}");
        assert!(s.contains(&format!("os error {}", libc::ENODEV)), "{s}");
        assert_eq!(e.errno(), Some(libc::ENODEV));
        assert_eq!(e.call(), "rdma_bind_addr");

        let p = RdmaError::Post { call: "ibv_post_send", errno: libc::ENOMEM, index: 3 };
        assert!(p.to_string().contains("work request 3"));
        assert_eq!(p.errno(), Some(libc::ENOMEM));
    }

    #[test]
    fn from_ret_takes_positive_errno_directly() {
        assert_eq!(RdmaError::from_ret("ibv_post_send", libc::EINVAL).errno(), Some(libc::EINVAL));
    }
}
