//! What the iSCSI layer hands in (a [`ScsiTask`]) and gets back (a [`ScsiResult`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use riser_bdev::IoBuf;

use crate::cdb::Cdb;
use crate::sense::{SenseBuf, Status};

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

/// One I_T nexus: an initiator port talking to a target port (SAM-5 4.7). Reservations and
/// unit attentions belong to nexuses, so every session presents the same `Nexus` (by
/// [`key`](Nexus::key)) for all its commands; a new session of the same initiator port
/// (same initiator name and ISID) through the same target port is the same I_T nexus.
#[derive(Debug)]
pub struct Nexus {
    /// Unique per `Nexus` object (per session instance); lets executors cache per-nexus facts.
    pub id: u64,
    /// iSCSI initiator name (`iqn.…`), without the ISID.
    pub initiator_name: String,
    /// The 48-bit ISID of the session.
    pub isid: u64,
    /// iSCSI target name (`iqn.…`).
    pub target_name: String,
    /// Target portal group tag of the session.
    pub tpgt: u16,
    /// RELATIVE TARGET PORT IDENTIFIER reported in VPD page 0x83 (nonzero).
    pub rel_target_port: u16,
    /// TARGET PORT GROUP reported in VPD page 0x83.
    pub target_port_group: u16,
    /// The target node's ALUA description (REPORT TARGET PORT GROUPS, access states);
    /// `None`: one active/optimized group, this nexus's.
    pub alua: Option<Arc<crate::alua::Alua>>,
    key: Arc<str>,
}

static NEXT_NEXUS_ID: AtomicU64 = AtomicU64::new(1);

impl Nexus {
    /// An I_T nexus. `rel_target_port` and `target_port_group` are usually derived from the
    /// portal group tag (riser uses the tag for both).
    pub fn new(initiator_name: &str, isid: u64, target_name: &str, tpgt: u16) -> Nexus {
        Nexus::with_port(initiator_name, isid, target_name, tpgt, tpgt.max(1), tpgt)
    }

    pub fn with_port(
        initiator_name: &str,
        isid: u64,
        target_name: &str,
        tpgt: u16,
        rel_target_port: u16,
        target_port_group: u16,
    ) -> Nexus {
        let isid = isid & 0xFFFF_FFFF_FFFF;
        let key: Arc<str> = format!(
            "{},i,0x{:012x}|{},t,0x{:04x}",
            initiator_name, isid, target_name, tpgt
        )
        .into();
        Nexus {
            id: NEXT_NEXUS_ID.fetch_add(1, Ordering::Relaxed),
            initiator_name: initiator_name.to_string(),
            isid,
            target_name: target_name.to_string(),
            tpgt,
            rel_target_port,
            target_port_group,
            alua: None,
            key,
        }
    }

    /// The same nexus under the target node's ALUA description.
    pub fn with_alua(mut self, alua: Arc<crate::alua::Alua>) -> Nexus {
        self.alua = Some(alua);
        self
    }

    /// The identity of the nexus across sessions: initiator port and target port names.
    pub fn key(&self) -> &Arc<str> {
        &self.key
    }

    /// iSCSI initiator port name (RFC 7143 13.8; SPC-4 7.6.4.6): `name,i,0x<ISID>`.
    pub fn initiator_port(&self) -> String {
        format!("{},i,0x{:012x}", self.initiator_name, self.isid)
    }

    /// iSCSI target port name: `name,t,0x<TPGT>`.
    pub fn target_port(&self) -> String {
        format!("{},t,0x{:04x}", self.target_name, self.tpgt)
    }

    /// The initiator's TransportID (SPC-4 7.6.4.6, iSCSI, format 01b: name with ISID),
    /// padded to a multiple of 4 bytes.
    pub fn transport_id(&self) -> Vec<u8> {
        let name = self.initiator_port();
        let mut len = name.len() + 1; // NUL terminated
        len = (len + 3) & !3;
        len = len.max(20);
        let mut v = vec![0u8; 4 + len];
        v[0] = 0x40 | 0x05; // format 01b, protocol identifier 5 (iSCSI)
        v[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        v[4..4 + name.len()].copy_from_slice(name.as_bytes());
        v
    }
}

/// A SCSI command as the iSCSI layer received it.
pub struct ScsiTask {
    /// The caller's handle (e.g. the Initiator Task Tag); returned in the result.
    pub tag: u64,
    /// The LUN field as addressed (decoded LUN number).
    pub lun: u64,
    pub cdb: Cdb,
    /// Expected Data Transfer Length of the SCSI Command PDU.
    pub edtl: u32,
    /// The R and W bits of the SCSI Command PDU.
    pub read: bool,
    pub write: bool,
    /// Write data gathered by the iSCSI layer: EDTL bytes, or fewer if the initiator sent
    /// fewer (unsolicited + solicited data). `None` when there is none.
    pub data_out: Option<IoBuf>,
    /// A plain WRITE (6/10/12/16) whose data the SCSI layer asks for itself, piece by piece,
    /// once the command has passed its checks: each piece comes out of the channel's
    /// `take_wants` as a [`DataWant`] and goes back in with `write_data` (see
    /// [`crate::LunChannel::set_stream_chunk`]). `data_out` is then `None`.
    pub data_out_later: bool,
    pub nexus: Arc<Nexus>,
    pub attr: TaskAttr,
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

impl fmt::Debug for ScsiTask {
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
                &self.data_out.as_ref().map(|b| b.as_slice().len()),
            )
            .field("nexus", &self.nexus.key())
            .finish()
    }
}

impl ScsiTask {
    /// A task with no data out; set `data_out`, `write` etc. as needed.
    pub fn new(tag: u64, lun: u64, cdb: &[u8], edtl: u32, nexus: Arc<Nexus>) -> ScsiTask {
        ScsiTask {
            tag,
            lun,
            cdb: Cdb::new(cdb),
            edtl,
            read: false,
            write: false,
            data_out: None,
            data_out_later: false,
            nexus,
            attr: TaskAttr::Simple,
        }
    }

    pub fn data_out_slice(&self) -> &[u8] {
        self.data_out.as_ref().map_or(&[][..], |b| b.as_slice())
    }
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

/// The outcome of a task.
pub struct ScsiResult {
    pub tag: u64,
    pub status: Status,
    /// Sense data for CHECK CONDITION (fixed format, or descriptor format when D_SENSE).
    pub sense: Option<SenseBuf>,
    /// Data for the initiator; only the first `data_len` bytes are valid (never more
    /// than EDTL).
    pub data_in: Option<IoBuf>,
    pub data_len: usize,
    pub residual: Residual,
    /// The task was aborted by task management: send no SCSI Response for it. It is
    /// reported only so that the caller knows its resources are released.
    pub aborted: bool,
    /// Where `data_in` lies in the task's data: the byte offset of its first byte. 0 unless
    /// the read streams in pieces (see [`crate::LunChannel::set_stream_chunk`]).
    pub data_offset: usize,
    /// A piece of a streamed read's data, not the task's end: `data_in` holds `data_len`
    /// bytes from `data_offset`, to go out now; more pieces and then the final result (with
    /// the status and the last piece) follow. Status, sense and residual mean nothing here.
    pub partial: bool,
}

impl ScsiResult {
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
            .field("residual", &self.residual)
            .field("aborted", &self.aborted)
            .field("data_offset", &self.data_offset)
            .field("partial", &self.partial)
            .finish()
    }
}
