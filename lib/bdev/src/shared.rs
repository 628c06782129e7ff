//! State a device keeps for the SCSI layer where every gateway exporting it can see it
//! (persistent reservations across riser processes, issue 15): one small object with a
//! version, replaced whole by compare-and-swap, and a notification that the other
//! gateways acknowledge once they have re-read it. Only devices that live in a shared
//! store offer it (RBD: a RADOS object in the image's pool, see `rbd::pr`).

use std::sync::Arc;

/// Why a shared-state operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedError {
    /// The object changed since the version given: read it again and retry.
    Changed,
    /// The store cannot be reached or refused (the message says which call and why).
    Unavailable(String),
}

impl std::fmt::Display for SharedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SharedError::Changed => f.write_str("changed concurrently"),
            SharedError::Unavailable(m) => f.write_str(m),
        }
    }
}

/// Called, on a thread of the store, for each notification (its payload), and with an
/// empty payload after the store re-established its watch (something may have been
/// missed): re-read the state before returning; the notifier waits for the return.
///
/// `Ok` once this gateway holds the state the notification announced (it re-read and
/// decoded the object): only then does the store acknowledge the notification, so a
/// notifier that got every acknowledgement knows every watcher enforces the new state.
/// `Err` (why, for the log): the re-read failed (the store unreachable, or an object this
/// gateway cannot decode); the store retries the call for a bounded time, and while it keeps
/// failing does not acknowledge, so the notifier learns that this gateway did not follow.
pub type OnNotify = Box<dyn Fn(&[u8]) -> Result<(), String> + Send + Sync>;

/// One shared object. Every call may block (on the network): never call it on a reactor.
pub trait SharedState: Send + Sync {
    /// Where the state lives, for messages (`rbd pool/object`).
    fn describe(&self) -> String;
    /// The bytes and version; `None` if nothing was stored yet.
    fn read(&self) -> Result<Option<(Vec<u8>, u64)>, SharedError>;
    /// Replaces the state if it is still at `version` (`None`: if there is none yet).
    /// Returns the new version.
    fn write(&self, data: &[u8], version: Option<u64>) -> Result<u64, SharedError>;
    /// Tells every watcher (this gateway's included) and waits, for a bounded time, until
    /// they acknowledged. `Err` if some did not (they are gone, or cut off from the store).
    fn notify(&self, payload: &[u8]) -> Result<(), SharedError>;
}

/// What [`Bdev::shared_state`](crate::Bdev::shared_state) gives.
pub type SharedStateHandle = Arc<dyn SharedState>;
