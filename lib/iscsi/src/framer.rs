//! Incremental PDU reader for the TCP byte stream (RFC 7143 §11.1).
//!
//! Feed it whatever the socket gave ([`Framer::feed`]), then take complete PDUs out with
//! [`Framer::next_pdu`] until it says `Ok(None)`. Lengths in a header are checked against
//! the negotiated limits before a single byte of the data segment is waited for, and the
//! buffer only ever holds bytes the peer actually sent: an attacker's DataSegmentLength
//! never turns into an allocation.
//!
//! Digests are switched with [`Framer::set_digests`] between PDUs: the target calls it once
//! it has sent the final Login Response, because digests start with the first PDU of
//! full feature phase (RFC 7143 §13.1). iSER does not use this type: its PDUs arrive one per
//! message ([`crate::pdu::Pdu::decode_message`]).

use crate::digest;
use crate::pdu::{
    padded_len, raw_data_segment_len, raw_total_ahs_len, Bhs, Digests, Pdu, PduError, RejectReason,
    BHS_LEN, DIGEST_LEN, MAX_AHS_LENGTH,
};
use thiserror::Error;

/// MaxRecvDataSegmentLength in force during login (RFC 7143 §13.12: login PDUs carry at
/// most 8192 bytes of data).
pub const LOGIN_MAX_RECV_DATA_SEGMENT_LENGTH: usize = 8192;

/// What the framer accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramerLimits {
    /// The MaxRecvDataSegmentLength this side declared (RFC 7143 §13.12).
    pub max_recv_data_segment_length: usize,
    /// Largest AHS area accepted; at most 1020 bytes (TotalAHSLength is one byte of words).
    pub max_ahs_length: usize,
}

impl FramerLimits {
    /// Limits for the login phase.
    pub const LOGIN: FramerLimits = FramerLimits {
        max_recv_data_segment_length: LOGIN_MAX_RECV_DATA_SEGMENT_LENGTH,
        max_ahs_length: MAX_AHS_LENGTH,
    };
}

impl Default for FramerLimits {
    fn default() -> Self {
        FramerLimits::LOGIN
    }
}

/// What the connection does about a framing error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Send a Reject quoting the header and carry on; the PDU was consumed whole.
    RejectAndContinue(RejectReason),
    /// Send a Reject quoting the header, then drop the connection.
    RejectAndDrop(RejectReason),
    /// Drop the connection: the stream can no longer be trusted.
    Drop,
}

/// A PDU that could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    DataSegmentTooLong {
        len: usize,
        max: usize,
        header: Box<[u8; BHS_LEN]>,
    },
    #[error("AHS of {len} bytes exceeds the limit of {max}")]
    AhsTooLong {
        len: usize,
        max: usize,
        header: Box<[u8; BHS_LEN]>,
    },
    #[error("header digest mismatch: computed {computed:#010x}, received {received:#010x}")]
    HeaderDigest { computed: u32, received: u32 },
    #[error("data digest mismatch: computed {computed:#010x}, received {received:#010x}")]
    DataDigest {
        computed: u32,
        received: u32,
        header: Box<[u8; BHS_LEN]>,
    },
    #[error("malformed header: {error}")]
    Malformed {
        error: PduError,
        header: Box<[u8; BHS_LEN]>,
    },
    #[error("the stream failed earlier; the connection must be dropped")]
    Failed,
}

impl FrameError {
    /// The RFC's answer to each error.
    pub fn action(&self) -> ErrorAction {
        match self {
            // RFC 7143 §7.8: a data digest error leaves framing intact: Reject
            // (Data-Digest-Error), discard the PDU; for data PDUs the task then recovers
            // (recovery R2T) or ends with CHECK CONDITION (ERL 0).
            FrameError::DataDigest { .. } => {
                ErrorAction::RejectAndContinue(RejectReason::DataDigestError)
            }
            // The whole PDU was read: the peer broke a header rule, not the framing.
            FrameError::Malformed { .. } => {
                ErrorAction::RejectAndContinue(RejectReason::ProtocolError)
            }
            // Lengths beyond what we declared are a protocol error (RFC 7143 §13.12); we
            // refuse to read the segment, so the stream cannot be resynchronised.
            FrameError::DataSegmentTooLong { .. } | FrameError::AhsTooLong { .. } => {
                ErrorAction::RejectAndDrop(RejectReason::ProtocolError)
            }
            // RFC 7143 §7.8: after a header digest error the length fields cannot be
            // trusted and there are no markers to find the next PDU: close the connection.
            FrameError::HeaderDigest { .. } | FrameError::Failed => ErrorAction::Drop,
        }
    }

    /// Whether more PDUs may follow on this connection.
    pub fn connection_can_continue(&self) -> bool {
        matches!(self.action(), ErrorAction::RejectAndContinue(_))
    }

    /// The raw header of the offending PDU, for the Reject data segment (RFC 7143 §11.17).
    pub fn header(&self) -> Option<&[u8; BHS_LEN]> {
        match self {
            FrameError::DataSegmentTooLong { header, .. }
            | FrameError::AhsTooLong { header, .. }
            | FrameError::DataDigest { header, .. }
            | FrameError::Malformed { header, .. } => Some(header),
            FrameError::HeaderDigest { .. } | FrameError::Failed => None,
        }
    }
}

/// The byte-stream PDU reader.
#[derive(Debug, Default)]
pub struct Framer {
    /// Received bytes live in `buf[start..end]`; `buf` past `end` is room for more (its
    /// length is only ever grown, so reads land in it without zeroing it again).
    buf: Vec<u8>,
    /// Start of unconsumed bytes in `buf`.
    start: usize,
    /// End of received bytes in `buf`.
    end: usize,
    limits: FramerLimits,
    digests: Digests,
    failed: bool,
    /// Emptied data-segment vectors handed back ([`recycle`](Self::recycle)), reused for
    /// the next PDUs' segments so a steady stream of PDUs allocates nothing.
    spare: Vec<Vec<u8>>,
    /// The data segment being received straight into its destination, if one is.
    direct: Option<Direct>,
    /// Segment bytes the framer copied out of its buffer into a destination (routed or
    /// direct), since [`take_copied`](Self::take_copied) was last called.
    copied: u64,
}

/// A PDU whose header is consumed and whose data segment goes straight from the socket to
/// the destination its reader chose ([`Framer::read_routed`]).
#[derive(Debug)]
struct Direct {
    raw: [u8; BHS_LEN],
    bhs: Bhs,
    dsl: usize,
    /// Segment bytes in the destination so far.
    got: usize,
    /// CRC32C of those bytes (with data digests).
    crc: u32,
    /// The destination went away (its task was aborted): the rest is read and dropped.
    discard: bool,
}

/// Most spare segment vectors a framer keeps.
const MAX_SPARE: usize = 64;

impl Framer {
    /// A framer with login limits and no digests.
    pub fn new() -> Framer {
        Framer::default()
    }

    pub fn with_limits(limits: FramerLimits) -> Framer {
        Framer {
            limits,
            ..Framer::default()
        }
    }

    pub fn limits(&self) -> FramerLimits {
        self.limits
    }

    /// New limits, effective from the next PDU (after login: the declared
    /// MaxRecvDataSegmentLength).
    pub fn set_limits(&mut self, limits: FramerLimits) {
        self.limits = limits;
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Digests for every PDU after the current one (RFC 7143 §13.1: from the first PDU of
    /// full feature phase, after the final Login Response).
    pub fn set_digests(&mut self, digests: Digests) {
        self.digests = digests;
    }

    /// Append bytes received from the peer.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        self.make_room(bytes.len());
        self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Reads from `r` straight into the framer's buffer (one `read`, at least `chunk` bytes
    /// of room, more when the PDU being assembled needs it): no intermediate copy.
    pub fn read_from(&mut self, r: &mut impl std::io::Read, chunk: usize) -> std::io::Result<usize> {
        if self.failed {
            return Ok(0);
        }
        let room = chunk.max(self.bytes_needed().min(self.limits.max_recv_data_segment_length + 2 * BHS_LEN + 1024));
        self.make_room(room);
        // No more than that (the buffer may be larger): a solicited segment whose header
        // this read brings is left in the socket for `read_routed` to receive in place.
        let n = r.read(&mut self.buf[self.end..self.end + room])?;
        self.end += n;
        Ok(n)
    }

    /// Room for `n` more bytes after `end`.
    fn reserve(&mut self, n: usize) {
        if self.buf.len() < self.end + n {
            self.buf.resize(self.end + n, 0);
        }
    }

    /// Takes back a data segment of a PDU this framer returned, once its bytes are used, so
    /// the next segment reuses its memory.
    pub fn recycle(&mut self, mut v: Vec<u8>) {
        if self.spare.len() < MAX_SPARE && v.capacity() > 0 && v.capacity() <= riser_buf::MAX_SPARE_VEC {
            v.clear();
            self.spare.push(v);
        }
    }

    /// Bytes held and not yet returned as PDUs.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// How many more bytes would complete the next PDU, as far as is known now (at least 1
    /// unless a PDU is ready). Lets a caller read exactly what is needed.
    pub fn bytes_needed(&self) -> usize {
        let have = self.buffered();
        if let Some(d) = &self.direct {
            let rest = if d.discard { d.dsl - d.got } else { 0 };
            return (rest + self.segment_tail(d.dsl)).saturating_sub(have).max(1);
        }
        let Some(raw) = self
            .pending()
            .get(..BHS_LEN)
            .and_then(|s| <&[u8; BHS_LEN]>::try_from(s).ok())
        else {
            return BHS_LEN - have;
        };
        let total = self.frame_len(raw);
        total.saturating_sub(have)
    }

    fn pending(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    /// After bytes were consumed: an emptied buffer starts over (no copy). What is left
    /// stays where it is until a read needs the room ([`make_room`](Self::make_room)).
    fn compact(&mut self) {
        if self.start > 0 && self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Room for `n` more bytes after `end`: the unconsumed bytes (usually the start of one
    /// PDU) move to the front only when the room after them is short, so bytes are moved
    /// at most once per read, never the whole of a large read again and again.
    fn make_room(&mut self, n: usize) {
        self.compact();
        if self.start > 0 && self.buf.len() - self.end < n {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        self.reserve(n);
    }

    /// What follows a data segment of `dsl` bytes on the wire: padding, data digest.
    fn segment_tail(&self, dsl: usize) -> usize {
        padded_len(dsl) - dsl + if self.digests.data { DIGEST_LEN } else { 0 }
    }

    /// Segment bytes copied out of the framer's buffer since the last call.
    pub fn take_copied(&mut self) -> u64 {
        std::mem::take(&mut self.copied)
    }

    /// The header and segment length of the PDU whose data segment
    /// [`read_routed`](Self::read_routed) could receive straight into a destination: the
    /// segment being received so, or else the next PDU's if its header has fully arrived
    /// (header digest and limits checked, no AHS) and its segment mostly has not.
    pub fn segment_ahead(&self) -> Option<(Bhs, usize)> {
        if let Some(d) = &self.direct {
            return (!d.discard && d.got < d.dsl).then(|| (d.bhs.clone(), d.dsl));
        }
        self.next_header_for_direct().map(|(_, bhs, dsl)| (bhs, dsl))
    }

    /// Whether a segment received directly is complete and its PDU should be taken out
    /// ([`next_pdu_routed`](Self::next_pdu_routed)) before reading on, so that the next
    /// PDU's segment can go straight to its destination too.
    pub fn segment_done(&self) -> bool {
        self.direct.as_ref().is_some_and(|d| !d.discard && d.got == d.dsl)
    }

    fn next_header_for_direct(&self) -> Option<([u8; BHS_LEN], Bhs, usize)> {
        if self.failed {
            return None;
        }
        let pending = self.pending();
        let raw: [u8; BHS_LEN] = pending.get(..BHS_LEN)?.try_into().ok()?;
        let dsl = raw_data_segment_len(&raw);
        if dsl == 0 || raw_total_ahs_len(&raw) != 0 || dsl > self.limits.max_recv_data_segment_length {
            return None;
        }
        let header_len = self.header_len(&raw);
        let have = pending.len().checked_sub(header_len)?;
        // The whole segment is here: nothing left to receive directly.
        if have >= dsl {
            return None;
        }
        if self.digests.header && digest::crc32c(&raw) != wire_digest(pending.get(BHS_LEN..header_len)) {
            return None;
        }
        Some((raw, Bhs::parse(&raw).ok()?, dsl))
    }

    /// Reads from `r` for the segment [`segment_ahead`](Self::segment_ahead) named: into
    /// `dst` (the whole segment's destination, `dsl` bytes; the bytes already received are
    /// copied there first), then what follows into the framer's buffer, with one vectored
    /// read; the PDU then comes from [`next_pdu_routed`](Self::next_pdu_routed) as placed,
    /// once its digest is checked. `None` for a segment already begun: its destination is
    /// gone (the task was aborted), the rest is read into the framer and dropped, and the
    /// PDU comes without data, not placed. With no segment ahead, this is
    /// [`read_from`](Self::read_from).
    pub fn read_routed(&mut self, r: &mut impl std::io::Read, chunk: usize, dst: Option<&mut [u8]>) -> std::io::Result<usize> {
        let data_digest = self.digests.data;
        let mut dst = dst;
        if self.direct.is_none() {
            let (Some(to), Some((raw, bhs, dsl))) = (dst.as_deref_mut(), self.next_header_for_direct()) else {
                return self.read_from(r, chunk);
            };
            if to.len() != dsl {
                return self.read_from(r, chunk);
            }
            // The header is consumed; the segment's first bytes, read with it, are copied.
            let from = self.start + self.header_len(&raw);
            let have = self.end.saturating_sub(from).min(dsl);
            let part = self.buf.get(from..from + have).unwrap_or_default();
            to[..part.len()].copy_from_slice(part);
            let crc = if data_digest { digest::crc32c(part) } else { 0 };
            self.copied += part.len() as u64;
            self.direct = Some(Direct { raw, bhs, dsl, got: part.len(), crc, discard: false });
            self.start = from + part.len();
        }
        self.make_room(chunk);
        let Some(d) = self.direct.as_mut().filter(|d| !d.discard && d.got < d.dsl) else {
            return self.read_from(r, chunk);
        };
        let Some(dst) = dst.filter(|b| b.len() == d.dsl) else {
            d.discard = true;
            return self.read_from(r, chunk);
        };
        // After the segment: its padding and digest and the next PDU's header, no more, so
        // that a next solicited segment comes in place whole too.
        let after = (padded_len(d.dsl) - d.dsl + if data_digest { DIGEST_LEN } else { 0 } + BHS_LEN + DIGEST_LEN).min(chunk);
        let seg = &mut dst[d.got..];
        let want = seg.len();
        let mut iov = [std::io::IoSliceMut::new(seg), std::io::IoSliceMut::new(&mut self.buf[self.end..self.end + after])];
        let n = r.read_vectored(&mut iov)?;
        let into_seg = n.min(want);
        if data_digest {
            d.crc = digest::crc32c_append(d.crc, &dst[d.got..d.got + into_seg]);
        }
        d.got += into_seg;
        self.end += n - into_seg;
        Ok(n)
    }

    /// The PDU of a segment received directly, once its padding and digest are in.
    fn finish_direct(&mut self) -> Result<Option<(Pdu, bool)>, FrameError> {
        let Some(d) = &self.direct else { return Ok(None) };
        let rest = if d.discard { d.dsl - d.got } else { 0 };
        if !d.discard && d.got < d.dsl {
            return Ok(None);
        }
        let tail = self.segment_tail(d.dsl);
        let pending = self.buf.get(self.start..self.end).unwrap_or_default();
        let Some(after) = pending.get(rest..rest + tail) else { return Ok(None) };
        let digest_check = if self.digests.data && !d.discard {
            let pad = tail - DIGEST_LEN;
            let computed = digest::crc32c_append(d.crc, after.get(..pad).unwrap_or_default());
            let received = wire_digest(after.get(pad..));
            (computed != received).then_some((computed, received))
        } else {
            None
        };
        self.start += rest + tail;
        self.compact();
        let Some(d) = self.direct.take() else { return Ok(None) };
        if let Some((computed, received)) = digest_check {
            return Err(FrameError::DataDigest { computed, received, header: Box::new(d.raw) });
        }
        // Dropped: the PDU comes without its data, not placed (its task is gone).
        Ok(Some((Pdu { bhs: d.bhs, ahs: Vec::new(), data: Vec::new() }, !d.discard)))
    }

    /// Header part on the wire: BHS, AHS, header digest.
    fn header_len(&self, raw: &[u8; BHS_LEN]) -> usize {
        BHS_LEN + raw_total_ahs_len(raw) + if self.digests.header { DIGEST_LEN } else { 0 }
    }

    /// Data part on the wire: data, padding, data digest (none without data).
    fn data_len(&self, raw: &[u8; BHS_LEN]) -> usize {
        let dsl = raw_data_segment_len(raw);
        if dsl == 0 {
            0
        } else {
            padded_len(dsl) + if self.digests.data { DIGEST_LEN } else { 0 }
        }
    }

    fn frame_len(&self, raw: &[u8; BHS_LEN]) -> usize {
        self.header_len(raw) + self.data_len(raw)
    }

    fn fail<T>(&mut self, e: FrameError) -> Result<T, FrameError> {
        if !e.connection_can_continue() {
            self.failed = true;
            self.direct = None;
            self.buf = Vec::new();
            self.start = 0;
            self.end = 0;
        }
        Err(e)
    }

    /// The next complete PDU, `Ok(None)` if more bytes are needed.
    pub fn next_pdu(&mut self) -> Result<Option<Pdu>, FrameError> {
        Ok(self.next_pdu_routed(|_, _| false)?.map(|(p, _)| p))
    }

    /// Like [`next_pdu`](Self::next_pdu), but `place` sees each data segment (once its
    /// digest, if any, is checked) with the parsed header and may copy it where it belongs
    /// (a task's buffer) and return true: the PDU then comes back with an empty `data` and
    /// `true`, and the segment is never copied into a vector.
    pub fn next_pdu_routed(&mut self, mut place: impl FnMut(&Bhs, &[u8]) -> bool) -> Result<Option<(Pdu, bool)>, FrameError> {
        if self.failed {
            return Err(FrameError::Failed);
        }
        if self.direct.is_some() {
            return self.finish_direct();
        }
        // The fields, not `self.pending()`: the spare segments are taken while this is held.
        let pending = self.buf.get(self.start..self.end).unwrap_or_default();
        let Some(raw) = pending
            .get(..BHS_LEN)
            .and_then(|s| <[u8; BHS_LEN]>::try_from(s).ok())
        else {
            return Ok(None);
        };
        let ahs_len = raw_total_ahs_len(&raw);
        let dsl = raw_data_segment_len(&raw);
        let header_len = self.header_len(&raw);
        // The AHS is at most 1020 bytes, so waiting for it before checking the header
        // digest is bounded; trust no length before the digest has been checked.
        let Some(header) = pending.get(..header_len) else {
            if ahs_len > self.limits.max_ahs_length && !self.digests.header {
                let e = FrameError::AhsTooLong {
                    len: ahs_len,
                    max: self.limits.max_ahs_length,
                    header: Box::new(raw),
                };
                return self.fail(e);
            }
            return Ok(None);
        };
        if self.digests.header {
            let covered = header.get(..BHS_LEN + ahs_len).unwrap_or_default();
            let computed = digest::crc32c(covered);
            let received = wire_digest(header.get(BHS_LEN + ahs_len..));
            if computed != received {
                return self.fail(FrameError::HeaderDigest { computed, received });
            }
        }
        if ahs_len > self.limits.max_ahs_length {
            let e = FrameError::AhsTooLong {
                len: ahs_len,
                max: self.limits.max_ahs_length,
                header: Box::new(raw),
            };
            return self.fail(e);
        }
        if dsl > self.limits.max_recv_data_segment_length {
            let e = FrameError::DataSegmentTooLong {
                len: dsl,
                max: self.limits.max_recv_data_segment_length,
                header: Box::new(raw),
            };
            return self.fail(e);
        }
        let total = header_len + self.data_len(&raw);
        let Some(frame) = pending.get(..total) else {
            return Ok(None);
        };
        // Usually none: an empty vector without a call into the allocator's code.
        let ahs = match ahs_len {
            0 => Vec::new(),
            _ => frame.get(BHS_LEN..BHS_LEN + ahs_len).unwrap_or_default().to_vec(),
        };
        let data_area = frame.get(header_len..).unwrap_or_default();
        let segment = data_area.get(..dsl).unwrap_or_default();
        let digest_check = if dsl > 0 && self.digests.data {
            let padded = padded_len(dsl);
            let computed = digest::crc32c(data_area.get(..padded).unwrap_or_default());
            let received = wire_digest(data_area.get(padded..));
            (computed != received).then_some((computed, received))
        } else {
            None
        };
        let parsed = Bhs::parse(&raw);
        let mut placed = false;
        let data = if segment.is_empty() || digest_check.is_some() {
            Vec::new()
        } else if parsed.as_ref().is_ok_and(|bhs| place(bhs, segment)) {
            placed = true;
            self.copied += segment.len() as u64;
            Vec::new()
        } else {
            // A spare big enough (handed back), or one an I/O buffer left behind on this
            // thread (riser_buf::take_vec), or a new vector.
            let mut v = match self.spare.iter().rposition(|v| v.capacity() >= segment.len()) {
                Some(i) => self.spare.swap_remove(i),
                None => riser_buf::take_vec(segment.len()),
            };
            v.extend_from_slice(segment);
            v
        };
        // The PDU is consumed whatever follows: the framing is intact.
        self.start += total;
        self.compact();
        if let Some((computed, received)) = digest_check {
            return Err(FrameError::DataDigest {
                computed,
                received,
                header: Box::new(raw),
            });
        }
        match parsed {
            Ok(bhs) => Ok(Some((Pdu { bhs, ahs, data }, placed))),
            Err(error) => Err(FrameError::Malformed {
                error,
                header: Box::new(raw),
            }),
        }
    }
}

fn wire_digest(b: Option<&[u8]>) -> u32 {
    let bytes: [u8; 4] = b
        .and_then(|s| s.get(..4))
        .and_then(|s| s.try_into().ok())
        .unwrap_or_default();
    digest::from_wire(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{DataOut, Lun, NopOut, Op, TextRequest};
    use crate::serial::{Itt, Sn, Ttt};

    fn nop(itt: u32, data: &[u8]) -> Pdu {
        Pdu::with_data(
            Op::NopOut(NopOut {
                immediate: true,
                lun: Lun(0),
                itt: Itt(itt),
                ttt: Ttt::RESERVED,
                cmd_sn: Sn(1),
                exp_stat_sn: Sn(1),
            }),
            data.to_vec(),
        )
    }

    fn data_out(len: usize) -> Pdu {
        Pdu::with_data(
            Op::DataOut(DataOut {
                final_bit: true,
                lun: Lun(0),
                itt: Itt(9),
                ttt: Ttt(3),
                exp_stat_sn: Sn(1),
                data_sn: Sn(0),
                buffer_offset: 0,
            }),
            vec![0x5a; len],
        )
    }

    fn norm(mut p: Pdu) -> Pdu {
        p.bhs.data_segment_length = p.data.len() as u32;
        p.bhs.total_ahs_length = (p.ahs.len() / 4) as u8;
        p
    }

    fn stream(pdus: &[Pdu], d: Digests) -> Vec<u8> {
        let mut v = Vec::new();
        for p in pdus {
            p.encode(d, &mut v).unwrap();
        }
        v
    }

    #[test]
    fn byte_at_a_time_and_coalesced() {
        for d in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let pdus = vec![nop(1, b"ping"), nop(2, b""), nop(3, b"odd"), data_out(4000)];
            let bytes = stream(&pdus, d);
            // one byte at a time
            let mut f = Framer::new();
            f.set_digests(d);
            let mut got = Vec::new();
            for b in &bytes {
                f.feed(std::slice::from_ref(b));
                while let Some(p) = f.next_pdu().unwrap() {
                    got.push(p);
                }
            }
            assert_eq!(got, pdus.iter().cloned().map(norm).collect::<Vec<_>>());
            assert_eq!(f.buffered(), 0);
            // all at once
            let mut f = Framer::new();
            f.set_digests(d);
            f.feed(&bytes);
            let mut got = Vec::new();
            while let Some(p) = f.next_pdu().unwrap() {
                got.push(p);
            }
            assert_eq!(got.len(), 4);
            // odd splits
            let mut f = Framer::new();
            f.set_digests(d);
            let mut got = 0;
            for chunk in bytes.chunks(37) {
                f.feed(chunk);
                while f.next_pdu().unwrap().is_some() {
                    got += 1;
                }
            }
            assert_eq!(got, 4);
        }
    }

    #[test]
    fn bytes_needed_tracks_the_frame() {
        let bytes = stream(&[nop(1, b"hello")], Digests::default());
        let mut f = Framer::new();
        assert_eq!(f.bytes_needed(), 48);
        f.feed(&bytes[..10]);
        assert_eq!(f.bytes_needed(), 38);
        f.feed(&bytes[10..48]);
        assert_eq!(f.bytes_needed(), 8);
        assert!(f.next_pdu().unwrap().is_none());
        f.feed(&bytes[48..]);
        assert_eq!(f.bytes_needed(), 0);
        assert!(f.next_pdu().unwrap().is_some());
    }

    #[test]
    fn oversized_segment_is_refused_before_its_data_arrives() {
        let mut hdr = nop(1, b"").bhs.to_bytes();
        // DataSegmentLength = 16 MiB - 1, nothing behind it
        hdr[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        let mut f = Framer::new();
        f.feed(&hdr);
        let e = f.next_pdu().unwrap_err();
        assert!(matches!(
            e,
            FrameError::DataSegmentTooLong {
                len: 0xff_ffff,
                max: 8192,
                ..
            }
        ));
        assert_eq!(
            e.action(),
            ErrorAction::RejectAndDrop(RejectReason::ProtocolError)
        );
        assert_eq!(e.header(), Some(&hdr));
        assert!(f.buf.capacity() < 4096);
        assert_eq!(f.next_pdu(), Err(FrameError::Failed));
        // the limit follows negotiation
        let mut f = Framer::with_limits(FramerLimits {
            max_recv_data_segment_length: 262144,
            max_ahs_length: 0,
        });
        f.feed(&stream(&[data_out(100_000)], Digests::default()));
        assert_eq!(f.next_pdu().unwrap().unwrap().data.len(), 100_000);
    }

    #[test]
    fn ahs_over_the_cap() {
        let mut p = nop(1, b"");
        p.ahs = vec![0; 8];
        let bytes = stream(&[p], Digests::default());
        let mut f = Framer::with_limits(FramerLimits {
            max_recv_data_segment_length: 8192,
            max_ahs_length: 4,
        });
        f.feed(&bytes[..48]);
        assert!(matches!(
            f.next_pdu(),
            Err(FrameError::AhsTooLong { len: 8, max: 4, .. })
        ));
    }

    #[test]
    fn header_digest_error_is_fatal() {
        let d = Digests {
            header: true,
            data: true,
        };
        let mut bytes = stream(&[nop(1, b"abcd"), nop(2, b"")], d);
        bytes[20] ^= 1; // corrupt ITT of the first PDU
        let mut f = Framer::new();
        f.set_digests(d);
        f.feed(&bytes);
        let e = f.next_pdu().unwrap_err();
        assert!(matches!(e, FrameError::HeaderDigest { .. }));
        assert_eq!(e.action(), ErrorAction::Drop);
        assert!(!e.connection_can_continue());
        assert_eq!(f.next_pdu(), Err(FrameError::Failed));
    }

    #[test]
    fn header_digest_checked_before_lengths() {
        // a corrupted length must be reported as a digest error, not "too long"
        let d = Digests {
            header: true,
            data: false,
        };
        let mut bytes = stream(&[nop(1, b"")], d);
        bytes[5] = 0x7f;
        let mut f = Framer::new();
        f.set_digests(d);
        f.feed(&bytes);
        assert!(matches!(f.next_pdu(), Err(FrameError::HeaderDigest { .. })));
    }

    #[test]
    fn data_digest_error_rejects_and_continues() {
        let d = Digests {
            header: true,
            data: true,
        };
        let mut bytes = stream(&[data_out(100), nop(2, b"")], d);
        bytes[48 + 4 + 10] ^= 0xff; // corrupt a data byte
        let mut f = Framer::new();
        f.set_digests(d);
        f.feed(&bytes);
        let e = f.next_pdu().unwrap_err();
        assert!(matches!(e, FrameError::DataDigest { .. }));
        assert_eq!(
            e.action(),
            ErrorAction::RejectAndContinue(RejectReason::DataDigestError)
        );
        assert_eq!(e.header().map(|h| h[0]), Some(0x05));
        let next = f.next_pdu().unwrap().unwrap();
        assert_eq!(next.itt(), Itt(2));
    }

    #[test]
    fn digests_switch_between_pdus() {
        // login PDU without digests, then a full-feature PDU with them
        let mut bytes = stream(&[nop(1, b"x")], Digests::default());
        let d = Digests {
            header: true,
            data: true,
        };
        bytes.extend(stream(&[nop(2, b"y")], d));
        let mut f = Framer::new();
        f.feed(&bytes);
        assert_eq!(f.next_pdu().unwrap().unwrap().itt(), Itt(1));
        f.set_digests(d);
        assert_eq!(f.next_pdu().unwrap().unwrap().itt(), Itt(2));
    }

    #[test]
    fn malformed_header_is_consumed_and_reported() {
        let text = Pdu::with_data(
            Op::TextRequest(TextRequest {
                immediate: false,
                final_bit: false,
                continue_bit: true,
                lun: Lun(0),
                itt: Itt(4),
                ttt: Ttt::RESERVED,
                cmd_sn: Sn(1),
                exp_stat_sn: Sn(1),
            }),
            b"a=b\0".to_vec(),
        );
        let mut bytes = stream(&[text, nop(5, b"")], Digests::default());
        bytes[1] |= 0x80; // F with C
        let mut f = Framer::new();
        f.feed(&bytes);
        let e = f.next_pdu().unwrap_err();
        assert!(matches!(e, FrameError::Malformed { .. }));
        assert!(e.connection_can_continue());
        assert_eq!(f.next_pdu().unwrap().unwrap().itt(), Itt(5));
    }

    #[test]
    fn truncated_bhs_waits() {
        let mut f = Framer::new();
        f.feed(&[0x01; 47]);
        assert_eq!(f.next_pdu(), Ok(None));
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x1234_5678u32;
        for round in 0..200 {
            let mut f = Framer::new();
            if round % 2 == 0 {
                f.set_digests(Digests {
                    header: true,
                    data: true,
                });
            }
            for _ in 0..50 {
                let mut chunk = [0u8; 61];
                for b in chunk.iter_mut() {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    *b = seed as u8;
                }
                f.feed(&chunk);
                match f.next_pdu() {
                    Ok(_) => {}
                    Err(e) if e.connection_can_continue() => {}
                    Err(_) => break,
                }
            }
        }
    }

    /// A reader that hands out its bytes in pieces of the given sizes, then WouldBlock.
    struct Pieces {
        bytes: Vec<u8>,
        pos: usize,
        sizes: Vec<usize>,
    }

    impl std::io::Read for Pieces {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            let Some(&n) = self.sizes.first().filter(|_| self.pos < self.bytes.len()) else {
                return Err(std::io::ErrorKind::WouldBlock.into());
            };
            if n == 0 {
                // A pause: nothing to read this time.
                self.sizes.remove(0);
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let n = n.min(b.len()).min(self.bytes.len() - self.pos);
            b[..n].copy_from_slice(&self.bytes[self.pos..self.pos + n]);
            self.pos += n;
            self.sizes[0] -= n;
            if self.sizes[0] == 0 {
                self.sizes.remove(0);
            }
            Ok(n)
        }
    }

    /// Reads everything as the TCP datamover does: a segment ahead goes to `dst` (if `give`).
    fn read_all(f: &mut Framer, r: &mut Pieces, dst: &mut [u8], give: bool) -> Vec<(Pdu, bool)> {
        let mut out = Vec::new();
        loop {
            let n = match f.segment_ahead() {
                Some((_, dsl)) => f.read_routed(r, 4096, if give { dst.get_mut(..dsl) } else { None }),
                None => f.read_from(r, 4096),
            };
            match n {
                Ok(_) => {}
                Err(_) => break,
            }
            while let Some(p) = f.next_pdu_routed(|_, _| false).unwrap() {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn a_segment_still_to_come_is_received_straight_into_its_destination() {
        for d in [Digests::default(), Digests { header: true, data: true }] {
            let mut seg = data_out(3001);
            seg.data.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            let pdus = vec![nop(1, b"ping"), seg.clone(), nop(2, b"pong")];
            let bytes = stream(&pdus, d);
            let hl = BHS_LEN + if d.header { 4 } else { 0 };
            // The NOP, the Data-Out's header and 100 bytes of its segment; then the rest.
            let first = stream(&pdus[..1], d).len() + hl + 100;
            let mut r = Pieces { sizes: vec![first, 1000, bytes.len()], bytes, pos: 0 };
            let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 0 });
            f.set_digests(d);
            let mut dst = vec![0u8; 3001];
            let got = read_all(&mut f, &mut r, &mut dst, true);
            assert_eq!(got.len(), 3);
            assert_eq!(got[0], (norm(pdus[0].clone()), false));
            assert!(got[1].1, "placed");
            assert_eq!((got[1].0.bhs.data_segment_length, got[1].0.data.len()), (3001, 0));
            assert_eq!(dst, seg.data);
            assert_eq!(got[2], (norm(pdus[2].clone()), false));
            assert_eq!(f.take_copied(), 100, "only the bytes read with the header were copied");
            assert_eq!(f.buffered(), 0);
        }
    }

    #[test]
    fn a_segment_received_directly_has_its_digest_checked() {
        let d = Digests { header: true, data: true };
        let pdus = vec![data_out(2000), nop(2, b"after")];
        let mut bytes = stream(&pdus, d);
        bytes[BHS_LEN + 4 + 1500] ^= 1;
        let mut r = Pieces { sizes: vec![BHS_LEN + 4 + 10, bytes.len()], bytes, pos: 0 };
        let mut f = Framer::new();
        f.set_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 0 });
        f.set_digests(d);
        let mut dst = vec![0u8; 2000];
        // Header and 10 bytes; then the rest straight into dst.
        assert!(f.read_from(&mut r, 64).is_ok());
        assert!(f.segment_ahead().is_some());
        while f.read_routed(&mut r, 64, Some(&mut dst)).is_ok() {}
        let e = f.next_pdu_routed(|_, _| false).unwrap_err();
        assert!(matches!(e, FrameError::DataDigest { .. }), "{e:?}");
        assert!(e.connection_can_continue());
        assert_eq!(f.next_pdu().unwrap(), Some(norm(pdus[1].clone())), "the stream goes on");
    }

    #[test]
    fn a_segment_whose_destination_went_away_is_dropped() {
        let d = Digests::default();
        let pdus = vec![data_out(2000), nop(2, b"after")];
        let bytes = stream(&pdus, d);
        let mut r = Pieces { sizes: vec![BHS_LEN + 10, 500, bytes.len()], bytes, pos: 0 };
        let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 0 });
        let mut dst = vec![0u8; 2000];
        assert!(f.read_from(&mut r, 64).is_ok());
        assert!(f.read_routed(&mut r, 64, Some(&mut dst)).is_ok());
        assert_eq!(f.next_pdu().unwrap(), None, "1490 bytes still to come");
        // The task was aborted: no destination any more.
        while f.read_routed(&mut r, 64, None).is_ok() {}
        let (p, placed) = f.next_pdu_routed(|_, _| false).unwrap().unwrap();
        assert!(!placed && p.data.is_empty() && p.bhs.data_segment_length == 2000);
        assert_eq!(f.next_pdu().unwrap(), Some(norm(pdus[1].clone())));
    }

    #[test]
    fn a_header_that_arrives_alone_then_its_segment_in_pieces() {
        for d in [Digests::default(), Digests { header: true, data: true }] {
            let mut seg = data_out(5000);
            seg.data.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7) as u8);
            let pdus = vec![seg.clone(), nop(2, b"next")];
            let bytes = stream(&pdus, d);
            let hl = BHS_LEN + if d.header { 4 } else { 0 };
            let mut r = Pieces { sizes: vec![hl, 0, 7, 0, 2000, bytes.len()], bytes, pos: 0 };
            let mut f = Framer::with_limits(FramerLimits { max_recv_data_segment_length: 8192, max_ahs_length: 0 });
            f.set_digests(d);
            let mut dst = vec![0u8; 5000];
            let mut got = Vec::new();
            // WouldBlock between the pieces (the zero-length ones): every call starts over.
            for _ in 0..12 {
                let _ = match f.segment_ahead() {
                    Some((_, dsl)) => f.read_routed(&mut r, 4096, dst.get_mut(..dsl)),
                    None => f.read_from(&mut r, 4096),
                };
                while let Some(p) = f.next_pdu_routed(|_, _| false).unwrap() {
                    got.push(p);
                }
            }
            assert_eq!(got.len(), 2, "{got:?}");
            assert!(got[0].1 && dst == seg.data);
            assert_eq!(f.take_copied(), 0, "nothing came with the header: nothing copied");
            assert_eq!(got[1], (norm(pdus[1].clone()), false));
        }
    }
}
