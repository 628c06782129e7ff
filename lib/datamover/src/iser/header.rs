//! The iSER header: 28 bytes in front of every control-type PDU (RFC 7145 §9.1), and the
//! Hello / HelloReply messages (§9.2, §9.3; iWARP only, never required on IB/RoCE).

use std::fmt;

use thiserror::Error;

pub const ISER_HDR_LEN: usize = 28;
/// Hello and HelloReply are 12 bytes (RFC 7145 §9): opcode, versions, IRD / ORD,
/// and 8 reserved bytes; no iSCSI PDU follows.
pub const HELLO_LEN: usize = 12;
/// The iSER version of RFC 5046 / RFC 7145, as MaxVer, MinVer and CurVer carry it (the
/// Wireshark dissector accepts a Hello / HelloReply only with both nibbles 10).
pub const ISER_VERSION: u8 = 10;
/// Opcode nibble (byte 0, high 4 bits).
pub const OP_CONTROL: u8 = 0x1;
pub const OP_HELLO: u8 = 0x2;
pub const OP_HELLO_REPLY: u8 = 0x3;
/// Byte 0 flag: the Write STag / Base Offset are valid (the target may RDMA-Read).
pub const FLAG_WSV: u8 = 0x08;
/// Byte 0 flag: the Read STag / Base Offset are valid (the target may RDMA-Write).
pub const FLAG_RSV: u8 = 0x04;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IserHeaderError {
    #[error("message of {0} bytes is shorter than the 28-byte iSER header")]
    Short(usize),
    #[error("unknown iSER opcode {0:#x}")]
    UnknownOpcode(u8),
}

/// An STag: the key under which a peer lets its buffer be RDMA-Read or -Written (on IB and
/// RoCE, the remote key of a memory region). A type of its own so it is never taken for a
/// local key, a work request id or any other u32 on the way to a work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stag(pub u32);

impl Stag {
    /// The key as the wire and the verbs carry it.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl From<u32> for Stag {
    fn from(v: u32) -> Stag {
        Stag(v)
    }
}

impl From<Stag> for u32 {
    fn from(s: Stag) -> u32 {
        s.0
    }
}

impl fmt::Display for Stag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A tagged buffer the initiator advertised: STag (rkey) and base offset (virtual address).
///
/// `stag` stays a plain u32 because riser-perf builds these from its memory regions' rkeys;
/// the datamover reads it through [`TaggedBuffer::stag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TaggedBuffer {
    pub stag: u32,
    pub base_offset: u64,
}

impl TaggedBuffer {
    pub fn new(stag: Stag, base_offset: u64) -> TaggedBuffer {
        TaggedBuffer { stag: stag.get(), base_offset }
    }

    /// The buffer's STag.
    pub fn stag(&self) -> Stag {
        Stag(self.stag)
    }
}

/// What an iSER header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IserHeader {
    /// A control-type PDU follows; the tagged buffers are present when their flags are set.
    Control { write: Option<TaggedBuffer>, read: Option<TaggedBuffer> },
    /// Hello (initiator → target): version range and the initiator's IRD.
    Hello { max_ver: u8, min_ver: u8, ird: u16 },
    /// HelloReply (target → initiator).
    HelloReply { reject: bool, max_ver: u8, cur_ver: u8, ord: u16 },
}

impl IserHeader {
    /// Parses the header of a received message: 28 bytes for a control-type PDU, 12 for a
    /// Hello or HelloReply.
    pub fn parse(msg: &[u8]) -> Result<IserHeader, IserHeaderError> {
        let need = match msg.first().map(|b| b >> 4) {
            Some(OP_HELLO | OP_HELLO_REPLY) => HELLO_LEN,
            _ => ISER_HDR_LEN,
        };
        if msg.len() < need {
            return Err(IserHeaderError::Short(msg.len()));
        }
        let mut h = [0u8; ISER_HDR_LEN];
        let n = msg.len().min(ISER_HDR_LEN);
        h[..n].copy_from_slice(&msg[..n]);
        let be32 = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let be64 = |o: usize| ((be32(o) as u64) << 32) | be32(o + 4) as u64;
        match h[0] >> 4 {
            OP_CONTROL => Ok(IserHeader::Control {
                write: (h[0] & FLAG_WSV != 0).then(|| TaggedBuffer { stag: be32(4), base_offset: be64(8) }),
                read: (h[0] & FLAG_RSV != 0).then(|| TaggedBuffer { stag: be32(16), base_offset: be64(20) }),
            }),
            OP_HELLO => Ok(IserHeader::Hello { max_ver: h[1] >> 4, min_ver: h[1] & 0x0f, ird: u16::from_be_bytes([h[2], h[3]]) }),
            OP_HELLO_REPLY => Ok(IserHeader::HelloReply {
                reject: h[0] & 1 != 0,
                max_ver: h[1] >> 4,
                cur_ver: h[1] & 0x0f,
                ord: u16::from_be_bytes([h[2], h[3]]),
            }),
            op => Err(IserHeaderError::UnknownOpcode(op)),
        }
    }

    /// Bytes of this header on the wire: [`ISER_HDR_LEN`], or [`HELLO_LEN`] for a Hello or
    /// HelloReply (which is the whole message).
    pub fn wire_len(&self) -> usize {
        match self {
            IserHeader::Control { .. } => ISER_HDR_LEN,
            IserHeader::Hello { .. } | IserHeader::HelloReply { .. } => HELLO_LEN,
        }
    }

    /// Writes the header into `out[..28]` (a Hello or HelloReply takes the first 12 bytes,
    /// the rest is zero: send `wire_len()` bytes).
    pub fn write(&self, out: &mut [u8; ISER_HDR_LEN]) {
        out.fill(0);
        match *self {
            IserHeader::Control { write, read } => {
                out[0] = OP_CONTROL << 4;
                if let Some(w) = write {
                    out[0] |= FLAG_WSV;
                    out[4..8].copy_from_slice(&w.stag.to_be_bytes());
                    out[8..16].copy_from_slice(&w.base_offset.to_be_bytes());
                }
                if let Some(r) = read {
                    out[0] |= FLAG_RSV;
                    out[16..20].copy_from_slice(&r.stag.to_be_bytes());
                    out[20..28].copy_from_slice(&r.base_offset.to_be_bytes());
                }
            }
            IserHeader::Hello { max_ver, min_ver, ird } => {
                out[0] = OP_HELLO << 4;
                out[1] = (max_ver << 4) | (min_ver & 0x0f);
                out[2..4].copy_from_slice(&ird.to_be_bytes());
            }
            IserHeader::HelloReply { reject, max_ver, cur_ver, ord } => {
                out[0] = (OP_HELLO_REPLY << 4) | reject as u8;
                out[1] = (max_ver << 4) | (cur_ver & 0x0f);
                out[2..4].copy_from_slice(&ord.to_be_bytes());
            }
        }
    }

    /// The header the target puts on everything it sends: control, no tagged buffers.
    pub const TARGET_CONTROL: [u8; ISER_HDR_LEN] = {
        let mut h = [0u8; ISER_HDR_LEN];
        h[0] = OP_CONTROL << 4;
        h
    };
}

/// The private data of the RDMA CM connect request and reply (iser_cm_hdr, as Linux and
/// libiscsi use it): one flags byte and three reserved bytes.
pub mod cm {
    /// Zero-based virtual addresses are not supported by the sender.
    pub const ZBVA_NOT_SUPPORTED: u8 = 0x80;
    /// The sender does not support Send with Invalidate.
    pub const SEND_W_INV_NOT_SUPPORTED: u8 = 0x40;

    /// The flags byte of the peer's private data (0 when absent: both supported).
    pub fn flags(private_data: &[u8]) -> u8 {
        private_data.first().copied().unwrap_or(0)
    }

    /// Whether a connection uses Send with Invalidate: the initiator's private data says it
    /// takes it (present, 0x40 clear: Linux ib_iser with its default per-task registration;
    /// libiscsi always sets 0x40) and the device can post it (`device_capable`: see
    /// [`crate::iser::verbs::supports_send_with_invalidate`]). The same answer goes into
    /// [`reply`] and the datamover's configuration.
    pub fn use_send_with_invalidate(private_data: &[u8], device_capable: bool) -> bool {
        device_capable && private_data.len() >= 4 && flags(private_data) & SEND_W_INV_NOT_SUPPORTED == 0
    }

    /// Private data for our accept.
    pub fn reply(send_with_invalidate: bool) -> [u8; 4] {
        let mut f = ZBVA_NOT_SUPPORTED;
        if !send_with_invalidate {
            f |= SEND_W_INV_NOT_SUPPORTED;
        }
        [f, 0, 0, 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_header_round_trips_with_and_without_stags() {
        let h = IserHeader::Control {
            write: Some(TaggedBuffer { stag: 0x1234_5678, base_offset: 0x0000_7f00_dead_b000 }),
            read: None,
        };
        let mut b = [0u8; ISER_HDR_LEN];
        h.write(&mut b);
        assert_eq!(b[0], 0x18);
        assert_eq!(&b[4..8], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(IserHeader::parse(&b).unwrap(), h);
        let r = IserHeader::Control { write: None, read: Some(TaggedBuffer { stag: 7, base_offset: 9 }) };
        r.write(&mut b);
        assert_eq!(b[0], 0x14);
        assert_eq!(IserHeader::parse(&b).unwrap(), r);
        assert_eq!(IserHeader::parse(&IserHeader::TARGET_CONTROL).unwrap(), IserHeader::Control { write: None, read: None });
    }

    #[test]
    fn a_tagged_buffer_gives_its_stag_typed() {
        let t = TaggedBuffer::new(Stag(0x1234_5678), 0x1000);
        assert_eq!(t, TaggedBuffer { stag: 0x1234_5678, base_offset: 0x1000 });
        assert_eq!(t.stag(), Stag::from(0x1234_5678));
        assert_eq!(u32::from(t.stag()), t.stag().get());
        assert_eq!(t.stag().to_string(), "0x12345678");
    }

    #[test]
    fn stags_are_ignored_unless_flagged() {
        let mut b = [0xffu8; ISER_HDR_LEN];
        b[0] = 0x10;
        assert_eq!(IserHeader::parse(&b).unwrap(), IserHeader::Control { write: None, read: None });
    }

    /// RFC 7145 §9: a Hello is 12 bytes (no iSCSI PDU behind it), and so is the
    /// HelloReply; both parse from 12 bytes.
    #[test]
    fn hello_messages_are_12_bytes() {
        let hello = [0x20, 0xaa, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(IserHeader::parse(&hello), Ok(IserHeader::Hello { max_ver: ISER_VERSION, min_ver: ISER_VERSION, ird: 16 }));
        assert_eq!(IserHeader::parse(&hello[..11]), Err(IserHeaderError::Short(11)));
        let r = IserHeader::HelloReply { reject: false, max_ver: ISER_VERSION, cur_ver: ISER_VERSION, ord: 4 };
        let mut b = [0u8; ISER_HDR_LEN];
        r.write(&mut b);
        assert_eq!(r.wire_len(), HELLO_LEN);
        assert_eq!(&b[..HELLO_LEN], &[0x30, 0xaa, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(IserHeader::parse(&b[..HELLO_LEN]), Ok(r));
        assert_eq!(IserHeader::TARGET_CONTROL.len(), IserHeader::Control { write: None, read: None }.wire_len());
    }

    #[test]
    fn hello_and_errors() {
        let h = IserHeader::Hello { max_ver: 1, min_ver: 1, ird: 16 };
        let mut b = [0u8; ISER_HDR_LEN];
        h.write(&mut b);
        assert_eq!(IserHeader::parse(&b).unwrap(), h);
        let r = IserHeader::HelloReply { reject: true, max_ver: 1, cur_ver: 1, ord: 4 };
        r.write(&mut b);
        assert_eq!(b[0], 0x31);
        assert_eq!(IserHeader::parse(&b).unwrap(), r);
        assert_eq!(IserHeader::parse(&b[..10]), Err(IserHeaderError::Short(10)));
        b[0] = 0x10;
        assert_eq!(IserHeader::parse(&b[..20]), Err(IserHeaderError::Short(20)), "a control header is 28 bytes");
        b[0] = 0x70;
        assert_eq!(IserHeader::parse(&b), Err(IserHeaderError::UnknownOpcode(7)));
        assert_eq!(cm::flags(&[]), 0);
        assert_eq!(cm::reply(false)[0], 0xc0);
        assert_eq!(cm::reply(true)[0], 0x80);
    }

    /// Send with Invalidate needs both the initiator's consent and the device's capability
    /// (it used to be offered on the initiator's word alone).
    #[test]
    fn send_with_invalidate_needs_the_initiator_and_the_device() {
        let linux = [cm::ZBVA_NOT_SUPPORTED, 0, 0, 0];
        let libiscsi = [cm::ZBVA_NOT_SUPPORTED | cm::SEND_W_INV_NOT_SUPPORTED, 0, 0, 0];
        assert!(cm::use_send_with_invalidate(&linux, true));
        assert!(!cm::use_send_with_invalidate(&linux, false), "a device without the memory management extensions");
        assert!(!cm::use_send_with_invalidate(&libiscsi, true));
        assert!(!cm::use_send_with_invalidate(&[], true), "no private data: not");
    }
}
