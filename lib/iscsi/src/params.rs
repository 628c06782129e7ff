//! The login/text keys of RFC 7143 §13 (and §12 for AuthMethod and CHAP) plus the iSER
//! keys of RFC 7145 §6, and the values a session and a connection end up with.
//!
//! [`KEYS`] is the table the negotiator ([`crate::negotiate`]) works from: for each key its
//! use (when it may be sent), senders, scope, value type and range, result function and
//! default. [`SessionParams`] and [`ConnectionParams`] hold the outcome, starting at the
//! RFC defaults.

use crate::framer::FramerLimits;
use crate::pdu::{Digests, MAX_AHS_LENGTH};

/// When a key may be sent (the "Use" line of RFC 7143 §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// IO: only during the login of a connection.
    InitializeOnly,
    /// LO: only during the login of the leading connection.
    LeadingOnly,
    /// ALL: login and full feature phase (Text).
    All,
    /// FFPO: only in full feature phase (Text), e.g. SendTargets.
    FullFeatureOnly,
    /// Only in the SecurityNegotiation stage (RFC 7143 §6.3.1, §12): AuthMethod, CHAP_*.
    Security,
}

/// Who may send the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Senders {
    Initiator,
    Target,
    Both,
}

/// Session-wide (SW) or connection-only (CO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Session,
    Connection,
}

/// The admissible values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Boolean,
    /// numerical-value-from-min-to-max
    Numeric {
        min: u64,
        max: u64,
    },
    /// 0 or min..=max (RFC 7145 MaxOutstandingUnexpectedPDUs: 0 means no limit)
    NumericOrZero {
        min: u64,
        max: u64,
    },
    /// One value or a list of these (list-of-values, selection)
    List(&'static [&'static str]),
    /// Free text: names, aliases, addresses
    Text,
    /// Binary or text handled elsewhere (CHAP)
    Opaque,
}

/// How the outcome is computed (RFC 7143 §6.2 and each key's "Result function").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFn {
    Min,
    Max,
    And,
    Or,
    /// Minimum where 0 means "no limit" (RFC 7145 MaxOutstandingUnexpectedPDUs).
    MinOrZero,
    /// The responder picks the first offered value it supports (RFC 7143 §6.2.1).
    ListSelection,
    /// Declared, not negotiated: no answer (RFC 7143 §6.1 "declarative").
    Declarative,
    /// Not negotiated by the key table: the authenticator (CHAP_*) or the FFP text layer
    /// (SendTargets) handles it.
    External,
    /// Obsolete key (RFC 7143 §6.2, markers): answered with a fixed value.
    Obsolete(&'static str),
}

/// One key of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    pub name: &'static str,
    pub use_: Use,
    pub senders: Senders,
    pub scope: Scope,
    /// "Irrelevant when: SessionType=Discovery".
    pub irrelevant_in_discovery: bool,
    /// "Irrelevant when: RDMAExtensions=No" (RFC 7145 §6).
    pub iser_only: bool,
    pub value: ValueType,
    pub result: ResultFn,
    pub default: &'static str,
}

const MAX_24: u64 = (1 << 24) - 1;
const YES_NO: ValueType = ValueType::Boolean;

#[allow(clippy::too_many_arguments)] // one row of the RFC table
const fn key(
    name: &'static str,
    use_: Use,
    senders: Senders,
    scope: Scope,
    irrelevant_in_discovery: bool,
    value: ValueType,
    result: ResultFn,
    default: &'static str,
) -> KeyDef {
    KeyDef {
        name,
        use_,
        senders,
        scope,
        irrelevant_in_discovery,
        iser_only: false,
        value,
        result,
        default,
    }
}

const fn iser(mut k: KeyDef) -> KeyDef {
    k.iser_only = true;
    k
}

use ResultFn as R;
use Scope::{Connection as CO, Session as SW};
use Senders::{Both, Initiator, Target};
use Use::{All, FullFeatureOnly as FFO, InitializeOnly as IO, LeadingOnly as LO, Security as SEC};

/// Every key riser knows. Anything else is answered `NotUnderstood` (RFC 7143 §6.2).
pub static KEYS: &[KeyDef] = &[
    // RFC 7143 §13.1
    key(
        "HeaderDigest",
        IO,
        Both,
        CO,
        false,
        ValueType::List(&["CRC32C", "None"]),
        R::ListSelection,
        "None",
    ),
    key(
        "DataDigest",
        IO,
        Both,
        CO,
        false,
        ValueType::List(&["CRC32C", "None"]),
        R::ListSelection,
        "None",
    ),
    // §13.2
    key(
        "MaxConnections",
        LO,
        Both,
        SW,
        true,
        ValueType::Numeric { min: 1, max: 65535 },
        R::Min,
        "1",
    ),
    // §13.3: a request answered by the FFP text layer, not negotiated
    key(
        "SendTargets",
        FFO,
        Initiator,
        SW,
        false,
        ValueType::Text,
        R::External,
        "",
    ),
    // §13.4 - §13.9: declarations
    key(
        "TargetName",
        IO,
        Initiator,
        SW,
        false,
        ValueType::Text,
        R::Declarative,
        "",
    ),
    key(
        "InitiatorName",
        IO,
        Initiator,
        SW,
        false,
        ValueType::Text,
        R::Declarative,
        "",
    ),
    key(
        "TargetAlias",
        All,
        Target,
        SW,
        false,
        ValueType::Text,
        R::Declarative,
        "",
    ),
    key(
        "InitiatorAlias",
        All,
        Initiator,
        SW,
        false,
        ValueType::Text,
        R::Declarative,
        "",
    ),
    key(
        "TargetAddress",
        All,
        Target,
        SW,
        false,
        ValueType::Text,
        R::Declarative,
        "",
    ),
    key(
        "TargetPortalGroupTag",
        IO,
        Target,
        SW,
        false,
        ValueType::Numeric { min: 0, max: 65535 },
        R::Declarative,
        "",
    ),
    // §13.10 - §13.20
    key("InitialR2T", LO, Both, SW, true, YES_NO, R::Or, "Yes"),
    key("ImmediateData", LO, Both, SW, true, YES_NO, R::And, "Yes"),
    key(
        "MaxRecvDataSegmentLength",
        All,
        Both,
        CO,
        false,
        ValueType::Numeric {
            min: 512,
            max: MAX_24,
        },
        R::Declarative,
        "8192",
    ),
    key(
        "MaxBurstLength",
        LO,
        Both,
        SW,
        true,
        ValueType::Numeric {
            min: 512,
            max: MAX_24,
        },
        R::Min,
        "262144",
    ),
    key(
        "FirstBurstLength",
        LO,
        Both,
        SW,
        true,
        ValueType::Numeric {
            min: 512,
            max: MAX_24,
        },
        R::Min,
        "65536",
    ),
    key(
        "DefaultTime2Wait",
        LO,
        Both,
        SW,
        false,
        ValueType::Numeric { min: 0, max: 3600 },
        R::Max,
        "2",
    ),
    key(
        "DefaultTime2Retain",
        LO,
        Both,
        SW,
        false,
        ValueType::Numeric { min: 0, max: 3600 },
        R::Min,
        "20",
    ),
    key(
        "MaxOutstandingR2T",
        LO,
        Both,
        SW,
        true,
        ValueType::Numeric { min: 1, max: 65535 },
        R::Min,
        "1",
    ),
    key("DataPDUInOrder", LO, Both, SW, true, YES_NO, R::Or, "Yes"),
    key(
        "DataSequenceInOrder",
        LO,
        Both,
        SW,
        true,
        YES_NO,
        R::Or,
        "Yes",
    ),
    key(
        "ErrorRecoveryLevel",
        LO,
        Both,
        SW,
        false,
        ValueType::Numeric { min: 0, max: 2 },
        R::Min,
        "0",
    ),
    // §13.21
    key(
        "SessionType",
        LO,
        Initiator,
        SW,
        false,
        ValueType::List(&["Discovery", "Normal"]),
        R::Declarative,
        "Normal",
    ),
    // §13.23, §13.24
    key(
        "TaskReporting",
        LO,
        Both,
        SW,
        true,
        ValueType::List(&["RFC3720", "ResponseFence", "FastAbort"]),
        R::ListSelection,
        "RFC3720",
    ),
    key(
        "iSCSIProtocolLevel",
        LO,
        Both,
        SW,
        false,
        ValueType::Numeric { min: 0, max: 31 },
        R::Min,
        "1",
    ),
    // §12: security
    key(
        "AuthMethod",
        SEC,
        Both,
        CO,
        false,
        ValueType::List(&["None", "CHAP", "KRB5", "SRP", "SPKM1", "SPKM2"]),
        R::ListSelection,
        "None",
    ),
    key(
        "CHAP_A",
        SEC,
        Both,
        CO,
        false,
        ValueType::Opaque,
        R::External,
        "",
    ),
    key(
        "CHAP_I",
        SEC,
        Both,
        CO,
        false,
        ValueType::Opaque,
        R::External,
        "",
    ),
    key(
        "CHAP_C",
        SEC,
        Both,
        CO,
        false,
        ValueType::Opaque,
        R::External,
        "",
    ),
    key(
        "CHAP_N",
        SEC,
        Both,
        CO,
        false,
        ValueType::Opaque,
        R::External,
        "",
    ),
    key(
        "CHAP_R",
        SEC,
        Both,
        CO,
        false,
        ValueType::Opaque,
        R::External,
        "",
    ),
    // §13.25 / §6.2: obsolete marker keys. OFMarker/IFMarker SHOULD get Reject and MAY get
    // No, never NotUnderstood; we answer No like the Linux target, the choice that RFC 3720
    // initiators accept. OFMarkInt/IFMarkInt MUST get Reject.
    key(
        "OFMarker",
        IO,
        Both,
        CO,
        false,
        YES_NO,
        R::Obsolete("No"),
        "No",
    ),
    key(
        "IFMarker",
        IO,
        Both,
        CO,
        false,
        YES_NO,
        R::Obsolete("No"),
        "No",
    ),
    key(
        "OFMarkInt",
        IO,
        Both,
        CO,
        false,
        ValueType::Text,
        R::Obsolete("Reject"),
        "",
    ),
    key(
        "IFMarkInt",
        IO,
        Both,
        CO,
        false,
        ValueType::Text,
        R::Obsolete("Reject"),
        "",
    ),
    // RFC 7145 §6.1 - §6.8 (iSER)
    key("RDMAExtensions", LO, Both, SW, true, YES_NO, R::And, "No"),
    iser(key(
        "TargetRecvDataSegmentLength",
        IO,
        Both,
        CO,
        false,
        ValueType::Numeric {
            min: 512,
            max: MAX_24,
        },
        R::Min,
        "8192",
    )),
    iser(key(
        "InitiatorRecvDataSegmentLength",
        IO,
        Both,
        CO,
        false,
        ValueType::Numeric {
            min: 512,
            max: MAX_24,
        },
        R::Min,
        "8192",
    )),
    iser(key(
        "MaxOutstandingUnexpectedPDUs",
        LO,
        Both,
        SW,
        false,
        ValueType::NumericOrZero {
            min: 2,
            max: u32::MAX as u64,
        },
        R::MinOrZero,
        "0",
    )),
    // (check) RFC 7145 §6.6 - §6.8: defaults and result functions as we read them; Linux
    // never sends these. With our own value "No", OR returns the initiator's value.
    iser(key(
        "MaxAHSLength",
        LO,
        Both,
        SW,
        true,
        ValueType::Numeric { min: 2, max: 65535 },
        R::Min,
        "256",
    )),
    iser(key(
        "TaggedBufferForSolicitedDataOnly",
        LO,
        Initiator,
        SW,
        true,
        YES_NO,
        R::Or,
        "No",
    )),
    iser(key(
        "iSERHelloRequired",
        LO,
        Initiator,
        SW,
        true,
        YES_NO,
        R::Or,
        "No",
    )),
];

/// Look a key up by its exact (case-sensitive) name.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|k| k.name == name)
}

/// Private or public extension keys (`X-...`, `X#...`, RFC 7143 §6.1): riser
/// implements none, so they are answered `NotUnderstood`.
pub fn is_extension_key(name: &str) -> bool {
    name.starts_with("X-") || name.starts_with("X#")
}

/// SessionType (RFC 7143 §13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    Discovery,
    #[default]
    Normal,
}

impl SessionType {
    pub fn parse(s: &str) -> Option<SessionType> {
        match s {
            "Discovery" => Some(SessionType::Discovery),
            "Normal" => Some(SessionType::Normal),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Discovery => "Discovery",
            SessionType::Normal => "Normal",
        }
    }
}

/// TaskReporting (RFC 7143 §13.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskReporting {
    #[default]
    Rfc3720,
    ResponseFence,
    FastAbort,
}

impl TaskReporting {
    pub fn parse(s: &str) -> Option<TaskReporting> {
        match s {
            "RFC3720" => Some(TaskReporting::Rfc3720),
            "ResponseFence" => Some(TaskReporting::ResponseFence),
            "FastAbort" => Some(TaskReporting::FastAbort),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskReporting::Rfc3720 => "RFC3720",
            TaskReporting::ResponseFence => "ResponseFence",
            TaskReporting::FastAbort => "FastAbort",
        }
    }
}

/// Session-wide results (SW keys), RFC defaults until negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// None for discovery sessions.
    pub target_name: Option<String>,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub task_reporting: TaskReporting,
    pub iscsi_protocol_level: u8,
    /// RFC 7145: the session uses the iSER datamover.
    pub rdma_extensions: bool,
    /// 0: no limit.
    pub max_outstanding_unexpected_pdus: u32,
    pub max_ahs_length: u16,
    pub tagged_buffer_for_solicited_data_only: bool,
    pub iser_hello_required: bool,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: TaskReporting::Rfc3720,
            iscsi_protocol_level: 1,
            rdma_extensions: false,
            max_outstanding_unexpected_pdus: 0,
            max_ahs_length: 256,
            tagged_buffer_for_solicited_data_only: false,
            iser_hello_required: false,
        }
    }
}

impl SessionParams {
    /// Largest unsolicited data (immediate plus unsolicited Data-Out) a write may carry:
    /// none when InitialR2T=Yes and ImmediateData=No (RFC 7143 §13.14).
    pub fn max_unsolicited_data(&self) -> u32 {
        if self.initial_r2t && !self.immediate_data {
            0
        } else {
            self.first_burst_length
        }
    }
}

/// Connection-only results (CO keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    /// What the target declared it receives (RFC 7143 §13.12): the framer's limit.
    pub max_recv_data_segment_length: u32,
    /// What the initiator declared it receives: the most the target may send per PDU.
    pub max_send_data_segment_length: u32,
    /// RFC 7145 §6.2: largest control-type data segment the target accepts over iSER.
    pub target_recv_data_segment_length: u32,
    /// RFC 7145 §6.3: largest control-type data segment the initiator accepts over iSER.
    pub initiator_recv_data_segment_length: u32,
    /// The AuthMethod chosen (None when none was negotiated).
    pub auth_method: Option<String>,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 8192,
            target_recv_data_segment_length: 8192,
            initiator_recv_data_segment_length: 8192,
            auth_method: None,
        }
    }
}

impl ConnectionParams {
    pub fn digests(&self) -> Digests {
        Digests {
            header: self.header_digest,
            data: self.data_digest,
        }
    }

    /// Limits for the TCP framer once in full feature phase.
    pub fn framer_limits(&self) -> FramerLimits {
        FramerLimits {
            max_recv_data_segment_length: self.max_recv_data_segment_length as usize,
            max_ahs_length: MAX_AHS_LENGTH,
        }
    }

    /// Largest data segment the target accepts per PDU on this connection: with
    /// RDMAExtensions=Yes the iSER key replaces MaxRecvDataSegmentLength (RFC 7145 §6.2).
    pub fn recv_limit(&self, rdma_extensions: bool) -> u32 {
        if rdma_extensions {
            self.target_recv_data_segment_length
        } else {
            self.max_recv_data_segment_length
        }
    }

    /// Largest data segment the target may send per PDU on this connection.
    pub fn send_limit(&self, rdma_extensions: bool) -> u32 {
        if rdma_extensions {
            self.initiator_recv_data_segment_length
        } else {
            self.max_send_data_segment_length
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, k) in KEYS.iter().enumerate() {
            assert!(
                KEYS.iter().skip(i + 1).all(|o| o.name != k.name),
                "duplicate {}",
                k.name
            );
            assert!(k.name.len() <= 63);
            if let ValueType::Numeric { min, max } = k.value {
                assert!(min <= max);
                if !k.default.is_empty() {
                    let d: u64 = k.default.parse().unwrap();
                    assert!(d >= min && d <= max, "{} default out of range", k.name);
                }
            }
            if k.value == ValueType::Boolean {
                assert!(k.default == "Yes" || k.default == "No", "{}", k.name);
            }
        }
    }

    #[test]
    fn defaults_match_the_table() {
        let s = SessionParams::default();
        let num = |n: &str| lookup(n).unwrap().default.parse::<u64>().unwrap();
        let yes = |n: &str| lookup(n).unwrap().default == "Yes";
        assert_eq!(u64::from(s.max_connections), num("MaxConnections"));
        assert_eq!(u64::from(s.max_burst_length), num("MaxBurstLength"));
        assert_eq!(u64::from(s.first_burst_length), num("FirstBurstLength"));
        assert_eq!(u64::from(s.default_time2wait), num("DefaultTime2Wait"));
        assert_eq!(u64::from(s.default_time2retain), num("DefaultTime2Retain"));
        assert_eq!(u64::from(s.max_outstanding_r2t), num("MaxOutstandingR2T"));
        assert_eq!(u64::from(s.error_recovery_level), num("ErrorRecoveryLevel"));
        assert_eq!(u64::from(s.iscsi_protocol_level), num("iSCSIProtocolLevel"));
        assert_eq!(s.initial_r2t, yes("InitialR2T"));
        assert_eq!(s.immediate_data, yes("ImmediateData"));
        assert_eq!(s.data_pdu_in_order, yes("DataPDUInOrder"));
        assert_eq!(s.rdma_extensions, yes("RDMAExtensions"));
        let c = ConnectionParams::default();
        assert_eq!(
            u64::from(c.max_recv_data_segment_length),
            num("MaxRecvDataSegmentLength")
        );
        assert_eq!(
            u64::from(c.target_recv_data_segment_length),
            num("TargetRecvDataSegmentLength")
        );
    }

    #[test]
    fn unsolicited_data_rule() {
        let mut s = SessionParams::default();
        assert_eq!(s.max_unsolicited_data(), 65_536);
        s.immediate_data = false;
        assert_eq!(s.max_unsolicited_data(), 0);
    }

    #[test]
    fn iser_limits_replace_mrdsl() {
        let c = ConnectionParams {
            max_recv_data_segment_length: 262_144,
            target_recv_data_segment_length: 4096,
            ..ConnectionParams::default()
        };
        assert_eq!(c.recv_limit(false), 262_144);
        assert_eq!(c.recv_limit(true), 4096);
        assert!(is_extension_key("X-com.example.foo"));
        assert!(lookup("headerdigest").is_none());
    }
}
