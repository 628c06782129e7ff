//! Login failures by reason, for `iscsi_get_stats`: a refused or broken login is one counter
//! step and one log line, never more.

use std::sync::atomic::{AtomicU64, Ordering};

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

#[cfg(test)]
mod tests {
    use super::*;

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
