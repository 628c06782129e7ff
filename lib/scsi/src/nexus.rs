//! The I_T nexus of a task: the initiator port and the target port it came through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One I_T nexus: an initiator port talking to a target port (SAM-5 4.7). Reservations and
/// unit attentions belong to nexuses, so every session presents the same `Nexus` (by
/// [`key`](Nexus::key)) for all its commands; a new session of the same initiator port
/// (same initiator name and ISID) through the same target port is the same I_T nexus.
#[derive(Debug)]
pub struct Nexus {
    /// Unique per `Nexus` object (per session instance); lets executors cache per-nexus facts.
    /// Increasing: a newer session of the same I_T nexus (a reinstatement) has a larger id,
    /// which is how a LUN tells what the newer session holds from the older one's
    /// ([`Lun::nexus_lost`](crate::Lun::nexus_lost)).
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
