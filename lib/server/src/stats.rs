//! Login failures by reason, for `iscsi_get_stats`: a refused or broken login is one counter
//! step and at most one log line ([`FailureLog`]: past the first lines of a second, failures
//! of a kind are summed up in one line a second). Connections refused by a limit before or during their
//! login ([`Refusals`]) are counted too, and logged at most once a second per limit, so that
//! a flood does not flood the log.

use std::fmt;
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

    fn index(self) -> usize {
        LoginFailure::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }

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
    /// The log lines of failed logins, rate-limited per kind.
    pub(crate) log: FailureLog,
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

impl LogSlot {
    /// Whether a line may be logged at `now` (at most one a [`REFUSAL_LOG_INTERVAL`]): the
    /// number left out since the last one, or None (this one is counted as left out).
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_LOG_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
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
        let suppressed = self.slot.lock().unwrap_or_else(|p| p.into_inner()).admit(now)?;
        let line = line();
        Some(if suppressed > 0 { format!("{line} ({suppressed} more such lines left out)") } else { line })
    }
}

/// Failed logins logged in full per kind and second before they are summed up.
pub const FAILED_LOGIN_LINES: u32 = 3;
/// Sources a summary of failed logins names (the others are counted).
const SUMMARY_SOURCES: usize = 4;

/// One kind's failed logins in the current second.
#[derive(Debug, Default)]
struct FailureWindow {
    start: Option<Instant>,
    /// Lines logged in full in this window.
    logged: u32,
    /// Failures left out of the log in this window, and the first sources they came from.
    more: u64,
    sources: Vec<String>,
    other_sources: bool,
}

/// The log of failed logins: a peer can fail as many logins as it likes, so per kind
/// ([`LoginFailure`]) the first [`FAILED_LOGIN_LINES`] of each second are logged in full and
/// the rest summed up in one line ("N more failed logins ... from SOURCES"), given with the
/// next failure of that kind after the second (the counters of `iscsi_get_stats` have all).
#[derive(Debug, Default)]
pub struct FailureLog {
    windows: [Mutex<FailureWindow>; 7],
}

impl FailureLog {
    /// A failed login of kind `why` from `source`; `line` (called only when logged in full)
    /// says who and why. Logs at warning level.
    pub fn failed(&self, why: LoginFailure, source: &dyn fmt::Display, line: impl FnOnce() -> String) {
        for l in self.failed_at(why, source, Instant::now(), line) {
            log::warn!("{l}");
        }
    }

    /// As [`Self::failed`] at `now`: the lines to log (a summary of the last window first).
    pub fn failed_at(
        &self,
        why: LoginFailure,
        source: &dyn fmt::Display,
        now: Instant,
        line: impl FnOnce() -> String,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let mut w = self.windows[why.index()].lock().unwrap_or_else(|p| p.into_inner());
        let expired = w.start.is_none_or(|t| now.saturating_duration_since(t) >= REFUSAL_LOG_INTERVAL);
        if expired {
            if w.more > 0 {
                let span = w.start.map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
                let others = if w.other_sources { " and other sources" } else { "" };
                out.push(format!(
                    "{} more failed logins ({}) from {}{others} in the last {span:.1} s, not logged one by one",
                    w.more,
                    why.name(),
                    w.sources.join(", ")
                ));
            }
            *w = FailureWindow { start: Some(now), ..Default::default() };
        }
        if w.logged < FAILED_LOGIN_LINES {
            w.logged += 1;
            drop(w);
            out.push(line());
            return out;
        }
        w.more += 1;
        let source = source.to_string();
        if !w.sources.contains(&source) {
            if w.sources.len() < SUMMARY_SOURCES {
                w.sources.push(source);
            } else {
                w.other_sources = true;
            }
        }
        out
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
        let suppressed = self.slots[why.index()].lock().unwrap_or_else(|p| p.into_inner()).admit(now)?;
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

    /// Per kind and second, the first [`FAILED_LOGIN_LINES`] failures are logged in full;
    /// the rest are summed up, with their sources (4 named), in one line that comes with the
    /// next failure of the kind after the second. Each kind has its own pace.
    #[test]
    fn failed_logins_are_logged_in_full_then_summed_up_once_a_second_per_kind() {
        let f = FailureLog::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut lines = Vec::new();
        for i in 0..100u64 {
            let src = format!("10.0.0.{}", i % 6);
            lines.extend(f.failed_at(LoginFailure::Authentication, &src, at(i * 5), || format!("failed {i}")));
        }
        assert_eq!(lines, ["failed 0", "failed 1", "failed 2"]);
        // Another kind is not held back by this one.
        assert_eq!(f.failed_at(LoginFailure::NotFound, &"10.0.0.9", at(10), || "not found".into()), ["not found"]);
        // The next second: the summary, then lines in full again.
        let next = f.failed_at(LoginFailure::Authentication, &"10.0.0.7", at(1000), || "failed 100".into());
        assert_eq!(
            next,
            [
                "97 more failed logins (authentication) from 10.0.0.3, 10.0.0.4, 10.0.0.5, 10.0.0.0 and other \
                 sources in the last 1.0 s, not logged one by one",
                "failed 100"
            ]
        );
        // A quiet window has no summary.
        assert_eq!(f.failed_at(LoginFailure::Authentication, &"10.0.0.7", at(5000), || "later".into()), ["later"]);
        // A line in full is built only when logged.
        for _ in 0..2 {
            f.failed_at(LoginFailure::Authentication, &"10.0.0.7", at(5001), || "x".into());
        }
        assert!(f.failed_at(LoginFailure::Authentication, &"10.0.0.7", at(5002), || panic!("built")).is_empty());
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
