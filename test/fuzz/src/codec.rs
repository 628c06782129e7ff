//! The PDU codec: `Pdu::decode_message` (the iSER form), `Bhs::parse`, the AHS accessors,
//! and both encodings back.
//!
//! Input: `limit`, then one message-framed PDU (BHS, AHS, data, no padding, no digests).
//! `limit` bits 0-2 pick the largest data segment accepted.
//!
//! Checks: a decoded PDU encodes again (message form and TCP form with every digest
//! combination) and decodes to the same PDU: what the parser keeps, the encoder writes.

use riser_iscsi::pdu::{ahs_segments, Bhs, BHS_LEN, MAX_AHS_LENGTH, MAX_DATA_SEGMENT_LENGTH};
use riser_iscsi::{Digests, Framer, FramerLimits, Pdu};

const LIMITS: [usize; 8] = [8192, 0, 1, 512, 4096, 65_536, 262_144, MAX_DATA_SEGMENT_LENGTH];

pub fn run(data: &[u8]) {
    let mut data = data;
    let limit = LIMITS[usize::from(crate::take_u8(&mut data) & 7)];
    if let Some(raw) = data.get(..BHS_LEN).and_then(|s| <&[u8; BHS_LEN]>::try_from(s).ok()) {
        header_roundtrip(raw);
    }
    let _ = Bhs::parse_slice(data);
    if let Ok(pdu) = Pdu::decode_message(data, limit) {
        assert!(pdu.data.len() <= limit);
        check(&pdu, limit);
    }
}

/// What every decoded PDU must satisfy, wherever it came from (also used by the iSER
/// harness).
pub fn check(pdu: &Pdu, limit: usize) {
    let _ = pdu.cdb();
    let _ = pdu.bidi_read_expected_data_transfer_length();
    let _ = ahs_segments(&pdu.ahs);
    let _ = pdu.opcode();
    let _ = format!("{pdu:?}");

    // Message form: BHS, AHS, data.
    let mut m = Vec::new();
    pdu.encode_message(&mut m).expect("a decoded PDU encodes");
    let again = Pdu::decode_message(&m, limit).expect("a re-encoded PDU decodes");
    assert_eq!(&again, pdu, "message encode/decode round trip");

    // TCP form, each digest combination, through the framer.
    for (header, data) in [(false, false), (true, false), (false, true), (true, true)] {
        let digests = Digests { header, data };
        let bytes = pdu.to_bytes(digests).expect("a decoded PDU encodes for TCP");
        assert_eq!(bytes.len(), pdu.encoded_len(digests));
        let mut f = Framer::with_limits(FramerLimits {
            max_recv_data_segment_length: MAX_DATA_SEGMENT_LENGTH,
            max_ahs_length: MAX_AHS_LENGTH,
        });
        f.set_digests(digests);
        f.feed(&bytes);
        let back = f
            .next_pdu()
            .unwrap_or_else(|e| panic!("{digests:?}: own encoding refused: {e}"))
            .unwrap_or_else(|| panic!("{digests:?}: own encoding incomplete"));
        assert_eq!(&back, pdu, "{digests:?}: TCP encode/frame round trip");
        assert_eq!(f.buffered(), 0);
    }
}

/// Parse, write, parse: the same header.
fn header_roundtrip(raw: &[u8; BHS_LEN]) {
    let Ok(bhs) = Bhs::parse(raw) else {
        return;
    };
    let _ = bhs.opcode();
    let _ = bhs.itt();
    let written = bhs.to_bytes();
    let again = Bhs::parse(&written).expect("a parsed header parses again once written");
    assert_eq!(again, bhs, "header parse/write round trip");
}
