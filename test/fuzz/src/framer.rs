//! The TCP PDU framer: `Framer::feed` / `next_pdu`, with and without digests.
//!
//! Input: `mode`, `limits`, then the byte stream an initiator sends.
//! - `mode` bit 0: header digest, bit 1: data digest, bit 2: write the right CRC32Cs into
//!   the stream first ([`crate::fix_digests`]), bit 3: feed exactly `bytes_needed()` at a
//!   time instead of random chunks; bits 4-7 seed the chunk sizes.
//! - `limits` bits 0-2 pick MaxRecvDataSegmentLength, bits 3-4 the AHS limit.
//!
//! Checks: the stream gives the same PDUs and errors fed whole and fed in pieces; every
//! PDU respects the limits; once an error says drop, only `Failed` follows; `bytes_needed`
//! is at least 1 while nothing is ready.

use riser_iscsi::pdu::MAX_AHS_LENGTH;
use riser_iscsi::{Digests, FrameError, Framer, FramerLimits, Pdu};

const MRDSL: [usize; 8] = [8192, 0, 1, 512, 4096, 65_536, 262_144, (1 << 24) - 1];
const AHS: [usize; 4] = [MAX_AHS_LENGTH, 0, 16, 256];

pub fn run(data: &[u8]) {
    let mut data = data;
    let mode = crate::take_u8(&mut data);
    let lim = crate::take_u8(&mut data);
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    let mut stream = data.to_vec();
    if mode & 4 != 0 {
        crate::fix_digests(&mut stream, digests);
    }
    let limits = FramerLimits {
        max_recv_data_segment_length: MRDSL[usize::from(lim & 7)],
        max_ahs_length: AHS[usize::from((lim >> 3) & 3)],
    };

    let whole = frame(&stream, digests, limits, Feed::Whole);
    let feed = if mode & 8 != 0 {
        Feed::Needed
    } else {
        Feed::Random(u64::from(mode >> 4))
    };
    let pieces = frame(&stream, digests, limits, feed);
    assert_eq!(whole, pieces, "fed whole and in pieces, the stream framed differently");
}

#[derive(Clone, Copy)]
enum Feed {
    Whole,
    Random(u64),
    Needed,
}

/// Everything `next_pdu` said that was not "need more bytes", in order.
fn frame(stream: &[u8], digests: Digests, limits: FramerLimits, feed: Feed) -> Vec<Result<Pdu, FrameError>> {
    let mut f = Framer::with_limits(limits);
    f.set_digests(digests);
    let mut out = Vec::new();
    let mut rest = stream;
    let mut rng = crate::Rng::new(match feed {
        Feed::Random(s) => s,
        _ => 0,
    });
    let mut dropped = false;
    loop {
        // Take every PDU the bytes so far make.
        loop {
            match f.next_pdu() {
                Ok(Some(pdu)) => {
                    assert!(!dropped, "a PDU after an error that drops the connection");
                    check_pdu(&pdu, limits);
                    out.push(Ok(pdu));
                }
                Ok(None) => {
                    assert!(!dropped, "Ok(None) after an error that drops the connection");
                    assert!(f.bytes_needed() >= 1, "nothing ready yet no byte needed");
                    break;
                }
                Err(FrameError::Failed) => {
                    assert!(dropped, "Failed without an earlier error that drops");
                    return out;
                }
                Err(e) => {
                    assert!(!dropped, "{e} after an error that drops the connection");
                    if let Some(h) = e.header() {
                        // The quoted header is the peer's first 48 bytes of that PDU.
                        assert_eq!(h.len(), riser_iscsi::pdu::BHS_LEN);
                    }
                    if !e.connection_can_continue() {
                        dropped = true;
                    }
                    out.push(Err(e));
                }
            }
        }
        if rest.is_empty() {
            return out;
        }
        let n = match feed {
            Feed::Whole => rest.len(),
            Feed::Random(_) => rng.chunk(97),
            Feed::Needed => f.bytes_needed(),
        };
        let (piece, tail) = rest.split_at(n.min(rest.len()));
        f.feed(piece);
        rest = tail;
    }
}

fn check_pdu(pdu: &Pdu, limits: FramerLimits) {
    assert!(pdu.data.len() <= limits.max_recv_data_segment_length);
    assert!(pdu.ahs.len() <= limits.max_ahs_length);
    assert_eq!(pdu.data.len(), pdu.bhs.data_segment_length as usize);
    assert_eq!(pdu.ahs.len(), usize::from(pdu.bhs.total_ahs_length) * 4);
}
