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

use crate::params::{
    lookup, ConnectionParams, KeyDef, ResultFn, SessionParams, SessionType, TaskReporting, Use,
    ValueType,
};
use crate::pdu::{Stage, MAX_AHS_LENGTH};
use crate::text::{encode_bool, parse_bool, parse_list, parse_number, special, Pairs, Special};

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

    // ---- one key ----

    fn answer(
        &mut self,
        phase: KeyPhase,
        def: &'static KeyDef,
        value: &str,
    ) -> Result<Answer, NegotiationError> {
        // When the key may be sent (RFC 7143 §13 "Use").
        match def.use_ {
            Use::Security if phase != KeyPhase::Security => {
                return Err(NegotiationError::SecurityKeyOutOfStage(
                    def.name.to_string(),
                ));
            }
            Use::FullFeatureOnly if phase != KeyPhase::FullFeature => {
                return Ok(Answer::Special(Special::Reject))
            }
            Use::LeadingOnly | Use::InitializeOnly if phase == KeyPhase::FullFeature => {
                return Ok(Answer::Special(Special::Reject));
            }
            _ => {}
        }
        if def.result == ResultFn::External {
            return Ok(Answer::Silent);
        }
        // Keys only a target may send (TargetAlias, TargetAddress, TargetPortalGroupTag).
        if def.senders == crate::params::Senders::Target {
            return Ok(Answer::Special(Special::Reject));
        }
        // The constants are answers, never offers: nothing to negotiate.
        if special(value).is_some() {
            return Ok(Answer::Silent);
        }
        if (def.irrelevant_in_discovery && self.session.session_type == SessionType::Discovery)
            || (def.iser_only && self.transport == Transport::Tcp)
            || (def.use_ == Use::LeadingOnly && !self.leading)
        {
            return Ok(Answer::Special(Special::Irrelevant));
        }
        if let ResultFn::Obsolete(v) = def.result {
            return Ok(Answer::Value(v.to_string()));
        }
        let reject = Answer::Special(Special::Reject);
        let answer = match def.name {
            "HeaderDigest" | "DataDigest" => {
                let policy = if def.name == "HeaderDigest" {
                    self.config.header_digest
                } else {
                    self.config.data_digest
                };
                // RFC 7145 §6.1: no digests with iSER.
                let crc_ok = self.transport == Transport::Tcp && policy != DigestPolicy::Off;
                let none_ok = self.transport == Transport::Iser || policy != DigestPolicy::Required;
                // RFC 7143 §6.2.1: the first offered value we support; unknown ones ignored.
                match parse_list(value)
                    .find(|v| (*v == "CRC32C" && crc_ok) || (*v == "None" && none_ok))
                {
                    Some(v) => {
                        let on = v == "CRC32C";
                        if def.name == "HeaderDigest" {
                            self.conn.header_digest = on;
                        } else {
                            self.conn.data_digest = on;
                        }
                        Answer::Value(v.to_string())
                    }
                    None => reject,
                }
            }
            "AuthMethod" => {
                match parse_list(value).find(|v| self.auth_methods.iter().any(|m| m == v)) {
                    Some(v) => {
                        self.conn.auth_method = Some(v.to_string());
                        Answer::Value(v.to_string())
                    }
                    None => reject,
                }
            }
            "TaskReporting" => match parse_list(value).find(|v| *v == "RFC3720") {
                Some(v) => {
                    self.session.task_reporting = TaskReporting::Rfc3720;
                    Answer::Value(v.to_string())
                }
                None => reject,
            },
            "SessionType" => {
                // Read by the login state machine before negotiation starts; a value it
                // did not accept never gets here.
                if SessionType::parse(value).is_none() {
                    reject
                } else {
                    Answer::Silent
                }
            }
            "InitiatorName" => {
                self.session.initiator_name = value.to_string();
                Answer::Silent
            }
            "InitiatorAlias" => {
                self.session.initiator_alias = Some(value.to_string());
                Answer::Silent
            }
            "TargetName" => {
                self.session.target_name = Some(value.to_string());
                Answer::Silent
            }
            "MaxRecvDataSegmentLength" => match number(def, value) {
                Some(v) => {
                    self.conn.max_send_data_segment_length = v as u32;
                    Answer::Silent
                }
                None => reject,
            },
            _ => match def.value {
                ValueType::Boolean => match parse_bool(value) {
                    Ok(offered) => {
                        Answer::Value(encode_bool(self.boolean(def, offered)).to_string())
                    }
                    Err(_) => reject,
                },
                ValueType::Numeric { .. } | ValueType::NumericOrZero { .. } => {
                    match number(def, value) {
                        Some(offered) => Answer::Value(self.numeric(def, offered).to_string()),
                        None => reject,
                    }
                }
                _ => reject,
            },
        };
        Ok(answer)
    }

    /// Boolean keys: compute, store and return the result.
    fn boolean(&mut self, def: &KeyDef, offered: bool) -> bool {
        let (ours, slot): (bool, &mut bool) = match def.name {
            "InitialR2T" => (self.config.initial_r2t, &mut self.session.initial_r2t),
            "ImmediateData" => (self.config.immediate_data, &mut self.session.immediate_data),
            "DataPDUInOrder" => (
                self.config.data_pdu_in_order,
                &mut self.session.data_pdu_in_order,
            ),
            "DataSequenceInOrder" => (
                self.config.data_sequence_in_order,
                &mut self.session.data_sequence_in_order,
            ),
            "RDMAExtensions" => (
                self.transport == Transport::Iser,
                &mut self.session.rdma_extensions,
            ),
            "TaggedBufferForSolicitedDataOnly" => (
                false,
                &mut self.session.tagged_buffer_for_solicited_data_only,
            ),
            "iSERHelloRequired" => (false, &mut self.session.iser_hello_required),
            _ => return offered,
        };
        let result = match def.result {
            ResultFn::And => offered && ours,
            ResultFn::Or => offered || ours,
            _ => offered,
        };
        *slot = result;
        result
    }

    /// Numeric keys: compute, store and return the result.
    fn numeric(&mut self, def: &KeyDef, offered: u64) -> u64 {
        let ours: u64 = match def.name {
            "MaxConnections" => self.config.max_connections.into(),
            "MaxBurstLength" => self.config.max_burst_length.into(),
            "FirstBurstLength" => self.config.first_burst_length.into(),
            "DefaultTime2Wait" => self.config.default_time2wait.into(),
            "DefaultTime2Retain" => self.config.default_time2retain.into(),
            "MaxOutstandingR2T" => self.config.max_outstanding_r2t.into(),
            "ErrorRecoveryLevel" => self.config.error_recovery_level.into(),
            "iSCSIProtocolLevel" => 1,
            "TargetRecvDataSegmentLength" => self.config.target_recv_data_segment_length.into(),
            // what the target may send: the initiator's limit is the only one
            "InitiatorRecvDataSegmentLength" => offered,
            "MaxOutstandingUnexpectedPDUs" => self.config.max_outstanding_unexpected_pdus.into(),
            "MaxAHSLength" => self.config.max_ahs_length.into(),
            _ => offered,
        };
        let result = match def.result {
            ResultFn::Min => offered.min(ours),
            ResultFn::Max => offered.max(ours),
            // RFC 7145 §6.5: 0 means no limit.
            ResultFn::MinOrZero => match (offered, ours) {
                (0, x) | (x, 0) => x,
                (a, b) => a.min(b),
            },
            _ => offered,
        };
        self.store_numeric(def.name, result);
        result
    }

    fn store_numeric(&mut self, name: &str, v: u64) {
        let s = &mut self.session;
        let c = &mut self.conn;
        // Values were range-checked against the table, so these conversions cannot truncate.
        let v16 = u16::try_from(v).unwrap_or(u16::MAX);
        let v32 = u32::try_from(v).unwrap_or(u32::MAX);
        match name {
            "MaxConnections" => s.max_connections = v16,
            "MaxBurstLength" => s.max_burst_length = v32,
            "FirstBurstLength" => s.first_burst_length = v32,
            "DefaultTime2Wait" => s.default_time2wait = v16,
            "DefaultTime2Retain" => s.default_time2retain = v16,
            "MaxOutstandingR2T" => s.max_outstanding_r2t = v16,
            "ErrorRecoveryLevel" => s.error_recovery_level = u8::try_from(v).unwrap_or(0),
            "iSCSIProtocolLevel" => s.iscsi_protocol_level = u8::try_from(v).unwrap_or(1),
            "TargetRecvDataSegmentLength" => c.target_recv_data_segment_length = v32,
            "InitiatorRecvDataSegmentLength" => c.initiator_recv_data_segment_length = v32,
            "MaxOutstandingUnexpectedPDUs" => s.max_outstanding_unexpected_pdus = v32,
            "MaxAHSLength" => s.max_ahs_length = v16,
            _ => {}
        }
    }

    /// The initiator's answer to one of our offers.
    fn take_answer(&mut self, def: &'static KeyDef, value: &str) {
        match def.name {
            "HeaderDigest" => self.conn.header_digest = value == "CRC32C",
            "DataDigest" => self.conn.data_digest = value == "CRC32C",
            "RDMAExtensions" => self.session.rdma_extensions = value == "Yes",
            _ => {
                // Min keys: the answer may only be lower than our offer; anything else
                // (Reject, garbage, higher) leaves our offered value in place.
                if let Some(v) = number(def, value) {
                    let current = match def.name {
                        "MaxBurstLength" => u64::from(self.session.max_burst_length),
                        "FirstBurstLength" => u64::from(self.session.first_burst_length),
                        _ => v,
                    };
                    self.store_numeric(def.name, v.min(current));
                }
            }
        }
    }
}

/// A number within the key's range, or None (answered Reject).
fn number(def: &KeyDef, value: &str) -> Option<u64> {
    let v = parse_number(value).ok()?;
    match def.value {
        ValueType::Numeric { min, max } => (min..=max).contains(&v).then_some(v),
        ValueType::NumericOrZero { min, max } => (v == 0 || (min..=max).contains(&v)).then_some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Pairs {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn get<'a>(out: &'a Pairs, key: &str) -> Option<&'a str> {
        out.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn normal() -> Negotiator {
        Negotiator::new(
            TargetConfig::default(),
            Transport::Tcp,
            SessionType::Normal,
            true,
            None,
        )
    }

    #[test]
    fn linux_initiator_operational_keys() {
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("HeaderDigest", "None"),
                    ("DataDigest", "None"),
                    ("MaxRecvDataSegmentLength", "262144"),
                    ("InitialR2T", "No"),
                    ("ImmediateData", "Yes"),
                    ("MaxBurstLength", "16776192"),
                    ("FirstBurstLength", "262144"),
                    ("DefaultTime2Wait", "0"),
                    ("DefaultTime2Retain", "0"),
                    ("MaxOutstandingR2T", "1"),
                    ("DataPDUInOrder", "Yes"),
                    ("DataSequenceInOrder", "Yes"),
                    ("ErrorRecoveryLevel", "0"),
                    ("MaxConnections", "1"),
                    ("IFMarker", "No"),
                    ("OFMarker", "No"),
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "HeaderDigest"), Some("None"));
        // OR: our Yes wins
        assert_eq!(get(&out, "InitialR2T"), Some("Yes"));
        // AND
        assert_eq!(get(&out, "ImmediateData"), Some("Yes"));
        // Min
        assert_eq!(get(&out, "MaxBurstLength"), Some("1048576"));
        assert_eq!(get(&out, "FirstBurstLength"), Some("65536"));
        // Max
        assert_eq!(get(&out, "DefaultTime2Wait"), Some("2"));
        assert_eq!(get(&out, "DefaultTime2Retain"), Some("0"));
        assert_eq!(get(&out, "MaxConnections"), Some("1"));
        // markers: obsolete, answered No (RFC 7143 §6.2 allows No, forbids NotUnderstood)
        assert_eq!(get(&out, "IFMarker"), Some("No"));
        // declarative: the initiator's value is not echoed, ours is declared once
        assert_eq!(get(&out, "MaxRecvDataSegmentLength"), Some("262144"));
        assert_eq!(
            out.iter()
                .filter(|(k, _)| k == "MaxRecvDataSegmentLength")
                .count(),
            1
        );
        let s = n.session();
        assert!(s.initial_r2t && s.immediate_data);
        assert_eq!(
            (s.max_burst_length, s.first_burst_length),
            (1_048_576, 65_536)
        );
        assert_eq!(n.connection().max_send_data_segment_length, 262_144);
        assert_eq!(n.connection().max_recv_data_segment_length, 262_144);
        assert!(n.declarations().is_empty());
        assert!(n.offers().is_empty());
        assert!(n.finish().is_ok());
    }

    #[test]
    fn every_result_function() {
        let cfg = TargetConfig {
            initial_r2t: false,
            immediate_data: false,
            max_burst_length: 65536,
            default_time2wait: 5,
            ..TargetConfig::default()
        };
        let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("InitialR2T", "No"),          // OR(No, No) = No
                    ("ImmediateData", "Yes"),      // AND(Yes, No) = No
                    ("MaxBurstLength", "131072"),  // Min
                    ("DefaultTime2Wait", "1"),     // Max
                    ("DataDigest", "CRC32C,None"), // list selection: first we support
                    ("TaskReporting", "FastAbort,RFC3720"),
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "InitialR2T"), Some("No"));
        assert_eq!(get(&out, "ImmediateData"), Some("No"));
        assert_eq!(get(&out, "MaxBurstLength"), Some("65536"));
        assert_eq!(get(&out, "DefaultTime2Wait"), Some("5"));
        assert_eq!(get(&out, "DataDigest"), Some("CRC32C"));
        assert_eq!(get(&out, "TaskReporting"), Some("RFC3720"));
        assert!(n.connection().data_digest);
        assert!(!n.session().initial_r2t && !n.session().immediate_data);
        assert_eq!(n.session().max_unsolicited_data(), 65536);
    }

    #[test]
    fn not_understood_reject_and_irrelevant() {
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("X-com.example.Foo", "1"),
                    ("FancyNewKey", "Yes"),
                    ("MaxBurstLength", "100"),         // below 512
                    ("FirstBurstLength", "0x1000000"), // 2^24: above the range
                    ("ErrorRecoveryLevel", "3"),
                    ("InitialR2T", "Maybe"),
                    ("HeaderDigest", "MD5"),
                    ("OFMarkInt", "2048~8192"),
                    ("TargetRecvDataSegmentLength", "65536"), // iSER key on TCP
                    ("TargetAlias", "me"),                    // target-only key
                    ("SendTargets", "All"),                   // full feature only
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "X-com.example.Foo"), Some("NotUnderstood"));
        assert_eq!(get(&out, "FancyNewKey"), Some("NotUnderstood"));
        for k in [
            "MaxBurstLength",
            "FirstBurstLength",
            "ErrorRecoveryLevel",
            "InitialR2T",
            "HeaderDigest",
            "OFMarkInt",
        ] {
            assert_eq!(get(&out, k), Some("Reject"), "{k}");
        }
        assert_eq!(get(&out, "TargetRecvDataSegmentLength"), Some("Irrelevant"));
        assert_eq!(get(&out, "TargetAlias"), Some("Reject"));
        assert_eq!(get(&out, "SendTargets"), Some("Reject"));
        // rejected keys keep their defaults
        assert_eq!(n.session().max_burst_length, 262_144);
        assert_eq!(n.session().error_recovery_level, 0);
    }

    #[test]
    fn duplicates_are_protocol_errors() {
        let mut n = normal();
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxBurstLength", "65536")]),
        )
        .unwrap();
        assert_eq!(
            n.respond(
                KeyPhase::Operational,
                &pairs(&[("MaxBurstLength", "65536")])
            ),
            Err(NegotiationError::Duplicate("MaxBurstLength".into()))
        );
        let mut n = normal();
        assert!(n
            .respond(
                KeyPhase::Operational,
                &pairs(&[("ImmediateData", "Yes"), ("ImmediateData", "No")])
            )
            .is_err());
        // re-declarations allowed
        let mut n = normal();
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxRecvDataSegmentLength", "8192")]),
        )
        .unwrap();
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxRecvDataSegmentLength", "16384")]),
        )
        .unwrap();
        assert_eq!(n.connection().max_send_data_segment_length, 16384);
        // a new text negotiation in FFP starts afresh
        n.begin_text_negotiation();
        n.respond(
            KeyPhase::FullFeature,
            &pairs(&[("MaxRecvDataSegmentLength", "4096")]),
        )
        .unwrap();
    }

    #[test]
    fn first_burst_never_exceeds_max_burst() {
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[("FirstBurstLength", "65536"), ("MaxBurstLength", "16384")]),
            )
            .unwrap();
        assert_eq!(get(&out, "MaxBurstLength"), Some("16384"));
        assert_eq!(get(&out, "FirstBurstLength"), Some("16384"));
        assert_eq!(n.session().first_burst_length, 16384);
        // MaxBurstLength lowered, FirstBurstLength not offered: the target offers it
        let mut n = normal();
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxBurstLength", "16384")]),
        )
        .unwrap();
        let offers = n.offers();
        assert_eq!(get(&offers, "FirstBurstLength"), Some("16384"));
        assert!(n.awaiting_answers());
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("FirstBurstLength", "8192")]),
        )
        .unwrap();
        assert!(!n.awaiting_answers());
        assert_eq!(n.session().first_burst_length, 8192);
    }

    #[test]
    fn discovery_session_irrelevant_keys() {
        let mut n = Negotiator::new(
            TargetConfig::default(),
            Transport::Tcp,
            SessionType::Discovery,
            true,
            None,
        );
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("HeaderDigest", "None"),
                    ("MaxBurstLength", "65536"),
                    ("InitialR2T", "No"),
                    ("DataSequenceInOrder", "Yes"),
                    ("MaxConnections", "1"),
                    ("RDMAExtensions", "Yes"),
                    ("ErrorRecoveryLevel", "0"),
                    ("DefaultTime2Wait", "2"),
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "HeaderDigest"), Some("None"));
        for k in [
            "MaxBurstLength",
            "InitialR2T",
            "DataSequenceInOrder",
            "MaxConnections",
            "RDMAExtensions",
        ] {
            assert_eq!(get(&out, k), Some("Irrelevant"), "{k}");
        }
        assert_eq!(get(&out, "ErrorRecoveryLevel"), Some("0"));
        assert_eq!(get(&out, "DefaultTime2Wait"), Some("2"));
        assert!(n.offers().is_empty());
    }

    #[test]
    fn leading_only_keys_on_a_second_connection() {
        let existing = SessionParams {
            max_burst_length: 65536,
            ..SessionParams::default()
        };
        let mut n = Negotiator::new(
            TargetConfig::default(),
            Transport::Tcp,
            SessionType::Normal,
            false,
            Some(existing),
        );
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[("MaxBurstLength", "4096"), ("HeaderDigest", "CRC32C")]),
            )
            .unwrap();
        assert_eq!(get(&out, "MaxBurstLength"), Some("Irrelevant"));
        assert_eq!(get(&out, "HeaderDigest"), Some("CRC32C"));
        assert_eq!(n.session().max_burst_length, 65536);
    }

    #[test]
    fn iser_keys_and_digests() {
        let cfg = TargetConfig {
            target_recv_data_segment_length: 16384,
            ..TargetConfig::default()
        };
        let mut n = Negotiator::new(cfg, Transport::Iser, SessionType::Normal, true, None);
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("RDMAExtensions", "Yes"),
                    ("HeaderDigest", "CRC32C,None"),
                    ("DataDigest", "CRC32C"),
                    ("TargetRecvDataSegmentLength", "262144"),
                    ("InitiatorRecvDataSegmentLength", "262144"),
                    ("MaxOutstandingUnexpectedPDUs", "0"),
                    ("MaxRecvDataSegmentLength", "262144"),
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "RDMAExtensions"), Some("Yes"));
        // RFC 7145 §6.1: digests are None under iSER
        assert_eq!(get(&out, "HeaderDigest"), Some("None"));
        assert_eq!(get(&out, "DataDigest"), Some("Reject"));
        assert_eq!(get(&out, "TargetRecvDataSegmentLength"), Some("16384"));
        assert_eq!(get(&out, "InitiatorRecvDataSegmentLength"), Some("262144"));
        // the initiator's "no limit" meets the target's real one (the receive ring)
        assert_eq!(get(&out, "MaxOutstandingUnexpectedPDUs"), Some("144"));
        // MaxRecvDataSegmentLength is still declared but the iSER keys rule
        assert_eq!(get(&out, "MaxRecvDataSegmentLength"), Some("262144"));
        let c = n.connection();
        assert!(!c.header_digest && !c.data_digest);
        assert!(n.session().rdma_extensions);
        assert_eq!(c.recv_limit(true), 16384);
        assert_eq!(c.send_limit(true), 262_144);
        assert!(n.finish().is_ok());
    }

    #[test]
    fn max_outstanding_unexpected_pdus_is_the_receive_ring() {
        assert_eq!(TargetConfig::default().max_outstanding_unexpected_pdus, 128 + 16);
        assert_eq!(iser_max_outstanding_unexpected_pdus(256), 272);
        let cfg = TargetConfig {
            queue_depth: 256,
            max_outstanding_unexpected_pdus: iser_max_outstanding_unexpected_pdus(256),
            ..TargetConfig::default()
        };
        let answer = |offer: &str| {
            let mut n = Negotiator::new(cfg.clone(), Transport::Iser, SessionType::Normal, true, None);
            let out = n.respond(KeyPhase::Operational, &pairs(&[("MaxOutstandingUnexpectedPDUs", offer)])).unwrap();
            (get(&out, "MaxOutstandingUnexpectedPDUs").map(str::to_owned), n.session().max_outstanding_unexpected_pdus)
        };
        // RFC 7145 §6.7: 0 is "no limit"; the target's real limit is never 0
        assert_eq!(answer("0"), (Some("272".into()), 272));
        assert_eq!(answer("100000"), (Some("272".into()), 272));
        assert_eq!(answer("8"), (Some("8".into()), 8));
        assert_eq!(answer("1").0.as_deref(), Some("Reject"));
        // not declared to an initiator that does not send it (open-iscsi refuses unknown keys)
        let mut n = Negotiator::new(cfg.clone(), Transport::Iser, SessionType::Normal, true, None);
        n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
        let all: Pairs = n.offers().into_iter().chain(n.declarations()).collect();
        assert_eq!(get(&all, "MaxOutstandingUnexpectedPDUs"), None);
    }

    #[test]
    fn iser_connection_offers_rdma_extensions() {
        let mut n = Negotiator::new(
            TargetConfig::default(),
            Transport::Iser,
            SessionType::Normal,
            true,
            None,
        );
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("MaxOutstandingUnexpectedPDUs", "8")]),
        )
        .unwrap();
        assert_eq!(n.session().max_outstanding_unexpected_pdus, 8);
        let offers = n.offers();
        assert_eq!(get(&offers, "RDMAExtensions"), Some("Yes"));
        assert!(n.awaiting_answers());
        n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "No")]))
            .unwrap();
        assert_eq!(n.finish(), Err(NegotiationError::RdmaExtensionsRequired));
        // the other way round
        let mut n = Negotiator::new(
            TargetConfig::default(),
            Transport::Iser,
            SessionType::Normal,
            true,
            None,
        );
        n.offers();
        n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")]))
            .unwrap();
        assert!(n.finish().is_ok());
        // RDMAExtensions=Yes offered on TCP is answered No
        let mut n = normal();
        let out = n
            .respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")]))
            .unwrap();
        assert_eq!(get(&out, "RDMAExtensions"), Some("No"));
    }

    #[test]
    fn rdma_extensions_is_an_operational_offer_on_iser() {
        let iser = |session_type, leading| {
            Negotiator::new(TargetConfig::default(), Transport::Iser, session_type, leading, None)
        };
        let mut n = iser(SessionType::Normal, true);
        n.respond(KeyPhase::Operational, &pairs(&[("MaxBurstLength", "65536")])).unwrap();
        assert_eq!(n.operational_offers(), pairs(&[("RDMAExtensions", "Yes")]));
        assert!(n.awaiting_answers());
        assert!(n.operational_offers().is_empty(), "offered once");
        assert_eq!(get(&n.offers(), "RDMAExtensions"), None);
        n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
        assert!(!n.awaiting_answers() && n.session().rdma_extensions);
        // the initiator offered it first: answered, not offered
        let mut n = iser(SessionType::Normal, true);
        n.respond(KeyPhase::Operational, &pairs(&[("RDMAExtensions", "Yes")])).unwrap();
        assert!(n.operational_offers().is_empty());
        // not in discovery sessions, on added connections or on TCP
        assert!(iser(SessionType::Discovery, true).operational_offers().is_empty());
        assert!(iser(SessionType::Normal, false).operational_offers().is_empty());
        assert!(normal().operational_offers().is_empty());
    }

    #[test]
    fn target_offers_when_defaults_are_wrong() {
        let cfg = TargetConfig {
            immediate_data: false,
            max_burst_length: 131072,
            first_burst_length: 16384,
            header_digest: DigestPolicy::Required,
            ..TargetConfig::default()
        };
        let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
        n.respond(
            KeyPhase::Operational,
            &pairs(&[("ErrorRecoveryLevel", "0")]),
        )
        .unwrap();
        let offers = n.offers();
        assert_eq!(get(&offers, "ImmediateData"), Some("No"));
        assert_eq!(get(&offers, "MaxBurstLength"), Some("131072"));
        assert_eq!(get(&offers, "FirstBurstLength"), Some("16384"));
        assert_eq!(get(&offers, "HeaderDigest"), Some("CRC32C"));
        assert!(n.offers().is_empty(), "offered once");
        assert!(!n.session().immediate_data);
        assert!(n.awaiting_answers());
        n.respond(
            KeyPhase::Operational,
            &pairs(&[
                ("MaxBurstLength", "65536"),
                ("FirstBurstLength", "16384"),
                ("HeaderDigest", "CRC32C"),
            ]),
        )
        .unwrap();
        assert!(!n.awaiting_answers());
        assert_eq!(n.session().max_burst_length, 65536);
        assert!(n.connection().header_digest);
        assert!(n.finish().is_ok());
    }

    #[test]
    fn required_digest_refused() {
        let cfg = TargetConfig {
            data_digest: DigestPolicy::Required,
            ..TargetConfig::default()
        };
        let mut n = Negotiator::new(cfg, Transport::Tcp, SessionType::Normal, true, None);
        let out = n
            .respond(KeyPhase::Operational, &pairs(&[("DataDigest", "None")]))
            .unwrap();
        assert_eq!(get(&out, "DataDigest"), Some("Reject"));
        assert_eq!(
            n.finish(),
            Err(NegotiationError::DigestRequired("DataDigest"))
        );
    }

    #[test]
    fn security_keys_and_phases() {
        let mut n = normal();
        n.set_auth_methods(["CHAP", "None"]);
        let out = n
            .respond(
                KeyPhase::Security,
                &pairs(&[
                    ("InitiatorName", "iqn.1994-05.com.redhat:abc"),
                    ("SessionType", "Normal"),
                    ("TargetName", "iqn.2016-06.io.spdk:disk1"),
                    ("AuthMethod", "KRB5,CHAP,None"),
                    ("CHAP_A", "5"),
                ]),
            )
            .unwrap();
        assert_eq!(out, pairs(&[("AuthMethod", "CHAP")]));
        assert_eq!(n.auth_method(), Some("CHAP"));
        assert_eq!(n.session().initiator_name, "iqn.1994-05.com.redhat:abc");
        assert_eq!(
            n.session().target_name.as_deref(),
            Some("iqn.2016-06.io.spdk:disk1")
        );
        // no acceptable method
        let mut n = normal();
        let out = n
            .respond(KeyPhase::Security, &pairs(&[("AuthMethod", "CHAP")]))
            .unwrap();
        assert_eq!(get(&out, "AuthMethod"), Some("Reject"));
        // security keys in the operational stage
        let mut n = normal();
        assert_eq!(
            n.respond(KeyPhase::Operational, &pairs(&[("AuthMethod", "None")])),
            Err(NegotiationError::SecurityKeyOutOfStage("AuthMethod".into()))
        );
        // login-only keys in full feature phase are rejected
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::FullFeature,
                &pairs(&[("MaxBurstLength", "4096"), ("HeaderDigest", "None")]),
            )
            .unwrap();
        assert_eq!(
            out,
            pairs(&[("MaxBurstLength", "Reject"), ("HeaderDigest", "Reject")])
        );
    }

    #[test]
    fn numbers_in_every_encoding() {
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[
                    ("MaxBurstLength", "0x10000"),
                    ("FirstBurstLength", "0bAAEAAA=="),
                ]),
            )
            .unwrap();
        assert_eq!(get(&out, "MaxBurstLength"), Some("65536"));
        assert_eq!(get(&out, "FirstBurstLength"), Some("65536"));
    }

    #[test]
    fn special_values_as_offers_are_ignored() {
        let mut n = normal();
        let out = n
            .respond(
                KeyPhase::Operational,
                &pairs(&[("MaxBurstLength", "Irrelevant")]),
            )
            .unwrap();
        assert!(out.is_empty());
    }
}
