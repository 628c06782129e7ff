//! The iSER header (RFC 7145 §9): `IserHeader::parse` on a received message, then, for a
//! control-type message, the PDU after it as the iSER datamover decodes it.
//!
//! Input: one received RDMA Send message (28-byte iSER header, then BHS, AHS, data).
//!
//! Checks: a parsed header writes back to a header that parses the same; the PDU behind it
//! passes the codec checks ([`crate::codec::check`]).

use riser_datamover::iser::header::{IserHeader, ISER_HDR_LEN};
use riser_iscsi::Pdu;

/// The datamover's default TargetRecvDataSegmentLength (RFC 7145 §6.2).
const TARGET_RECV_DSL: usize = 8192;

pub fn run(msg: &[u8]) {
    let Ok(h) = IserHeader::parse(msg) else {
        return;
    };
    let mut out = [0u8; ISER_HDR_LEN];
    h.write(&mut out);
    assert_eq!(IserHeader::parse(&out), Ok(h), "iSER header write/parse round trip");
    let _ = format!("{h:?}");
    if let IserHeader::Control { .. } = h {
        let rest = msg.get(ISER_HDR_LEN..).unwrap_or_default();
        if let Ok(pdu) = Pdu::decode_message(rest, TARGET_RECV_DSL) {
            assert!(pdu.data.len() <= TARGET_RECV_DSL);
            crate::codec::check(&pdu, TARGET_RECV_DSL);
        }
    }
}
