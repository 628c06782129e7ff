//! Persistent reservations of a LUN whose device several gateways export (an RBD image
//! behind two riser processes): the state lives with the device, in its [`SharedState`]
//! (for RBD the RADOS object `riser_pr.<image id>` in the image's pool), so a registration
//! or a reservation made through one gateway holds through every other, and survives a
//! restart of them all.
//!
//! * **Checks stay local.** Every command is checked against the LUN's in-memory copy
//!   ([`LunState::pr`]), as on any LUN: nothing on the I/O path touches the cluster. The
//!   copy is replaced, under the LUN's lock for the time of an assignment, when the object
//!   changes: the device's watch thread calls [`on_notify`], which re-reads the object and
//!   only then lets the device acknowledge the notify. A re-read that fails (the cluster
//!   does not answer, or the object cannot be decoded) returns `Err`: the device retries it
//!   for a bounded time and, failing, does not acknowledge, so the notifier knows this
//!   gateway did not follow; meanwhile the LUN keeps the last state it read.
//! * **PERSISTENT RESERVE OUT runs on a worker of the bounded pool** ([`super::work`]; the
//!   executor polls the [`Deferred`] result; a full backlog answers BUSY): it reads the object and its version, applies the service action
//!   to that copy with the same code as a local LUN ([`apply_pr_out`]), writes the result
//!   back only if the object is still at that version (compare-and-swap; another
//!   gateway's change in between: read again and redo), takes the new state itself, then
//!   notifies and waits until every watching gateway has re-read the object (bounded: for
//!   RBD the image's gateway lease, `lease_s`). A gateway that did not acknowledge in time
//!   (killed, hung, cut off from the cluster, or unable to re-read) is fenced by the
//!   device before the notify returns (RBD: its client is put on the OSD blocklist, see
//!   `riser_bdev::gateways`), so once the initiator sees GOOD every gateway that can still
//!   reach the image honours the change. When that fencing itself fails the command ends
//!   with HARDWARE ERROR, LOGICAL UNIT COMMUNICATION FAILURE and an error logged (the
//!   change is in the cluster, so a retry finds it done), never GOOD; a gateway that
//!   starts, or rejoins after being fenced, reads the object when it opens the LUN.
//! * **The cluster unreachable**: the worker's reads and writes fail after the cluster
//!   connection's operation timeout (30 s by default, `rados_osd_op_timeout`), and the PR
//!   OUT ends with HARDWARE ERROR, LOGICAL UNIT COMMUNICATION FAILURE, the state unchanged.
//!   No reactor waits for it.
//! * **Unit attentions** a change raises (REGISTRATIONS PREEMPTED, RESERVATIONS RELEASED...)
//!   are kept in the object itself, in a bounded log of the last [`UA_LOG_ENTRIES`] changes
//!   keyed by a sequence number every write increments ([`UaLog`]); each gateway remembers
//!   the sequence number of the copy it holds and, whenever it reads a newer one (a notify,
//!   a re-established watch, its own PR OUT's read), queues the unit attentions of every
//!   entry it had not seen for the I_T nexuses it knows (nexus keys name the target port, so
//!   each gateway's are its own). So a gateway that missed notifies (cut off, or its re-read
//!   failed) still raises what it owes. When the log no longer reaches back that far (more
//!   than [`UA_LOG_ENTRIES`] changes missed, or an older riser rewrote the object without a
//!   log) it raises conservative ones from the difference between the copy it had and the
//!   new one: REGISTRATIONS PREEMPTED for a nexus that lost its registration, RESERVATIONS
//!   RELEASED for a registrant whose reservation changed or went away. The notify's payload
//!   still carries the unit attentions, for older gateways that read no log.
//! * **APTPL**: the shared state always persists (it is the cluster's, and outlives every
//!   gateway: a gateway restart is not a power loss of the logical unit, whose medium is the
//!   image). The APTPL bit is kept and reported (PTPL_A); REPORT CAPABILITIES says PTPL_C.
//!   The local APTPL file is not used for such a LUN.
//! * **SPC-2 RESERVE/RELEASE** stay per gateway (not shared).
//! * **An object that cannot be decoded** (written by a newer riser in a format this one does
//!   not know, during a rolling upgrade, or damaged) is never overwritten: a PR OUT fails
//!   with HARDWARE ERROR, LOGICAL UNIT FAILED SELF-CONFIGURATION ([`unusable`]) and a log
//!   line, and PR IN and the I/O checks keep using the last state this gateway could read
//!   (the log says so). The re-read that found it fails, so the notify is not acknowledged.
//!
//! The object holds the JSON of [`crate::pr::store`] in the format
//! `riser-shared-persistent-reservations` with the APTPL bit, device UUID nil and LUN 0:
//! the object's name ties it to the image, whatever UUID or LUN number each gateway gives
//! it. The unit-attention log is a top-level member `unit_attentions` beside `state`,
//! outside its checksum: older gateways ignore members they do not know, so they read (and
//! an older object without it reads as a change with no log).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use riser_bdev::{Bdev, SharedError, SharedStateHandle};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{apply_pr_out, PrOutReq, PrState};
use crate::lun::{Lun, LunState};
use crate::pr::store::{decode_as, encode_as};
use crate::sense::{Asc, CmdError, CmdResult, SenseKey};
/// The result the executor polls (exec names it here).
pub(crate) use super::work::Deferred;
use crate::task::Nexus;

/// The `format` field of the shared object.
pub(crate) const FORMAT: &str = "riser-shared-persistent-reservations";
/// Compare-and-swap rounds before a PR OUT gives up (other gateways changing the state
/// all the time).
const MAX_ATTEMPTS: usize = 32;

/// A LUN's handle on its device's shared state.
pub(crate) struct SharedPr {
    handle: SharedStateHandle,
    /// This gateway in notify payloads (its own unit attentions are queued directly).
    gateway: u64,
    /// The object version the LUN's copy is from: an older read never replaces it.
    applied: AtomicU64,
    /// The [`UaLog::seq`] of the LUN's copy: the unit attentions of later entries are owed.
    seq: AtomicU64,
    /// A copy was read once: the first read raises no unit attention (nexuses that log in
    /// afterwards see POWER ON anyway).
    loaded: AtomicBool,
}

impl SharedPr {
    /// The shared state of `bdev`, when it has one; `weak` is the LUN being built.
    pub fn open(bdev: &Arc<dyn Bdev>, lun_id: u64, weak: Weak<Lun>) -> Option<SharedPr> {
        let cb = Box::new(move |payload: &[u8]| match weak.upgrade() {
            Some(lun) => on_notify(&lun, payload),
            // The LUN is going away: nothing to keep up to date.
            None => Ok(()),
        });
        match bdev.shared_state("pr", cb)? {
            Ok(handle) => {
                log::info!("LUN {lun_id} ({}): persistent reservations live in {}", bdev.info().name, handle.describe());
                Some(SharedPr {
                    handle,
                    gateway: Uuid::new_v4().as_u64_pair().0,
                    applied: AtomicU64::new(0),
                    seq: AtomicU64::new(0),
                    loaded: AtomicBool::new(false),
                })
            }
            Err(e) => {
                log::error!(
                    "LUN {lun_id} ({}): cannot open the device's shared reservation state: {e}; reservations on this LUN are this gateway's only",
                    bdev.info().name
                );
                None
            }
        }
    }

    pub fn describe(&self) -> String {
        self.handle.describe()
    }
}

/// What a notify carries besides "re-read": the unit attentions the change raised.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Notice {
    /// The notifying gateway's [`SharedPr::gateway`].
    from: u64,
    /// (I_T nexus key, ASC/ASCQ).
    uas: Vec<(String, u16)>,
}

/// Changes whose unit attentions the object keeps ([`UaLog`]).
pub(crate) const UA_LOG_ENTRIES: usize = 16;
/// Unit attentions the log keeps at most, over all its entries (the oldest entries go
/// first): the object stays small however many nexuses a change touches.
const UA_LOG_MAX_UAS: usize = 256;

/// The unit attentions of one change.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct UaEntry {
    /// The [`UaLog::seq`] the change made.
    seq: u64,
    /// (I_T nexus key, ASC/ASCQ).
    uas: Vec<(String, u16)>,
}

/// The object's `unit_attentions` member: the sequence number of the last change and the
/// unit attentions of the last [`UA_LOG_ENTRIES`] changes, oldest first (every change has
/// an entry, empty when it raised none, so that a reader sees whether the log is complete
/// from the sequence number it had).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
struct UaLog {
    seq: u64,
    log: Vec<UaEntry>,
}

impl UaLog {
    /// The log after one more change, raising `uas`.
    fn next(&self, uas: Vec<(String, u16)>) -> UaLog {
        let seq = self.seq + 1;
        let mut log = self.log.clone();
        log.push(UaEntry { seq, uas });
        let excess = log.len().saturating_sub(UA_LOG_ENTRIES);
        log.drain(..excess);
        while log.len() > 1 && log.iter().map(|e| e.uas.len()).sum::<usize>() > UA_LOG_MAX_UAS {
            log.remove(0);
        }
        UaLog { seq, log }
    }

    /// The unit attentions of the changes after `had`, if the log has every one of them.
    fn since(&self, had: u64) -> Option<Vec<(String, u16)>> {
        if self.seq < had {
            return None;
        }
        let newer: Vec<&UaEntry> = self.log.iter().filter(|e| e.seq > had).collect();
        let complete = newer.len() as u64 == self.seq - had && newer.last().is_none_or(|e| e.seq == self.seq);
        complete.then(|| newer.into_iter().flat_map(|e| e.uas.iter().cloned()).collect())
    }
}

/// What the object holds: the state, and (`None`: an object without one, written by an
/// older riser, or one whose log is damaged) the unit-attention log.
#[derive(Debug, Clone, PartialEq, Default)]
struct Shared {
    st: PrState,
    uas: Option<UaLog>,
}

impl Shared {
    fn seq(&self) -> u64 {
        self.uas.as_ref().map_or(0, |l| l.seq)
    }
}

/// The state in the object's bytes (empty: none yet).
fn decode(bytes: &[u8]) -> Result<Shared, String> {
    if bytes.is_empty() {
        return Ok(Shared { st: PrState::default(), uas: Some(UaLog::default()) });
    }
    let st = decode_as(bytes, Uuid::nil(), 0, FORMAT)?;
    // decode_as read it as JSON already; a log that does not parse is as good as none.
    let uas = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|mut v| v.get_mut("unit_attentions").map(serde_json::Value::take))
        .and_then(|v| serde_json::from_value::<UaLog>(v).ok());
    Ok(Shared { st, uas })
}

fn encode(sh: &Shared) -> std::io::Result<Vec<u8>> {
    let bytes = encode_as(&sh.st, Uuid::nil(), 0, FORMAT, true)?;
    let Some(uas) = &sh.uas else {
        return Ok(bytes);
    };
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("unit_attentions".into(), serde_json::to_value(uas).map_err(std::io::Error::other)?);
    }
    let mut bytes = serde_json::to_vec_pretty(&v).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn comm_failure() -> CmdError {
    CmdError::check(SenseKey::HardwareError, Asc::new(0x08, 0x00))
}

/// LOGICAL UNIT FAILED SELF-CONFIGURATION (SPC-4 annex D): the sense of a PR OUT when the
/// shared object cannot be decoded. HARDWARE ERROR, not ILLEGAL REQUEST (nothing is wrong
/// with the command: the same one through any gateway fails alike) nor the LOGICAL UNIT
/// COMMUNICATION FAILURE of an unreachable cluster (retrying does not help): the logical
/// unit's reservation configuration is unusable until an administrator (or the upgrade of
/// this gateway) acts. The Linux SCSI layer fails HARDWARE ERROR without retrying.
pub(crate) const UNUSABLE: Asc = Asc::new(0x4C, 0x00);

fn unusable() -> CmdError {
    CmdError::check(SenseKey::HardwareError, UNUSABLE)
}

/// Makes `new` (read at `version`) the LUN's copy, unless the copy is from a later
/// version, and queues the unit attentions this gateway's nexuses are owed by the changes
/// between the copy it had and this one.
fn apply(lun: &Lun, sh: &SharedPr, new: &Shared, version: u64) {
    let mut g = lun.lock();
    if version < sh.applied.load(Ordering::Acquire) {
        return;
    }
    sh.applied.store(version, Ordering::Release);
    let had = sh.seq.swap(new.seq(), Ordering::AcqRel);
    let first = !sh.loaded.swap(true, Ordering::AcqRel);
    let owed = if first || (had == new.seq() && new.uas.is_some()) {
        Vec::new()
    } else if let Some(uas) = new.uas.as_ref().and_then(|l| l.since(had)) {
        uas
    } else if had == 0 && new.seq() == 0 {
        // Neither copy has a log (older gateways wrote both): the notify's payload has them.
        Vec::new()
    } else {
        let owed = conservative(&g, &new.st);
        log::info!(
            "LUN {}: the shared reservation state {} went from change {had} to {} and its log no longer has every change between; raising {} conservative unit attention(s)",
            lun.id(),
            sh.describe(),
            new.seq(),
            owed.len()
        );
        owed
    };
    if g.pr != new.st {
        g.pr = new.st.clone();
    }
    queue_uas_locked(&mut g, &owed);
    lun.refresh_attn(&g);
}

/// The unit attentions owed to this gateway's nexuses for going from `g.pr` to `new` when
/// the changes between are not known: REGISTRATIONS PREEMPTED for a nexus registered before
/// and not after, RESERVATIONS RELEASED for one registered in both whose reservation
/// changed (type or holder) or went away and that does not hold the new one.
fn conservative(g: &LunState, new: &PrState) -> Vec<(String, u16)> {
    let mut v = Vec::new();
    let old = &g.pr;
    for k in g.nexuses.keys() {
        let before = old.reg(k).is_some();
        let after = new.reg(k).is_some();
        if before && !after {
            v.push((k.to_string(), Asc::REGISTRATIONS_PREEMPTED.0));
        } else if before && old.reservation.is_some() && old.reservation != new.reservation && !new.is_holder(k) {
            v.push((k.to_string(), Asc::RESERVATIONS_RELEASED.0));
        }
    }
    v
}

/// Re-reads the object into the LUN's copy (at creation, after a notify, after a
/// re-watch). `Err` (why) when it could not: the cluster did not answer, or the object
/// cannot be decoded; the LUN then keeps the last state it read (logged).
pub(crate) fn load(lun: &Lun) -> Result<(), String> {
    let Some(sh) = lun.pr_shared() else {
        return Ok(());
    };
    match sh.handle.read() {
        Ok(Some((bytes, version))) => match decode(&bytes) {
            Ok(new) => {
                apply(lun, sh, &new, version);
                Ok(())
            }
            Err(why) => {
                log::error!(
                    "LUN {}: the shared reservation state in {} cannot be decoded ({why}; written by a newer riser?); PERSISTENT RESERVE IN and the I/O checks keep using the last state this gateway read, PERSISTENT RESERVE OUT fails until it can be read, and it is never overwritten",
                    lun.id(),
                    sh.describe()
                );
                Err(format!("cannot decode {}: {why}", sh.describe()))
            }
        },
        Ok(None) => {
            apply(lun, sh, &Shared::default(), 0);
            Ok(())
        }
        Err(e) => {
            log::warn!("LUN {}: cannot read the shared reservation state {}: {e}; keeping the last one read", lun.id(), sh.describe());
            Err(format!("cannot read {}: {e}", sh.describe()))
        }
    }
}

/// The device's watch thread: another (or this) gateway changed the state. `Ok` once the
/// LUN holds the state the notify announced.
fn on_notify(lun: &Lun, payload: &[u8]) -> Result<(), String> {
    load(lun)?;
    if payload.is_empty() {
        return Ok(());
    }
    let Some(sh) = lun.pr_shared() else {
        return Ok(());
    };
    match serde_json::from_slice::<Notice>(payload) {
        // The unit attentions of a change of a gateway that keeps no log in the object
        // (older riser); otherwise the log had them.
        Ok(n) if n.from != sh.gateway && sh.seq.load(Ordering::Acquire) == 0 => queue_uas(lun, &n.uas),
        Ok(_) => {}
        Err(e) => log::warn!("LUN {}: a notify on {} that is not riser's ({e}) ignored", lun.id(), sh.describe()),
    }
    Ok(())
}

/// Queues unit attentions for the I_T nexuses of this gateway that are among `uas`.
fn queue_uas(lun: &Lun, uas: &[(String, u16)]) {
    if uas.is_empty() {
        return;
    }
    let mut g = lun.lock();
    queue_uas_locked(&mut g, uas);
    lun.refresh_attn(&g);
}

fn queue_uas_locked(g: &mut LunState, uas: &[(String, u16)]) {
    for (nexus, asc) in uas {
        let Some(key) = g.nexuses.get_key_value(nexus.as_str()).map(|(k, _)| k.clone()) else {
            continue;
        };
        g.add_ua(&key, Asc(*asc));
    }
}

/// The unit attentions a PR OUT queued in a scratch state, for the notice.
fn raised(scratch: &LunState) -> Vec<(String, u16)> {
    super::raised(scratch).into_iter().map(|(k, a)| (k.to_string(), a.0)).collect()
}

/// PR OUT against the shared state (on a worker of the pool; one at a time per LUN).
pub(super) fn run(lun: &Lun, nexus: &Nexus, req: &PrOutReq) -> CmdResult<()> {
    let Some(sh) = lun.pr_shared() else {
        return Err(CmdError::internal());
    };
    let _one = lun.pr_io_lock();
    let failed = |what: &str, e: &SharedError| {
        log::error!(
            "LUN {}: PERSISTENT RESERVE OUT (service action {:#x}) from {}: cannot {what} the shared reservation state {}: {e}",
            lun.id(),
            req.sa,
            nexus.initiator_port(),
            sh.describe()
        );
        comm_failure()
    };
    for _ in 0..MAX_ATTEMPTS {
        let (cur, version) = match sh.handle.read() {
            Ok(Some((bytes, v))) => match decode(&bytes) {
                Ok(cur) => (cur, Some(v)),
                Err(why) => {
                    log::error!(
                        "LUN {}: PERSISTENT RESERVE OUT (service action {:#x}) from {} fails: the shared reservation state in {} cannot be decoded ({why}; written by a newer riser?); it is left as it is, PERSISTENT RESERVE IN and the I/O checks keep using the last state this gateway read",
                        lun.id(),
                        req.sa,
                        nexus.initiator_port(),
                        sh.describe()
                    );
                    return Err(unusable());
                }
            },
            Ok(None) => (Shared { st: PrState::default(), uas: Some(UaLog::default()) }, None),
            Err(e) => return Err(failed("read", &e)),
        };
        // The copy read is fresh: take it (with the unit attentions of changes this
        // gateway had missed).
        apply(lun, sh, &cur, version.unwrap_or(0));
        let mut scratch = LunState { pr: cur.st.clone(), ..LunState::default() };
        let r = apply_pr_out(&mut scratch, nexus, req);
        if r.is_err() || scratch.pr == cur.st {
            // Nothing to write.
            return r;
        }
        let uas = raised(&scratch);
        let next = Shared { st: scratch.pr, uas: Some(cur.uas.clone().unwrap_or_default().next(uas.clone())) };
        let bytes = encode(&next).map_err(|_| CmdError::internal())?;
        match sh.handle.write(&bytes, version) {
            Ok(v) => {
                // Its own unit attentions come with the log's new entry.
                apply(lun, sh, &next, v);
                let notice = serde_json::to_vec(&Notice { from: sh.gateway, uas }).unwrap_or_default();
                if let Err(e) = sh.handle.notify(&notice) {
                    // Not GOOD: a gateway that may still enforce the previous state is
                    // neither following nor fenced. The change stays in the object (every
                    // gateway that reads it honours it); the initiator sees the failure
                    // and may retry, which then finds the state already changed.
                    log::error!(
                        "LUN {}: PERSISTENT RESERVE OUT (service action {:#04x}) fails: the change is in {}, but a gateway that did not acknowledge it could not be fenced either ({e}): it may enforce the previous state until it re-reads the object",
                        lun.id(),
                        req.sa,
                        sh.describe()
                    );
                    return Err(comm_failure());
                }
                return Ok(());
            }
            Err(SharedError::Changed) => continue,
            Err(e) => return Err(failed("write", &e)),
        }
    }
    log::error!(
        "LUN {}: the shared reservation state {} changed under {MAX_ATTEMPTS} attempts in a row; PERSISTENT RESERVE OUT fails",
        lun.id(),
        sh.describe()
    );
    Err(comm_failure())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pr::{Registration, Reservation};

    fn nexus(init: &str, isid: u64, tpgt: u16) -> Nexus {
        Nexus::new(init, isid, "iqn.2016-06.io.riser:gw", tpgt)
    }

    fn req(sa: u8, ty: u8, key: u64, sark: u64, all_tg_pt: bool) -> PrOutReq {
        PrOutReq { sa, scope: 0, ty, key, sark, register: matches!(sa, 0 | 6), aptpl: false, all_tg_pt, ..PrOutReq::default() }
    }

    #[test]
    fn shared_encoding_round_trips_with_aptpl_and_all_tg_pt() {
        let x = nexus("iqn.x", 1, 1);
        let mut st = PrState { generation: 4, aptpl: false, ..PrState::default() };
        st.regs.push(Registration { key: 0xA, nexus: x.key().clone(), transport_id: x.transport_id(), rel_target_port: 1, all_tg_pt: true });
        st.reservation = Some(Reservation { ty: 1, holder: x.key().clone() });
        let sh = Shared { st: st.clone(), uas: Some(UaLog::default().next(vec![("a|b".into(), 0x2A05)])) };
        let bytes = encode(&sh).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(FORMAT) && text.contains("\"aptpl\": false") && text.contains("\"all_tg_pt\": true"), "{text}");
        assert_eq!(decode(&bytes).unwrap(), sh);
        // What an older riser reads of it: the state (the log is beside it, unchecked).
        assert_eq!(decode_as(&bytes, Uuid::nil(), 0, FORMAT).unwrap(), st);
        // And an object an older riser wrote (no log) reads, without one.
        let old = encode_as(&st, Uuid::nil(), 0, FORMAT, true).unwrap();
        assert_eq!(decode(&old).unwrap(), Shared { st: st.clone(), uas: None });
        // Empty: nothing stored yet.
        assert_eq!(decode(b"").unwrap(), Shared { st: PrState::default(), uas: Some(UaLog::default()) });
        // The local APTPL file's format is not the shared one.
        let local = crate::pr::store::encode(&st, Uuid::nil(), 0).unwrap();
        assert!(decode(&local).unwrap_err().contains("format"));
        // A newer version is refused, not read as empty.
        let newer = String::from_utf8(old).unwrap().replace("\"version\": 1", "\"version\": 2");
        assert!(decode(newer.as_bytes()).unwrap_err().contains("version 2"));
        // A notice round-trips.
        let n = Notice { from: 7, uas: vec![("a|b".into(), 0x2A05)] };
        assert_eq!(serde_json::from_slice::<Notice>(&serde_json::to_vec(&n).unwrap()).unwrap(), n);
    }

    /// The log keeps the last UA_LOG_ENTRIES changes and says whether it reaches back to a
    /// sequence number.
    #[test]
    fn the_unit_attention_log_is_bounded_and_knows_what_it_lacks() {
        let mut l = UaLog::default();
        assert_eq!(l.since(0), Some(vec![]));
        for i in 1..=20u16 {
            let uas = if i % 2 == 0 { vec![(format!("n{i}"), 0x2A05)] } else { vec![] };
            l = l.next(uas);
        }
        assert_eq!(l.seq, 20);
        assert_eq!(l.log.len(), UA_LOG_ENTRIES);
        assert_eq!(l.since(20), Some(vec![]));
        assert_eq!(l.since(17), Some(vec![("n18".into(), 0x2A05), ("n20".into(), 0x2A05)]));
        // Entries 5..20 are kept: from 4 on is complete, from 3 it is not.
        assert!(l.since(4).is_some());
        assert_eq!(l.since(3), None);
        // A sequence number from the future (the object was replaced by an older riser's
        // and started again): not complete.
        assert_eq!(l.since(21), None);
        // However many nexuses a change touches, the object stays small.
        let many: Vec<(String, u16)> = (0..1000).map(|i| (format!("n{i}"), 0x2A05)).collect();
        let l = l.next(many.clone()).next(many);
        assert_eq!(l.log.len(), 1);
        assert_eq!(l.since(21), Some((0..1000).map(|i| (format!("n{i}"), 0x2A05)).collect()));
        assert_eq!(l.since(20), None);
    }

    /// The read-modify-write of two gateways on one state: each applies its PR OUT to the
    /// copy it read, as `run` does; the second one, having read before the first wrote,
    /// redoes its change on the new copy (what the compare-and-swap forces).
    #[test]
    fn changes_made_through_two_gateways_merge() {
        let xa = nexus("iqn.x", 1, 1);
        let xb = nexus("iqn.x", 1, 2);
        let yb = nexus("iqn.y", 2, 2);
        let base = PrState::default();
        // Gateway A: X registers (per nexus) and reserves WRITE EXCLUSIVE.
        let mut a = LunState { pr: base.clone(), ..LunState::default() };
        apply_pr_out(&mut a, &xa, &req(0, 0, 0, 0xA, false)).unwrap();
        apply_pr_out(&mut a, &xa, &req(1, 1, 0xA, 0, false)).unwrap();
        // Gateway B read `base` meanwhile; its write is refused, it re-reads A's state and
        // applies Y's registration to it.
        let mut b = LunState { pr: a.pr.clone(), ..LunState::default() };
        apply_pr_out(&mut b, &yb, &req(0, 0, 0, 0xB, false)).unwrap();
        assert_eq!(b.pr.regs.len(), 2);
        assert!(b.pr.reservation.is_some());
        // X through B is another I_T nexus: not registered, its write conflicts.
        assert!(crate::pr::conflicts(&b, xb.key(), crate::pr::PrClass::Write));
        assert!(!crate::pr::conflicts(&b, xa.key(), crate::pr::PrClass::Write));
        // Y preempts X through B: X's registration and reservation are gone, and X's nexus
        // on A gets REGISTRATIONS PREEMPTED (carried to A in the notice).
        apply_pr_out(&mut b, &yb, &req(4, 1, 0xB, 0xA, false)).unwrap();
        assert_eq!(b.pr.regs.len(), 1);
        assert_eq!(b.pr.reservation.as_ref().map(|r| r.holder.clone()), Some(yb.key().clone()));
        let uas = raised(&b);
        assert_eq!(uas, vec![(xa.key().to_string(), Asc::REGISTRATIONS_PREEMPTED.0)]);
    }

    #[test]
    fn all_tg_pt_registration_covers_every_target_port() {
        let xa = nexus("iqn.x", 1, 1);
        let xb = nexus("iqn.x", 1, 2);
        let x_other_isid = nexus("iqn.x", 9, 2);
        let yb = nexus("iqn.y", 2, 2);
        let mut st = LunState::default();
        apply_pr_out(&mut st, &xa, &req(0, 0, 0, 0xA, true)).unwrap();
        apply_pr_out(&mut st, &xa, &req(1, 1, 0xA, 0, false)).unwrap();
        // X through B holds the reservation too; another ISID is another initiator port.
        assert!(!crate::pr::conflicts(&st, xb.key(), crate::pr::PrClass::Write));
        assert!(crate::pr::conflicts(&st, x_other_isid.key(), crate::pr::PrClass::Write));
        assert!(crate::pr::conflicts(&st, yb.key(), crate::pr::PrClass::Write));
        // Registering again through B is a key change of the same registration (REGISTER
        // with the current key), and RELEASE through B ends the reservation.
        assert_eq!(apply_pr_out(&mut st, &xb, &req(0, 0, 0, 0xC, false)).unwrap_err(), CmdError::reservation_conflict());
        apply_pr_out(&mut st, &xb, &req(2, 1, 0xA, 0, false)).unwrap();
        assert!(st.pr.reservation.is_none());
        assert_eq!(st.pr.regs.len(), 1);
        // Unregistering through B removes the one registration.
        apply_pr_out(&mut st, &xb, &req(0, 0, 0xA, 0, false)).unwrap();
        assert!(st.pr.regs.is_empty());
    }
}
