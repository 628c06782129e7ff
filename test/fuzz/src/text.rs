//! Text keys: `parse_pairs`, the C-bit `TextAssembler`, the value parsers, CHAP's binary
//! decoder, the key table and the negotiator answering the pairs.
//!
//! Input: `mode`, then a key=value data segment (NUL separated), as in a Login or Text
//! Request.
//! - `mode` bits 0-3 seed where the text is cut into C=1 PDUs, bit 4: small assembler caps,
//!   bits 5-6: the negotiation phase and session type, bit 7: iSER.
//!
//! Checks: the assembler gives what `parse_pairs` gives for the whole text; encoded pairs
//! parse back to the same pairs; the outbox hands the text back whole, in pieces.

use riser_iscsi::chap::decode_binary;
use riser_iscsi::negotiate::{KeyPhase, Negotiator, TargetConfig, Transport};
use riser_iscsi::params::{lookup, SessionType};
use riser_iscsi::text::{
    encode_pairs, max_value_len, parse_binary, parse_bool, parse_list, parse_number, parse_pairs,
    parse_range, special, TextAssembler, TextOutbox, DEFAULT_MAX_TEXT_BYTES, DEFAULT_MAX_TEXT_PDUS,
};

pub fn run(data: &[u8]) {
    let mut data = data;
    let mode = crate::take_u8(&mut data);
    let text = data;

    let whole = parse_pairs(text);

    // The same text in C=1 pieces.
    let (max_bytes, max_pdus) = if mode & 0x10 != 0 {
        (256, 4)
    } else {
        (DEFAULT_MAX_TEXT_BYTES, DEFAULT_MAX_TEXT_PDUS)
    };
    let mut asm = TextAssembler::new(max_bytes, max_pdus);
    let mut rng = crate::Rng::new(u64::from(mode & 0x0f));
    let mut rest = text;
    let mut pieces = 0usize;
    let assembled = loop {
        let n = rng.chunk(64).min(rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        pieces += 1;
        match asm.push(piece, !rest.is_empty()) {
            Ok(None) => assert!(!rest.is_empty(), "C=0 yet no pairs"),
            Ok(Some(pairs)) => {
                assert!(rest.is_empty(), "pairs before C=0");
                break Ok(pairs);
            }
            Err(e) => {
                assert!(!asm.is_partial(), "the assembler keeps text after an error");
                break Err(e);
            }
        }
    };
    match &assembled {
        Ok(pairs) => {
            assert!(text.len() <= max_bytes && pieces <= max_pdus);
            assert_eq!(Ok(pairs), whole.as_ref(), "assembled in pieces differs from whole");
        }
        Err(_) => {
            let over = text.len() > max_bytes || pieces > max_pdus;
            assert!(over || whole.is_err(), "the assembler refused text parse_pairs takes");
        }
    }

    let Ok(pairs) = whole else {
        return;
    };
    let encoded = encode_pairs(&pairs);
    assert_eq!(parse_pairs(&encoded).as_ref(), Ok(&pairs), "encode/parse round trip");

    let mut outbox = TextOutbox::new(encoded.clone());
    let mut back = Vec::new();
    let mut rng = crate::Rng::new(u64::from(mode));
    while !outbox.is_empty() {
        let (piece, more) = outbox.next_segment(rng.chunk(300) - 1);
        assert!(!piece.is_empty() || encoded.is_empty());
        back.extend_from_slice(&piece);
        assert_eq!(more, !outbox.is_empty());
    }
    assert_eq!(back, encoded, "the outbox lost or reordered text");

    for (key, value) in &pairs {
        assert!(value.len() <= max_value_len(key));
        let _ = lookup(key);
        let _ = special(value);
        let _ = parse_bool(value);
        let _ = parse_range(value);
        let _ = parse_list(value).count();
        if let Ok(n) = parse_number(value) {
            // Plain decimal comes back as written (less leading zeros).
            if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                let digits = value.trim_start_matches('0');
                let expected = if digits.is_empty() { "0" } else { digits };
                assert_eq!(n.to_string(), expected, "decimal {value:?}");
            }
        }
        let _ = parse_binary(value);
        let _ = decode_binary("CHAP_C", value, 1024);
    }

    negotiate(mode, &pairs);
}

fn negotiate(mode: u8, pairs: &[(String, String)]) {
    let (phase, session_type, leading) = match (mode >> 5) & 3 {
        0 => (KeyPhase::Security, SessionType::Normal, true),
        1 => (KeyPhase::Operational, SessionType::Normal, true),
        2 => (KeyPhase::Operational, SessionType::Discovery, true),
        _ => (KeyPhase::FullFeature, SessionType::Normal, false),
    };
    let transport = if mode & 0x80 != 0 {
        Transport::Iser
    } else {
        Transport::Tcp
    };
    let mut n = Negotiator::new(TargetConfig::default(), transport, session_type, leading, None);
    n.set_auth_methods(["CHAP", "None"]);
    if phase == KeyPhase::FullFeature {
        n.begin_text_negotiation();
    }
    if n.respond(phase, pairs).is_err() {
        return;
    }
    let _ = n.offers();
    let _ = n.awaiting_answers();
    // The initiator says the same again (an answer to our offers, or a repeat).
    let _ = n.respond(phase, pairs);
    let _ = n.finish();
    let _ = n.session().max_unsolicited_data();
    let _ = n.connection().framer_limits();
}
