//! Login failures by reason, for `iscsi_get_stats`: a refused or broken login is one counter
//! step and one log line, never more. Connections refused by a limit before or during their
//! login ([`Refusals`]) are counted too, and logged at most once a second per limit, so that
//! a flood does not flood the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use riser_iscsi::pdu::LoginStatus;
use serde_json::{json, Value};

/// Why a login did not reach full-feature phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    /// 0x0201: CHAP failed (wrong secret, unknown user, reflection, malformed keys).
    Authentication,
    /// 0x0202: the initiator may not reach the target (ACLs, portal group).
    Authorization,
    /// 0x0203 / 0x0204: no such target.
    NotFound,
    /// Other initiator errors (0x02xx): bad keys, wrong session, too many connections.
    InitiatorError,
    /// 0x03xx: the target could not (out of resources, service unavailable).
    TargetError,
    /// The login did not finish in time.
    Timeout,
    /// The connection broke or closed during login.
    Transport,
}

impl LoginFailure {
    /// The reason a Login Response status stands for.
    pub fn of_status(s: LoginStatus) -> LoginFailure {
        match (s.class, s.detail) {
            (0x02, 0x01) => LoginFailure::Authentication,
            (0x02, 0x02) => LoginFailure::Authorization,
            (0x02, 0x03) | (0x02, 0x04) => LoginFailure::NotFound,
            (0x03, _) => LoginFailure::TargetError,
            _ => LoginFailure::InitiatorError,
        }
    }

    const ALL: [LoginFailure; 7] = [
        LoginFailure::Authentication,
        LoginFailure::Authorization,
        LoginFailure::NotFound,
        LoginFailure::InitiatorError,
        LoginFailure::TargetError,
        LoginFailure::Timeout,
        LoginFailure::Transport,
    ];

    fn name(self) -> &'static str {
        match self {
            LoginFailure::Authentication => "authentication",
            LoginFailure::Authorization => "authorization",
            LoginFailure::NotFound => "not_found",
            LoginFailure::InitiatorError => "initiator_error",
            LoginFailure::TargetError => "target_error",
            LoginFailure::Timeout => "timeout",
            LoginFailure::Transport => "transport",
        }
    }
}

/// Counters of login outcomes.
#[derive(Debug, Default)]
pub struct LoginStats {
    succeeded: AtomicU64,
    failed: [AtomicU64; 7],
}

impl LoginStats {
    pub fn success(&self) {
        self.succeeded.fetch_add(1, Ordering::Relaxed);
    }

    pub fn failure(&self, why: LoginFailure) {
        let i = LoginFailure::ALL.iter().position(|f| *f == why).unwrap_or(0);
        self.failed[i].fetch_add(1, Ordering::Relaxed);
    }

    /// How many logins failed for `why`.
    pub fn failures(&self, why: LoginFailure) -> u64 {
        let i = LoginFailure::ALL.iter().position(|f| *f == why).unwrap_or(0);
        self.failed[i].load(Ordering::Relaxed)
    }

    /// `{"succeeded": n, "failed": {"authentication": n, ...}}`.
    pub fn to_json(&self) -> Value {
        let failed: serde_json::Map<String, Value> =
            LoginFailure::ALL.iter().map(|f| (f.name().to_string(), json!(self.failures(*f)))).collect();
        json!({"succeeded": self.succeeded.load(Ordering::Relaxed), "failed": failed})
    }
}

/// A limit that refused a connection or a session. Each is an option of `iscsi_set_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_logins`: logins in progress (each has a thread).
    Logins,
    /// `max_logins_per_source`: logins in progress from one source address.
    LoginsPerSource,
    /// `max_sessions`: normal sessions.
    Sessions,
    /// `max_discovery_sessions`: discovery sessions.
    DiscoverySessions,
    /// `max_discovery_sessions_per_source`: discovery sessions from one source address.
    DiscoverySessionsPerSource,
}

impl Refusal {
    const ALL: [Refusal; 5] = [
        Refusal::Logins,
        Refusal::LoginsPerSource,
        Refusal::Sessions,
        Refusal::DiscoverySessions,
        Refusal::DiscoverySessionsPerSource,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The option that sets the limit.
    pub fn option(self) -> &'static str {
        match self {
            Refusal::Logins => "max_logins",
            Refusal::LoginsPerSource => "max_logins_per_source",
            Refusal::Sessions => "max_sessions",
            Refusal::DiscoverySessions => "max_discovery_sessions",
            Refusal::DiscoverySessionsPerSource => "max_discovery_sessions_per_source",
        }
    }
}

/// At most one log line per this interval and reason.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct LogSlot {
    last: Option<Instant>,
    /// Refusals not logged since the last line.
    suppressed: u64,
}

/// One kind of log line that a peer can cause at will, logged at most once a
/// [`REFUSAL_LOG_INTERVAL`]; the next line after a quiet interval says how many were left out.
#[derive(Debug, Default)]
pub struct LogLimiter {
    slot: Mutex<LogSlot>,
}

impl LogLimiter {
    /// `line` (called only when logged) at warning level, unless one was logged less than
    /// a second ago.
    pub fn warn(&self, line: impl FnOnce() -> String) {
        if let Some(l) = self.line_at(Instant::now(), line) {
            log::warn!("{l}");
        }
    }

    /// As [`Self::warn`] at `now`: the line to log, if any.
    pub fn line_at(&self, now: Instant, line: impl FnOnce() -> String) -> Option<String> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.last.is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_LOG_INTERVAL) {
            slot.suppressed += 1;
            return None;
        }
        slot.last = Some(now);
        let suppressed = std::mem::take(&mut slot.suppressed);
        drop(slot);
        let line = line();
        Some(if suppressed > 0 { format!("{line} ({suppressed} more such lines left out)") } else { line })
    }
}

/// Refusals by limit: counted, and logged rate-limited (a line says the limit, its option and
/// how to raise it; the next line after a quiet second also says how many were not logged).
#[derive(Debug, Default)]
pub struct Refusals {
    counts: [AtomicU64; Refusal::ALL.len()],
    slots: [Mutex<LogSlot>; Refusal::ALL.len()],
}

impl Refusals {
    /// One refusal for `why`; `line` (called only when logged) says who and what limit.
    pub fn refused(&self, why: Refusal, line: impl FnOnce() -> String) {
        if let Some(l) = self.refused_at(why, Instant::now(), line) {
            log::warn!("{l}");
        }
    }

    /// As [`Self::refused`] at `now`: the line to log, if any.
    fn refused_at(&self, why: Refusal, now: Instant, line: impl FnOnce() -> String) -> Option<String> {
        self.counts[why.index()].fetch_add(1, Ordering::Relaxed);
        let mut slot = self.slots[why.index()].lock().unwrap_or_else(|p| p.into_inner());
        if slot.last.is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_LOG_INTERVAL) {
            slot.suppressed += 1;
            return None;
        }
        slot.last = Some(now);
        let suppressed = std::mem::take(&mut slot.suppressed);
        drop(slot);
        let line = line();
        Some(if suppressed > 0 {
            format!("{line} ({suppressed} more refused by {} since the last such line)", why.option())
        } else {
            line
        })
    }

    /// How many were refused for `why` since start.
    pub fn count(&self, why: Refusal) -> u64 {
        self.counts[why.index()].load(Ordering::Relaxed)
    }

    /// `{"max_logins": n, "max_logins_per_source": n, ...}`: refusals by the option that
    /// refused.
    pub fn to_json(&self) -> Value {
        let m: serde_json::Map<String, Value> =
            Refusal::ALL.iter().map(|r| (r.option().to_string(), json!(self.count(*r)))).collect();
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of refusals makes one line a second per limit, the next one counting those
    /// not logged; each limit has its own pace.
    #[test]
    fn refusals_are_logged_at_most_once_a_second_per_limit() {
        let r = Refusals::default();
        let t0 = Instant::now();
        let line = || "refused".to_string();
        assert_eq!(r.refused_at(Refusal::Sessions, t0, line).as_deref(), Some("refused"));
        for i in 0..100 {
            assert_eq!(r.refused_at(Refusal::Sessions, t0 + Duration::from_millis(i * 9), line), None);
        }
        assert_eq!(r.refused_at(Refusal::Logins, t0, line).as_deref(), Some("refused"), "another limit's own pace");
        assert_eq!(
            r.refused_at(Refusal::Sessions, t0 + Duration::from_secs(1), line).as_deref(),
            Some("refused (100 more refused by max_sessions since the last such line)")
        );
        assert_eq!(r.count(Refusal::Sessions), 102);
        assert_eq!(
            r.to_json(),
            json!({"max_logins": 1, "max_logins_per_source": 0, "max_sessions": 102, "max_discovery_sessions": 0,
                   "max_discovery_sessions_per_source": 0})
        );
    }

    #[test]
    fn statuses_map_to_reasons_and_count() {
        assert_eq!(LoginFailure::of_status(LoginStatus::AUTHENTICATION_FAILURE), LoginFailure::Authentication);
        assert_eq!(LoginFailure::of_status(LoginStatus::AUTHORIZATION_FAILURE), LoginFailure::Authorization);
        assert_eq!(LoginFailure::of_status(LoginStatus::NOT_FOUND), LoginFailure::NotFound);
        assert_eq!(LoginFailure::of_status(LoginStatus::TARGET_REMOVED), LoginFailure::NotFound);
        assert_eq!(LoginFailure::of_status(LoginStatus::MISSING_PARAMETER), LoginFailure::InitiatorError);
        assert_eq!(LoginFailure::of_status(LoginStatus::OUT_OF_RESOURCES), LoginFailure::TargetError);
        let s = LoginStats::default();
        s.failure(LoginFailure::Authentication);
        s.failure(LoginFailure::Authentication);
        s.failure(LoginFailure::Timeout);
        s.success();
        assert_eq!(
            s.to_json(),
            json!({"succeeded": 1, "failed": {"authentication": 2, "authorization": 0, "not_found": 0,
                   "initiator_error": 0, "target_error": 0, "timeout": 1, "transport": 0}})
        );
    }
}
