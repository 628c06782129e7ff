//! The protocol between the iSCSI and the SCSI layer for one task: what the iSCSI layer hands
//! in (a [`ScsiTask`], its write data as a [`DataOut`], streamed pieces with
//! `write_data`) and what comes back from `poll` ([`TaskEvent`]s: read pieces, wants for a
//! streamed write's data, the end with a [`ScsiResult`], or the abort), with the status,
//! sense and residual types both layers use.

use std::fmt;
use std::sync::Arc;

use riser_buf::IoBuf;

use crate::cdb::Cdb;
pub use crate::nexus::Nexus;
pub use crate::sense::{SenseBuf, Status};

/// SAM-5 task attributes (iSCSI ATTR field, RFC 7143 11.3.1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TaskAttr {
    Untagged,
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

impl TaskAttr {
    /// The ATTR field of an iSCSI SCSI Command PDU (its low 3 bits).
    pub fn from_iscsi(attr: u8) -> TaskAttr {
        match attr & 7 {
            0 | 1 => TaskAttr::Simple,
            2 => TaskAttr::Ordered,
            3 => TaskAttr::HeadOfQueue,
            _ => TaskAttr::Aca,
        }
    }
}

/// A command's write data (Data-Out) as the SCSI layer gets it.
#[derive(Default)]
pub enum DataOut {
    /// None: a command without write data.
    #[default]
    None,
    /// Gathered by the iSCSI layer: EDTL bytes, or fewer if the initiator sent fewer
    /// (unsolicited + solicited data).
    Whole(IoBuf),
    /// A plain WRITE (6/10/12/16) whose data the SCSI layer asks for itself, piece by piece,
    /// once the command has passed its checks: each piece is asked for with a
    /// [`TaskEvent::Want`] and comes back with `write_data` (see
    /// [`crate::LunChannel::set_stream_chunk`]).
    Streamed,
}

impl DataOut {
    /// The buffer of [`DataOut::Whole`].
    pub fn buf(&self) -> Option<&IoBuf> {
        match self {
            DataOut::Whole(b) => Some(b),
            _ => None,
        }
    }

    pub fn is_streamed(&self) -> bool {
        matches!(self, DataOut::Streamed)
    }
}

/// A SCSI command as the iSCSI layer received it, on the I_T nexus it borrows (the caller's,
/// which outlives the submit: no reference count is touched per command).
pub struct ScsiTask<'a> {
    /// The caller's handle (e.g. the Initiator Task Tag); returned in every event.
    pub tag: u64,
    /// The LUN field as addressed (decoded LUN number).
    pub lun: u64,
    pub cdb: Cdb,
    /// Expected Data Transfer Length of the SCSI Command PDU.
    pub edtl: u32,
    /// The R and W bits of the SCSI Command PDU.
    pub read: bool,
    pub write: bool,
    /// The write data.
    pub data_out: DataOut,
    pub nexus: &'a Arc<Nexus>,
    pub attr: TaskAttr,
}

impl fmt::Debug for ScsiTask<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScsiTask")
            .field("tag", &self.tag)
            .field("lun", &self.lun)
            .field("cdb", &self.cdb)
            .field("edtl", &self.edtl)
            .field("read", &self.read)
            .field("write", &self.write)
            .field(
                "data_out",
                &match &self.data_out {
                    DataOut::None => "none".to_string(),
                    DataOut::Whole(b) => b.as_slice().len().to_string(),
                    DataOut::Streamed => "streamed".to_string(),
                },
            )
            .field("nexus", &self.nexus.key())
            .finish()
    }
}

impl<'a> ScsiTask<'a> {
    /// A task with no data out; set `data_out`, `write` etc. as needed.
    pub fn new(tag: u64, lun: u64, cdb: &[u8], edtl: u32, nexus: &'a Arc<Nexus>) -> ScsiTask<'a> {
        ScsiTask {
            tag,
            lun,
            cdb: Cdb::new(cdb),
            edtl,
            read: false,
            write: false,
            data_out: DataOut::None,
            nexus,
            attr: TaskAttr::Simple,
        }
    }

    pub fn data_out_slice(&self) -> &[u8] {
        self.data_out.buf().map_or(&[][..], |b| b.as_slice())
    }
}

/// What the SCSI layer reports about a task, in order: for a streamed read its pieces, for
/// a streamed write its wants, then exactly one [`Done`](TaskEvent::Done) or
/// [`Aborted`](TaskEvent::Aborted), after which nothing more of the task comes.
pub enum TaskEvent {
    /// A piece of a streamed read's data, to go out now; more pieces and then the end (with
    /// the status and the last piece) follow.
    Data(DataPiece),
    /// A streamed write asks for its next piece of data.
    Want(DataWant),
    /// The task ended.
    Done(ScsiResult),
    /// The task was aborted by task management: no SCSI Response goes out for it. It is
    /// reported only so that the caller knows its resources are released.
    Aborted { tag: u64 },
}

impl TaskEvent {
    /// The task's tag.
    pub fn tag(&self) -> u64 {
        match self {
            TaskEvent::Data(p) => p.tag,
            TaskEvent::Want(w) => w.tag,
            TaskEvent::Done(r) => r.tag,
            TaskEvent::Aborted { tag } => *tag,
        }
    }

    /// Whether this is the task's last event (its end or its abort).
    pub fn ends_task(&self) -> bool {
        matches!(self, TaskEvent::Done(_) | TaskEvent::Aborted { .. })
    }

    pub fn is_aborted(&self) -> bool {
        matches!(self, TaskEvent::Aborted { .. })
    }

    /// The result of a [`Done`](TaskEvent::Done).
    pub fn into_result(self) -> Option<ScsiResult> {
        match self {
            TaskEvent::Done(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Debug for TaskEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskEvent::Data(p) => f
                .debug_struct("Data")
                .field("tag", &p.tag)
                .field("offset", &p.offset)
                .field("len", &p.len)
                .finish(),
            TaskEvent::Want(w) => w.fmt(f),
            TaskEvent::Done(r) => r.fmt(f),
            TaskEvent::Aborted { tag } => f.debug_struct("Aborted").field("tag", tag).finish(),
        }
    }
}

/// A piece of a streamed read's data: `len` bytes of `buf`, the command's bytes from
/// `offset`.
pub struct DataPiece {
    pub tag: u64,
    pub offset: u32,
    pub buf: IoBuf,
    pub len: u32,
}

impl DataPiece {
    /// The piece's valid bytes.
    pub fn data(&self) -> &[u8] {
        let s = self.buf.as_slice();
        &s[..(self.len as usize).min(s.len())]
    }
}

/// A streamed WRITE asks for its next piece of data: the command's bytes
/// `[offset, offset+len)` of task `tag` on LUN `lun`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataWant {
    pub tag: u64,
    pub lun: u64,
    pub offset: u32,
    pub len: u32,
}

/// Residual for the SCSI Response (RFC 7143 11.4.5): the difference between the Expected
/// Data Transfer Length and the amount the command transferred (or wanted to transfer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Residual {
    #[default]
    None,
    /// The command wanted to transfer fewer bytes than EDTL (U bit).
    Underflow(u32),
    /// The command wanted to transfer more bytes than EDTL (O bit).
    Overflow(u32),
}

impl Residual {
    /// Residual of a command whose SCSI transfer length is `transfer` bytes.
    pub fn compute(transfer: u64, edtl: u32) -> Residual {
        let edtl = edtl as u64;
        if transfer > edtl {
            Residual::Overflow((transfer - edtl).min(u32::MAX as u64) as u32)
        } else if transfer < edtl {
            Residual::Underflow((edtl - transfer) as u32)
        } else {
            Residual::None
        }
    }

    pub fn count(self) -> u32 {
        match self {
            Residual::None => 0,
            Residual::Underflow(n) | Residual::Overflow(n) => n,
        }
    }
}

/// The end of a task: its status, sense and residual, and its read data (all of it, or a
/// streamed read's last piece).
pub struct ScsiResult {
    pub tag: u64,
    pub status: Status,
    /// Sense data for CHECK CONDITION (fixed format, or descriptor format when D_SENSE).
    pub sense: Option<SenseBuf>,
    /// Data for the initiator; only the first `data_len` bytes are valid (never more
    /// than EDTL).
    pub data_in: Option<IoBuf>,
    pub data_len: usize,
    /// Where `data_in` lies in the task's data: the byte offset of its first byte. 0 unless
    /// the read streamed in pieces ([`TaskEvent::Data`]) before this last one.
    pub data_offset: usize,
    pub residual: Residual,
}

impl ScsiResult {
    /// A result without data or sense.
    pub fn new(tag: u64, status: Status, residual: Residual) -> ScsiResult {
        ScsiResult {
            tag,
            status,
            sense: None,
            data_in: None,
            data_len: 0,
            data_offset: 0,
            residual,
        }
    }

    /// The valid bytes of `data_in`.
    pub fn data(&self) -> &[u8] {
        match &self.data_in {
            Some(b) => {
                let s = b.as_slice();
                &s[..self.data_len.min(s.len())]
            }
            None => &[],
        }
    }

    pub fn sense_bytes(&self) -> &[u8] {
        self.sense.as_ref().map_or(&[][..], |s| s.as_slice())
    }

    /// (sense key, ASC, ASCQ) of the sense data, in either format.
    pub fn sense_triplet(&self) -> Option<(u8, u8, u8)> {
        let s = self.sense_bytes();
        match s.first().map(|b| b & 0x7F) {
            Some(0x70) | Some(0x71) if s.len() >= 14 => Some((s[2] & 0x0F, s[12], s[13])),
            Some(0x72) | Some(0x73) if s.len() >= 4 => Some((s[1] & 0x0F, s[2], s[3])),
            _ => None,
        }
    }
}

impl fmt::Debug for ScsiResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScsiResult")
            .field("tag", &self.tag)
            .field("status", &self.status)
            .field("sense", &self.sense_triplet())
            .field("data_len", &self.data_len)
            .field("data_offset", &self.data_offset)
            .field("residual", &self.residual)
            .finish()
    }
}

/// A hasher for task tags and other small integer keys (ITT, TTT, work-request ids, LUN
/// numbers: integers the peer or riser picks, at most a queue depth of them live per map):
/// one multiply instead of SipHash per lookup. A peer choosing colliding tags can only slow
/// its own connection, whose map holds at most its queue depth (a LUN map only the LUNs
/// the device has).
#[derive(Default, Clone, Copy)]
pub struct TagHasher(u64);

impl std::hash::Hasher for TagHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ *b as u64;
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 << 32) ^ n as u64;
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// A map keyed by task tag, hashed with [`TagHasher`].
pub type TagMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<TagHasher>>;
