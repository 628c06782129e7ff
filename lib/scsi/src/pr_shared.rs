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
//!   only then lets the device acknowledge the notify.
//! * **PERSISTENT RESERVE OUT runs on a worker of the bounded pool** ([`super::work`]; the
//!   executor polls the [`Deferred`] result; a full backlog answers BUSY): it reads the object and its version, applies the service action
//!   to that copy with the same code as a local LUN ([`apply_pr_out`]), writes the result
//!   back only if the object is still at that version (compare-and-swap; another
//!   gateway's change in between: read again and redo), takes the new state itself, then
//!   notifies and waits until every watching gateway has re-read the object (bounded,
//!   5 s for RBD). So once the initiator sees GOOD, every gateway that acknowledged honours
//!   the change. A gateway that did not acknowledge in time (killed, or cut off from the
//!   cluster) is logged, the command still completes GOOD (the change is in the cluster):
//!   a gateway that was cut off re-reads the object when its watch is re-established, and
//!   a gateway that starts reads it when it opens the LUN.
//! * **The cluster unreachable**: the worker's reads and writes fail after the cluster
//!   connection's operation timeout (30 s by default, `rados_osd_op_timeout`), and the PR
//!   OUT ends with HARDWARE ERROR, LOGICAL UNIT COMMUNICATION FAILURE, the state unchanged.
//!   No reactor waits for it.
//! * **Unit attentions** a change raises (REGISTRATIONS PREEMPTED, RESERVATIONS RELEASED...)
//!   travel in the notify's payload, and each gateway queues those of the I_T nexuses it
//!   knows (nexus keys name the target port, so each gateway's are its own). A gateway that
//!   misses the notify misses them.
//! * **APTPL**: the shared state always persists (it is the cluster's, and outlives every
//!   gateway: a gateway restart is not a power loss of the logical unit, whose medium is the
//!   image). The APTPL bit is kept and reported (PTPL_A); REPORT CAPABILITIES says PTPL_C.
//!   The local APTPL file is not used for such a LUN.
//! * **SPC-2 RESERVE/RELEASE** stay per gateway (not shared).
//!
//! The object holds the JSON of [`crate::pr_store`] in the format
//! `riser-shared-persistent-reservations` with the APTPL bit, device UUID nil and LUN 0:
//! the object's name ties it to the image, whatever UUID or LUN number each gateway gives
//! it. An object that cannot be decoded is logged and read as empty (the next PR OUT
//! replaces it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use riser_bdev::{Bdev, SharedError, SharedStateHandle};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{apply_pr_out, PrOutReq, PrState};
use crate::lun::{Lun, LunState};
use crate::pr_store::{decode_as, encode_as};
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
}

impl SharedPr {
    /// The shared state of `bdev`, when it has one; `weak` is the LUN being built.
    pub fn open(bdev: &Arc<dyn Bdev>, lun_id: u64, weak: Weak<Lun>) -> Option<SharedPr> {
        let cb = Box::new(move |payload: &[u8]| {
            if let Some(lun) = weak.upgrade() {
                on_notify(&lun, payload);
            }
        });
        match bdev.shared_state("pr", cb)? {
            Ok(handle) => {
                log::info!("LUN {lun_id} ({}): persistent reservations live in {}", bdev.info().name, handle.describe());
                Some(SharedPr { handle, gateway: Uuid::new_v4().as_u64_pair().0, applied: AtomicU64::new(0) })
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

/// The state in the object's bytes (empty: none yet).
fn decode(bytes: &[u8]) -> Result<PrState, String> {
    if bytes.is_empty() {
        return Ok(PrState::default());
    }
    decode_as(bytes, Uuid::nil(), 0, FORMAT)
}

fn encode(st: &PrState) -> std::io::Result<Vec<u8>> {
    encode_as(st, Uuid::nil(), 0, FORMAT, true)
}

fn comm_failure() -> CmdError {
    CmdError::check(SenseKey::HardwareError, Asc::new(0x08, 0x00))
}

/// Makes `st` (read at `version`) the LUN's copy, unless the copy is from a later version.
fn apply(lun: &Lun, sh: &SharedPr, st: PrState, version: u64) {
    let mut g = lun.lock();
    if version < sh.applied.load(Ordering::Acquire) {
        return;
    }
    sh.applied.store(version, Ordering::Release);
    if g.pr != st {
        g.pr = st;
        lun.refresh_attn(&g);
    }
}

/// Re-reads the object into the LUN's copy (at creation, after a notify, after a re-watch).
pub(crate) fn load(lun: &Lun) {
    let Some(sh) = lun.pr_shared() else {
        return;
    };
    match sh.handle.read() {
        Ok(Some((bytes, version))) => match decode(&bytes) {
            Ok(st) => apply(lun, sh, st, version),
            Err(why) => {
                log::error!("LUN {}: the shared reservation state in {} is unusable ({why}); keeping the last one read", lun.id(), sh.describe())
            }
        },
        Ok(None) => apply(lun, sh, PrState::default(), 0),
        Err(e) => log::warn!("LUN {}: cannot read the shared reservation state {}: {e}; keeping the last one read", lun.id(), sh.describe()),
    }
}

/// The device's watch thread: another (or this) gateway changed the state.
fn on_notify(lun: &Lun, payload: &[u8]) {
    load(lun);
    if payload.is_empty() {
        return;
    }
    let Some(sh) = lun.pr_shared() else {
        return;
    };
    match serde_json::from_slice::<Notice>(payload) {
        Ok(n) if n.from != sh.gateway => queue_uas(lun, &n.uas),
        Ok(_) => {}
        Err(e) => log::warn!("LUN {}: a notify on {} that is not riser's ({e}) ignored", lun.id(), sh.describe()),
    }
}

/// Queues unit attentions for the I_T nexuses of this gateway that are among `uas`.
fn queue_uas(lun: &Lun, uas: &[(String, u16)]) {
    if uas.is_empty() {
        return;
    }
    let mut g = lun.lock();
    for (nexus, asc) in uas {
        let Some(key) = g.nexuses.get_key_value(nexus.as_str()).map(|(k, _)| k.clone()) else {
            continue;
        };
        g.add_ua(&key, Asc(*asc));
    }
    lun.refresh_attn(&g);
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
            Ok(Some((bytes, v))) => {
                let st = decode(&bytes).unwrap_or_else(|why| {
                    log::warn!("LUN {}: the shared reservation state in {} is unusable ({why}); this change replaces it", lun.id(), sh.describe());
                    PrState::default()
                });
                (st, Some(v))
            }
            Ok(None) => (PrState::default(), None),
            Err(e) => return Err(failed("read", &e)),
        };
        let mut scratch = LunState { pr: cur.clone(), ..LunState::default() };
        let r = apply_pr_out(&mut scratch, nexus, req);
        if r.is_err() || scratch.pr == cur {
            // Nothing to write; the copy read is fresh, take it.
            apply(lun, sh, cur, version.unwrap_or(0));
            return r;
        }
        let bytes = encode(&scratch.pr).map_err(|_| CmdError::internal())?;
        match sh.handle.write(&bytes, version) {
            Ok(v) => {
                let uas = raised(&scratch);
                apply(lun, sh, scratch.pr, v);
                queue_uas(lun, &uas);
                let notice = serde_json::to_vec(&Notice { from: sh.gateway, uas }).unwrap_or_default();
                if let Err(e) = sh.handle.notify(&notice) {
                    log::warn!(
                        "LUN {}: the reservation change is in {}, but not every gateway acknowledged it ({e}): one is gone or cut off from the cluster, and reads the state when it is back",
                        lun.id(),
                        sh.describe()
                    );
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
        PrOutReq { sa, scope: 0, ty, key, sark, register: matches!(sa, 0 | 6), aptpl: false, all_tg_pt }
    }

    #[test]
    fn shared_encoding_round_trips_with_aptpl_and_all_tg_pt() {
        let x = nexus("iqn.x", 1, 1);
        let mut st = PrState { generation: 4, aptpl: false, ..PrState::default() };
        st.regs.push(Registration { key: 0xA, nexus: x.key().clone(), transport_id: x.transport_id(), rel_target_port: 1, all_tg_pt: true });
        st.reservation = Some(Reservation { ty: 1, holder: x.key().clone() });
        let bytes = encode(&st).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(FORMAT) && text.contains("\"aptpl\": false") && text.contains("\"all_tg_pt\": true"), "{text}");
        assert_eq!(decode(&bytes).unwrap(), st);
        // Empty: nothing stored yet.
        assert_eq!(decode(b"").unwrap(), PrState::default());
        // The local APTPL file's format is not the shared one.
        let local = crate::pr_store::encode(&st, Uuid::nil(), 0).unwrap();
        assert!(decode(&local).unwrap_err().contains("format"));
        // A notice round-trips.
        let n = Notice { from: 7, uas: vec![("a|b".into(), 0x2A05)] };
        assert_eq!(serde_json::from_slice::<Notice>(&serde_json::to_vec(&n).unwrap()).unwrap(), n);
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
