//! Requested logouts (`iscsi_target_node_request_logout`): the control plane leaves a
//! request in a connection's [`LogoutSlot`]; the connection's reactor, on its timer, sends
//! the Async Message "logout requested" (RFC 7143 §11.9.1, AsyncEvent 1, Parameter3 the
//! seconds to wait) and drops the connection if the initiator has not logged out when that
//! time has passed ([`LogoutTimer`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why and how long: what a connection is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Seconds the initiator has to log out (Parameter3).
    pub time2wait: u16,
    /// For the log line if it has to be dropped.
    pub why: String,
}

/// Where the control plane leaves a request; the reactor checks one flag per timer tick.
#[derive(Debug, Default)]
pub struct LogoutSlot {
    pending: AtomicBool,
    /// Whether a request was ever left (the connection is asked once).
    requested: AtomicBool,
    req: Mutex<Option<LogoutRequest>>,
}

impl LogoutSlot {
    /// Leaves a request (a newer one replaces one not yet taken).
    pub fn request(&self, r: LogoutRequest) {
        *self.req.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.requested.store(true, Ordering::Release);
        self.pending.store(true, Ordering::Release);
    }

    /// Whether the connection was already asked to log out (a later request changes
    /// nothing: see [`LogoutTimer`]).
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    fn take(&self) -> Option<LogoutRequest> {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        self.req.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// What the connection does now.
#[derive(Debug, PartialEq, Eq)]
pub enum LogoutStep {
    Nothing,
    /// Send the Async Message with this Parameter3.
    Ask(u16),
    /// The time is up: drop the connection, logging this.
    Drop(String),
}

/// A connection's side: asked once (later requests while one runs are ignored, as SPDK
/// does), dropped once.
#[derive(Debug, Default)]
pub struct LogoutTimer {
    asked: Option<(Instant, LogoutRequest)>,
    dropped: bool,
}

impl LogoutTimer {
    /// Called on the connection's timer.
    pub fn on_timer(&mut self, slot: &LogoutSlot, now: Instant) -> LogoutStep {
        let new = slot.take();
        if self.dropped {
            return LogoutStep::Nothing;
        }
        match &self.asked {
            Some((deadline, r)) if now >= *deadline => {
                self.dropped = true;
                LogoutStep::Drop(format!(
                    "no Logout within {} s of the logout request ({}): dropping the connection",
                    r.time2wait, r.why
                ))
            }
            Some(_) => LogoutStep::Nothing,
            None => match new {
                Some(r) => {
                    let t = r.time2wait;
                    self.asked = Some((now + Duration::from_secs(t.into()), r));
                    LogoutStep::Ask(t)
                }
                None => LogoutStep::Nothing,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: u16) -> LogoutRequest {
        LogoutRequest { time2wait: t, why: "maintenance".into() }
    }

    #[test]
    fn a_request_is_asked_once_then_dropped_when_the_time_is_up() {
        let slot = LogoutSlot::default();
        let mut timer = LogoutTimer::default();
        let t0 = Instant::now();
        assert_eq!(timer.on_timer(&slot, t0), LogoutStep::Nothing);
        assert!(!slot.requested());
        slot.request(req(2));
        assert!(slot.requested());
        assert_eq!(timer.on_timer(&slot, t0), LogoutStep::Ask(2));
        // A second request while the first runs changes nothing (no second message, same deadline).
        slot.request(req(60));
        assert_eq!(timer.on_timer(&slot, t0 + Duration::from_secs(1)), LogoutStep::Nothing);
        assert_eq!(timer.on_timer(&slot, t0 + Duration::from_millis(1999)), LogoutStep::Nothing);
        match timer.on_timer(&slot, t0 + Duration::from_secs(2)) {
            LogoutStep::Drop(why) => assert!(why.contains("within 2 s") && why.contains("maintenance"), "{why}"),
            s => panic!("{s:?}"),
        }
        // Dropped once.
        assert_eq!(timer.on_timer(&slot, t0 + Duration::from_secs(3)), LogoutStep::Nothing);
    }

    #[test]
    fn the_latest_request_not_yet_taken_wins() {
        let slot = LogoutSlot::default();
        slot.request(req(30));
        slot.request(req(5));
        let mut timer = LogoutTimer::default();
        assert_eq!(timer.on_timer(&slot, Instant::now()), LogoutStep::Ask(5));
    }
}
