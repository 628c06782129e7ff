//! Target-side key negotiation (RFC 7143 §6.2 - §6.6, §13; RFC 7145 §6).
//!
//! A [`Negotiator`] belongs to one connection. It takes the initiator's key list of one
//! negotiation step ([`Negotiator::respond`]) and returns the target's answers, applying
//! each key's result function against the target's own limits ([`TargetConfig`]):
//!
//! - unknown keys (including `X-`/`X#` extensions) are answered `NotUnderstood` (§6.2);
//! - inadmissible values (out of range, not a number, not Yes/No, no acceptable list
//!   entry) are answered `Reject` and the key keeps its default (§6.2);
//! - a key offered twice in one login (or one Text negotiation) is a protocol error
//!   (§6.3), except for re-declarable keys (MaxRecvDataSegmentLength, TargetName,
//!   TargetAddress, TargetAlias);
//! - keys irrelevant to this session are answered `Irrelevant`: the "Irrelevant when
//!   SessionType=Discovery" keys, iSER keys on a TCP connection, leading-only keys on a
//!   non-leading connection;
//! - declarative keys are recorded, not answered; the target declares its own
//!   MaxRecvDataSegmentLength once ([`Negotiator::declarations`]);
//! - where an initiator's silence would leave a default the target cannot live with
//!   (ImmediateData=Yes, MaxBurstLength or FirstBurstLength above the target's, digests the
//!   target requires, RDMAExtensions on an iSER connection) the target offers the key
//!   itself ([`Negotiator::offers`]) and waits for the answer before leaving login.

use std::collections::HashSet;

use thiserror::Error;

use crate::params::{lookup, ConnectionParams, SessionParams, SessionType};
use crate::pdu::{Stage, MAX_AHS_LENGTH};
use crate::text::{Pairs, Special};

/// Whether the target accepts CRC32C digests on a TCP connection (RFC 7143 §13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DigestPolicy {
    /// Only None.
    Off,
    /// CRC32C or None, whichever the initiator lists first.
    #[default]
    Allowed,
    /// Only CRC32C; offered by the target if the initiator is silent.
    Required,
}

/// The transport under this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    #[default]
    Tcp,
    /// RDMA (InfiniBand, RoCE, iWARP): RDMAExtensions=Yes, no digests (RFC 7145 §6.1).
    Iser,
}

/// The target's own limits and preferences: its side of every negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// Declared to the initiator: the largest data segment the target receives over TCP.
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_connections: u16,
    pub max_outstanding_r2t: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub header_digest: DigestPolicy,
    pub data_digest: DigestPolicy,
    /// iSER: largest control-type data segment the target receives (RFC 7145 §6.2);
    /// sizes the receive buffers.
    pub target_recv_data_segment_length: u32,
    /// iSER: the unexpected PDUs (RFC 7145 §6.7) the target can have outstanding, 0 = no limit:
    /// what the iSER receive ring holds, so it MUST match the ring the datamover posts for the
    /// target's queue depth; the server fills it with
    /// [`iser_max_outstanding_unexpected_pdus`]`(queue_depth)`. Answered when the initiator
    /// sends the key, never offered unasked: open-iscsi fails a login on a key it does not
    /// know, and Linux never sends this one.
    pub max_outstanding_unexpected_pdus: u32,
    pub max_ahs_length: u16,
    /// The CmdSN window (MaxCmdSN - ExpCmdSN + 1) opened at the end of login.
    pub queue_depth: u32,
}

/// Receive buffers the iSER receive ring keeps beyond the CmdSN window: immediate commands
/// (NOP-Out, Task Management, Logout, Text) and unsolicited Data-Out.
pub const ISER_UNEXPECTED_PDU_MARGIN: u32 = 16;

/// MaxOutstandingUnexpectedPDUs for a target with `queue_depth` (its CmdSN window): the
/// receive ring the iSER datamover posts for that depth, `queue_depth` + 16
/// ([`ISER_UNEXPECTED_PDU_MARGIN`]). The two must agree: change both or neither.
pub const fn iser_max_outstanding_unexpected_pdus(queue_depth: u32) -> u32 {
    queue_depth.saturating_add(ISER_UNEXPECTED_PDU_MARGIN)
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_connections: 2,
            max_outstanding_r2t: 1,
            default_time2wait: 2,
            default_time2retain: 20,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Allowed,
            target_recv_data_segment_length: 8192,
            max_outstanding_unexpected_pdus: iser_max_outstanding_unexpected_pdus(128),
            max_ahs_length: MAX_AHS_LENGTH as u16,
            queue_depth: 128,
        }
    }
}

/// Where the keys were received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPhase {
    /// Login, SecurityNegotiation stage.
    Security,
    /// Login, LoginOperationalNegotiation stage.
    Operational,
    /// Text Request in full feature phase.
    FullFeature,
}

impl KeyPhase {
    pub fn from_stage(s: Stage) -> KeyPhase {
        match s {
            Stage::SecurityNegotiation => KeyPhase::Security,
            Stage::LoginOperationalNegotiation | Stage::Reserved => KeyPhase::Operational,
            Stage::FullFeaturePhase => KeyPhase::FullFeature,
        }
    }
}

/// Negotiation failures that end a login with Initiator Error (RFC 7143 §6.3, §11.13.5);
/// in full feature phase the Text Request is rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NegotiationError {
    #[error("key {0} sent twice")]
    Duplicate(String),
    #[error("security key {0} outside the SecurityNegotiation stage")]
    SecurityKeyOutOfStage(String),
    #[error("{0}=CRC32C is required by the target and was refused")]
    DigestRequired(&'static str),
    #[error("an iSER connection needs RDMAExtensions=Yes")]
    RdmaExtensionsRequired,
}

/// Keys that may be declared again within one login (RFC 7143 §6.3: "except for
/// responses to specific keys that explicitly allow repeated key declarations").
const REDECLARABLE: &[&str] = &[
    "MaxRecvDataSegmentLength",
    "TargetName",
    "TargetAddress",
    "TargetAlias",
];

/// A target offer waiting for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offer {
    key: &'static str,
}

/// The negotiator of one connection.
#[derive(Debug, Clone)]
pub struct Negotiator {
    config: TargetConfig,
    transport: Transport,
    leading: bool,
    session: SessionParams,
    conn: ConnectionParams,
    /// Keys received in this login or this Text negotiation.
    seen: HashSet<String>,
    /// AuthMethod values the target accepts for this initiator.
    auth_methods: Vec<String>,
    /// Offers sent and not yet answered.
    awaiting: Vec<Offer>,
    /// Offers whose answer is optional (RFC 7143 §6.2.2): an answer is taken silently.
    optional: Vec<Offer>,
    /// Keys the target has offered in this login.
    offered: Vec<&'static str>,
    mrdsl_declared: bool,
}

enum Answer {
    /// Reply with this value.
    Value(String),
    /// Reply with one of the constants.
    Special(Special),
    /// No reply (declarations, keys handled elsewhere).
    Silent,
}

impl Negotiator {
    /// A negotiator for a connection of a session of `session_type`. For a connection added
    /// to an existing session (`leading` false) pass that session's parameters in
    /// `existing`; leading-only keys are then Irrelevant.
    pub fn new(
        config: TargetConfig,
        transport: Transport,
        session_type: SessionType,
        leading: bool,
        existing: Option<SessionParams>,
    ) -> Negotiator {
        let mut session = existing.unwrap_or_default();
        session.session_type = session_type;
        let conn = ConnectionParams {
            max_recv_data_segment_length: config.max_recv_data_segment_length,
            ..ConnectionParams::default()
        };
        Negotiator {
            config,
            transport,
            leading,
            session,
            conn,
            seen: HashSet::new(),
            auth_methods: vec!["None".to_string()],
            awaiting: Vec::new(),
            optional: Vec::new(),
            offered: Vec::new(),
            mrdsl_declared: false,
        }
    }

    /// The AuthMethod values the target accepts ("None", "CHAP"); the default is "None".
    pub fn set_auth_methods<S: Into<String>>(&mut self, methods: impl IntoIterator<Item = S>) {
        self.auth_methods = methods.into_iter().map(Into::into).collect();
    }

    pub fn session(&self) -> &SessionParams {
        &self.session
    }

    pub fn connection(&self) -> &ConnectionParams {
        &self.conn
    }

    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The AuthMethod chosen, if AuthMethod was negotiated.
    pub fn auth_method(&self) -> Option<&str> {
        self.conn.auth_method.as_deref()
    }

    /// Start a new Text negotiation in full feature phase: keys may be sent again.
    pub fn begin_text_negotiation(&mut self) {
        self.seen.clear();
        self.awaiting.clear();
        self.optional.clear();
    }

    /// Answer one complete key list (all PDUs of a C sequence). CHAP_* keys and
    /// SendTargets are not answered here: the caller routes them (authenticator, discovery).
    pub fn respond(
        &mut self,
        phase: KeyPhase,
        pairs: &[(String, String)],
    ) -> Result<Pairs, NegotiationError> {
        let mut out: Pairs = Vec::new();
        let mut first_burst_answer: Option<usize> = None;
        for (key, value) in pairs {
            let Some(def) = lookup(key) else {
                // RFC 7143 §6.2: unknown keys, extensions included.
                out.push((key.clone(), Special::NotUnderstood.as_str().to_string()));
                continue;
            };
            if let Some(i) = self.awaiting.iter().position(|o| o.key == def.name) {
                // The initiator answering one of our offers (RFC 7143 §6.2).
                self.awaiting.remove(i);
                self.seen.insert(def.name.to_string());
                self.take_answer(def, value);
                continue;
            }
            if let Some(i) = self.optional.iter().position(|o| o.key == def.name) {
                // An answer we did not need; the offer already decided the outcome.
                self.optional.remove(i);
                self.seen.insert(def.name.to_string());
                continue;
            }
            if !self.seen.insert(def.name.to_string()) && !REDECLARABLE.contains(&def.name) {
                return Err(NegotiationError::Duplicate(def.name.to_string()));
            }
            match self.answer(phase, def, value)? {
                Answer::Value(v) => {
                    if def.name == "FirstBurstLength" {
                        first_burst_answer = Some(out.len());
                    }
                    out.push((def.name.to_string(), v));
                }
                Answer::Special(s) => out.push((def.name.to_string(), s.as_str().to_string())),
                Answer::Silent => {}
            }
            if def.name == "MaxRecvDataSegmentLength" && phase != KeyPhase::FullFeature {
                out.extend(self.declarations());
            }
        }
        // RFC 7143 §13.14: FirstBurstLength MUST NOT exceed MaxBurstLength. Our answer may
        // go lower than offered (Minimum), so clamp it in place. If the initiator has not
        // sent FirstBurstLength at all, [`Self::offers`] offers the lower value instead.
        if self.session.first_burst_length > self.session.max_burst_length
            && self.seen.contains("FirstBurstLength")
        {
            self.session.first_burst_length = self.session.max_burst_length;
            if let Some(slot) = first_burst_answer.and_then(|i| out.get_mut(i)) {
                slot.1 = self.session.first_burst_length.to_string();
            }
        }
        Ok(out)
    }

    /// Declarations the target still owes: its MaxRecvDataSegmentLength (RFC 7143 §13.12,
    /// declarative per direction; also sent on iSER, where it is not used, RFC 7145 §6.2).
    pub fn declarations(&mut self) -> Pairs {
        if self.mrdsl_declared {
            return Vec::new();
        }
        self.mrdsl_declared = true;
        vec![(
            "MaxRecvDataSegmentLength".to_string(),
            self.config.max_recv_data_segment_length.to_string(),
        )]
    }

    /// Offers due in the first Login Response of the operational stage, whatever the initiator
    /// asked for: RDMAExtensions=Yes on the leading connection of a normal session over iSER
    /// (RFC 7145 §6.3: the target offers it in the first Login Response it may, the one
    /// answering the first complete key list, C=0, of the LoginOperationalNegotiation stage).
    /// Call with every operational-stage response; each key is offered once, unless the
    /// initiator sent it first (Linux ib_iser does: it is then answered, not offered).
    pub fn operational_offers(&mut self) -> Pairs {
        let mut out: Pairs = Vec::new();
        let key = "RDMAExtensions";
        if self.transport == Transport::Iser
            && self.leading
            && self.session.session_type == SessionType::Normal
            && !self.seen.contains(key)
            && !self.offered.contains(&key)
        {
            self.awaiting.push(Offer { key });
            self.offered.push(key);
            out.push((key.into(), "Yes".into()));
        }
        out
    }

    /// Keys the target offers because the initiator did not, and the default would be wrong
    /// for the target. Call each time the initiator asks to leave operational negotiation;
    /// each key is offered at most once. Offers whose outcome the offer itself decides (AND with No,
    /// RFC 7143 §6.2.2) take effect at once; the others wait for [`Self::awaiting_answers`].
    pub fn offers(&mut self) -> Pairs {
        let mut out: Pairs = Vec::new();
        let normal_leading = self.session.session_type == SessionType::Normal && self.leading;
        let unseen = |s: &Self, k: &str| !s.seen.contains(k) && !s.offered.contains(&k);
        if normal_leading {
            if !self.config.immediate_data && unseen(self, "ImmediateData") {
                // AND with No: decided by the offer, the answer is optional.
                self.session.immediate_data = false;
                self.optional.push(Offer {
                    key: "ImmediateData",
                });
                out.push(("ImmediateData".into(), "No".into()));
            }
            if self.config.max_burst_length < self.session.max_burst_length
                && unseen(self, "MaxBurstLength")
            {
                self.session.max_burst_length = self.config.max_burst_length;
                self.awaiting.push(Offer {
                    key: "MaxBurstLength",
                });
                out.push((
                    "MaxBurstLength".into(),
                    self.config.max_burst_length.to_string(),
                ));
            }
            let first = self
                .config
                .first_burst_length
                .min(self.session.max_burst_length);
            if first < self.session.first_burst_length && unseen(self, "FirstBurstLength") {
                self.session.first_burst_length = first;
                self.awaiting.push(Offer {
                    key: "FirstBurstLength",
                });
                out.push(("FirstBurstLength".into(), first.to_string()));
            }
        }
        // Normally offered already, in the first operational-stage response.
        out.extend(self.operational_offers());
        if self.transport == Transport::Tcp {
            for (key, policy) in [
                ("HeaderDigest", self.config.header_digest),
                ("DataDigest", self.config.data_digest),
            ] {
                if policy == DigestPolicy::Required && unseen(self, key) {
                    self.awaiting.push(Offer { key });
                    out.push((key.into(), "CRC32C".into()));
                }
            }
        }
        // Each key once; a later call may still add keys that an answer made necessary
        // (MaxBurstLength answered below the default FirstBurstLength).
        for (key, _) in &out {
            if let Some(def) = lookup(key) {
                if !self.offered.contains(&def.name) {
                    self.offered.push(def.name);
                }
            }
        }
        out
    }

    /// True while an offer of the target has not been answered: login must not end yet.
    pub fn awaiting_answers(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// Final checks before full feature phase.
    pub fn finish(&mut self) -> Result<(), NegotiationError> {
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
        }
        if self.transport == Transport::Tcp {
            if self.config.header_digest == DigestPolicy::Required && !self.conn.header_digest {
                return Err(NegotiationError::DigestRequired("HeaderDigest"));
            }
            if self.config.data_digest == DigestPolicy::Required && !self.conn.data_digest {
                return Err(NegotiationError::DigestRequired("DataDigest"));
            }
        }
        // An iSER connection cannot fall back to streaming mode on IB/RoCE (RFC 7145 §5.1);
        // discovery sessions are fine without iSER (iser-wire.md).
        if self.transport == Transport::Iser
            && self.leading
            && self.session.session_type == SessionType::Normal
            && !self.session.rdma_extensions
        {
            return Err(NegotiationError::RdmaExtensionsRequired);
        }
        Ok(())
    }
}

mod keys;

#[cfg(test)]
mod tests;
