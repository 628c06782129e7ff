//! riser-iscsi: the iSCSI layer of riser, sans IO (RFC 7143, plus the iSER keys of RFC 7145).
//!
//! Nothing here touches a socket, a queue pair or a clock: bytes and PDUs go in, PDUs and
//! events come out, and every protocol corner is a deterministic unit test (the quinn-proto
//! split; RFC 5047 calls the layer below the datamover). The same code serves TCP and iSER.
//!
//! Where each piece is:
//!
//! | module | what |
//! |---|---|
//! | [`serial`] | `Sn` (CmdSN, StatSN, ... with RFC 1982 serial arithmetic), `Itt`, `Ttt` |
//! | [`pdu`] | the 48-byte BHS of every opcode as typed structs, AHS, `Pdu` encode/decode (TCP stream form with padding and digests; iSER message form) |
//! | [`digest`] | CRC32C header and data digests |
//! | [`framer`] | incremental TCP byte-stream reader: limits, digests, errors that say whether the connection survives |
//! | [`text`] | key=value text, C-bit assembly with caps, value types (numbers, booleans, lists, binary) |
//! | [`params`] | the table of every login/text key, `SessionParams`, `ConnectionParams` |
//! | [`negotiate`] | the target-side negotiator (`Negotiator`, `TargetConfig`) |
//! | [`chap`] | CHAP (RFC 7143 §12.1.3): `ChapTarget` (an `Authenticator`), `ChapInitiator`, the algorithms and encodings |
//! | [`login`] | the target-side login state machine of one connection (`Login`, `LoginPolicy`, `Authenticator`) |
//! | [`ffp`] | full feature phase: the connection/session state machine, the Datamover trait, `connection_config` |
//! | `testing` | builders of common PDU headers for tests (feature `test-util`) |
//!
//! A connection's life: feed bytes to a [`Framer`] (TCP) or decode each received message
//! with [`Pdu::decode_message`] (iSER); give Login Requests to a [`Login`] until it reports
//! [`LoginEvent::Complete`]; switch the framer to the negotiated digests and limits; hand the
//! [`LoginOutcome`] to the full feature phase.
#![forbid(unsafe_code)]

pub mod chap;
pub mod digest;
pub mod ffp;
pub mod framer;
pub mod login;
pub mod negotiate;
pub mod params;
pub mod pdu;
pub mod serial;
pub mod text;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

pub use framer::{ErrorAction, FrameError, Framer, FramerLimits};
pub use login::{
    AuthPolicy, AuthStep, Authenticator, Login, LoginContext, LoginEvent, LoginIdentity,
    LoginLimits, LoginOutcome, LoginOutput, LoginPolicy, SessionDecision, TargetInfo, TargetLookup,
};
pub use negotiate::{
    DigestPolicy, KeyPhase, NegotiationError, Negotiator, TargetConfig, Transport,
};
pub use params::{ConnectionParams, SessionParams, SessionType};
pub use pdu::{Bhs, Digests, LoginStatus, Op, Opcode, Pdu, PduError, RejectReason};
pub use serial::{Itt, Sn, Ttt};
pub use text::{Pairs, TextAssembler, TextError};
