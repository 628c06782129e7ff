//! The send side: the send queue of chunks (inline headers, owned PDUs, slices of held
//! read buffers), the read buffers held while chunks point into them, and the writev that
//! drains the queue.

use std::io::{ErrorKind, IoSlice};

use riser_bdev::IoBuf;
use riser_iscsi::ffp::DmEvent;
use riser_iscsi::pdu::{Bhs, Pdu, BHS_LEN};

use super::{ByteStream, TcpDatamover};

/// Most iovecs in one writev.
const MAX_IOV: usize = 64;

/// The longest inline chunk: a BHS and its header digest.
const SMALL: usize = BHS_LEN + 4;

/// A piece of the send queue.
pub(super) enum Chunk {
    /// A header (and its digest) or a data segment's padding and digest, inline.
    Small { bytes: [u8; SMALL], len: u8 },
    Owned(Vec<u8>),
    /// Bytes `off..off+len` of the held read buffer in slot `slot`.
    Held { slot: u32, off: usize, len: usize },
}

impl Chunk {
    fn small(b: &[u8]) -> Chunk {
        let mut bytes = [0u8; SMALL];
        bytes[..b.len()].copy_from_slice(b);
        Chunk::Small { bytes, len: b.len() as u8 }
    }

    /// Its bytes, and whether they live in a budgeted I/O buffer (a held read buffer).
    fn size(&self) -> (usize, bool) {
        match self {
            Chunk::Small { len, .. } => (*len as usize, false),
            Chunk::Owned(v) => (v.len(), false),
            Chunk::Held { len, .. } => (*len, true),
        }
    }
}

/// Read buffers whose bytes are queued for sending, each with the number of chunks that
/// still point into it; slots are reused, so queuing read data allocates nothing.
#[derive(Default)]
pub(super) struct Held {
    pub(super) slots: Vec<Option<(IoBuf, u32)>>,
    free: Vec<u32>,
}

impl Held {
    pub(super) fn hold(&mut self, buf: IoBuf) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some((buf, 0));
                i
            }
            None => {
                self.slots.push(Some((buf, 0)));
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn add_ref(&mut self, slot: u32) {
        if let Some(Some((_, n))) = self.slots.get_mut(slot as usize) {
            *n += 1;
        }
    }

    /// One chunk of `slot` is sent: the buffer goes when its last chunk has.
    fn release(&mut self, slot: u32) {
        if let Some(entry) = self.slots.get_mut(slot as usize) {
            if let Some((_, n)) = entry {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    *entry = None;
                    self.free.push(slot);
                }
            }
        }
    }

    fn bytes(&self, slot: u32, off: usize, len: usize) -> &[u8] {
        match self.slots.get(slot as usize) {
            Some(Some((b, _))) => b.as_slice().get(off..off + len).unwrap_or_default(),
            _ => &[],
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
    }
}

fn chunk_bytes<'a>(c: &'a Chunk, held: &'a Held) -> &'a [u8] {
    match c {
        Chunk::Small { bytes, len } => &bytes[..*len as usize],
        Chunk::Owned(v) => v,
        Chunk::Held { slot, off, len } => held.bytes(*slot, *off, *len),
    }
}

impl<S: ByteStream> TcpDatamover<S> {
    pub(super) fn push_pdu(&mut self, pdu: &Pdu) {
        if pdu.ahs.is_empty() && pdu.data.is_empty() {
            // Header only (a SCSI Response without sense, an R2T, a NOP-In): inline.
            match pdu.header_bytes() {
                Ok(h) => return self.push_header_bytes(&h),
                Err(e) => return log::error!("cannot encode PDU {:?}: {e}", pdu.opcode()),
            }
        }
        let mut v = Vec::with_capacity(pdu.encoded_len(self.digests));
        match pdu.encode(self.digests, &mut v) {
            Ok(()) => self.enqueue(Chunk::Owned(v)),
            Err(e) => log::error!("cannot encode PDU {:?}: {e}", pdu.opcode()),
        }
    }

    /// Header (+ header digest) of a PDU whose data segment is sent from a held buffer,
    /// encoded straight into its chunk.
    pub(super) fn push_header(&mut self, bhs: &Bhs) {
        let mut bytes = [0u8; SMALL];
        if let Some(h) = bytes.first_chunk_mut::<BHS_LEN>() {
            bhs.write(h);
        }
        self.push_header_chunk(bytes);
    }

    fn push_header_bytes(&mut self, h: &[u8; BHS_LEN]) {
        let mut bytes = [0u8; SMALL];
        bytes[..BHS_LEN].copy_from_slice(h);
        self.push_header_chunk(bytes);
    }

    /// A chunk of a header in `bytes[..BHS_LEN]`, with its digest if the connection has
    /// header digests (built in place: no second zeroing and copy through `Chunk::small`).
    fn push_header_chunk(&mut self, mut bytes: [u8; SMALL]) {
        let mut len = BHS_LEN as u8;
        if self.digests.header {
            let crc = crc32c::crc32c(&bytes[..BHS_LEN]);
            bytes[BHS_LEN..].copy_from_slice(&crc.to_le_bytes());
            len += 4;
        }
        self.enqueue(Chunk::Small { bytes, len });
    }

    /// Data segment from held buffer `slot`, with padding and data digest.
    pub(super) fn push_data(&mut self, slot: u32, off: usize, len: usize) {
        self.held.add_ref(slot);
        self.enqueue(Chunk::Held { slot, off, len });
        let pad = (4 - len % 4) % 4;
        let mut tail = [0u8; 7];
        let mut n = pad;
        if self.digests.data {
            let data = self.held.bytes(slot, off, len);
            let crc = crc32c::crc32c_append(crc32c::crc32c(data), &tail[..pad]);
            tail[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
            n += 4;
        }
        if n > 0 {
            self.enqueue(Chunk::small(&tail[..n]));
        }
    }

    /// Queues a chunk for sending, counted in the backlog.
    fn enqueue(&mut self, c: Chunk) {
        let (len, budgeted) = c.size();
        self.tx_total += len;
        if !budgeted {
            self.tx_unbudgeted += len;
        }
        self.tx.push_back(c);
    }

    /// The front chunk is sent.
    fn pop_front(&mut self) {
        if let Some(c) = self.tx.pop_front() {
            let (len, budgeted) = c.size();
            self.tx_total -= len.min(self.tx_total);
            if !budgeted {
                self.tx_unbudgeted -= len.min(self.tx_unbudgeted);
            }
            if let Chunk::Held { slot, .. } = c {
                self.held.release(slot);
            }
        }
        self.tx_pos = 0;
    }

    pub(super) fn clear_tx(&mut self) {
        self.tx.clear();
        self.held.clear();
        self.tx_pos = 0;
        self.tx_unbudgeted = 0;
        self.tx_total = 0;
    }

    pub(super) fn write_socket(&mut self, events: &mut Vec<DmEvent>) -> usize {
        let mut written = 0;
        while !self.tx.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n_iov = 0;
            let mut offered = 0;
            let taken = self.tx.len().min(MAX_IOV);
            for (i, c) in self.tx.iter().take(MAX_IOV).enumerate() {
                let b = chunk_bytes(c, &self.held);
                let b = if i == 0 { b.get(self.tx_pos..).unwrap_or_default() } else { b };
                if !b.is_empty() {
                    offered += b.len();
                    iov[n_iov] = IoSlice::new(b);
                    n_iov += 1;
                }
            }
            if n_iov == 0 {
                self.clear_tx();
                break;
            }
            match self.sock.write_vectored(&iov[..n_iov]) {
                Ok(0) => break,
                Ok(mut n) => {
                    // Short: the socket's buffer is full (the next writev would only say
                    // so); the rest goes at the next flush (a connection with queued sends
                    // is polled every pass).
                    let short = n < offered;
                    written += n;
                    self.tx_sent += n as u64;
                    if n == offered {
                        // All of it (the usual case): every chunk offered is sent, empty
                        // ones among them too; their sizes need not be looked at again.
                        for _ in 0..taken {
                            self.pop_front();
                        }
                        n = 0;
                    }
                    while n > 0 {
                        let Some(front) = self.tx.front() else { break };
                        let left = chunk_bytes(front, &self.held).len() - self.tx_pos;
                        if n >= left {
                            n -= left;
                            self.pop_front();
                        } else {
                            self.tx_pos += n;
                            n = 0;
                        }
                    }
                    // Drop any empty chunks at the front.
                    while self.tx.front().is_some_and(|c| chunk_bytes(c, &self.held).len() == self.tx_pos) {
                        self.pop_front();
                    }
                    if short {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if !self.dead {
                        self.leave_wake_set();
                        self.dead = true;
                        events.push(DmEvent::Terminated(format!("send failed: {e}")));
                    }
                    self.clear_tx();
                    break;
                }
            }
        }
        written
    }
}
