//! The state of a logical unit that several gateways export (an RBD image behind two riser
//! processes) that is neither a persistent reservation (`pr_shared`) nor a reset
//! (`lu_events`): the SPC-2 reservation (RESERVE/RELEASE, which VMware and Windows
//! clusters still use) and the shared mode parameters (caching page WCE, control page
//! D_SENSE and SWP). It belongs to the logical unit, not to the gateway answering, so it
//! lives with the device: in its [`SharedState`](riser_bdev::SharedState) of purpose
//! [`PURPOSE`] (for RBD the RADOS object `riser_lu_state.<image id>` next to the image).
//! A RESERVE through gateway A conflicts through gateway B; a software write protect set
//! through B refuses writes through A.
//!
//! * **Checks stay local.** Commands are checked against the LUN's in-memory copy
//!   (`LunState::spc2_holder`, the mode bits), as on any LUN. The copy is replaced when
//!   the object changes: the device's watch thread calls the notify callback, which
//!   re-reads the object before the device acknowledges the notify.
//! * **Changes run on a worker** of the PR OUT pool (`pr::work`), in the LUN's queue with
//!   its PERSISTENT RESERVE OUTs (so the two kinds of reservation are decided in order): read
//!   the object and its version, apply the change to that copy, write it back if still at
//!   that version (compare-and-swap; otherwise read again and redo), take it locally, then
//!   notify and wait (bounded by the device) until every watching gateway has re-read it.
//!   The command (RESERVE, RELEASE, MODE SELECT) completes after that; no reactor waits.
//!   A cluster that does not answer: HARDWARE ERROR, LOGICAL UNIT COMMUNICATION FAILURE,
//!   nothing changed.
//! * **The holder's I_T nexus goes** (logout, connection loss), or a reset: the gateway
//!   that had the nexus (or took the reset) clears the holder in the object, on a worker.
//!   An initiator may log out through A and RESERVE through B at once, faster than A's
//!   worker writes the release: a RESERVE that finds the LU reserved through another
//!   gateway looks again for [`RELEASE_GRACE`] before it answers RESERVATION CONFLICT.
//! * **The holder's gateway is fenced** (it died, hung or was cut off, and its group
//!   fenced it: [`riser_bdev::GatewayGroup`]): its I_T nexuses are gone with it, so each
//!   surviving gateway releases a reservation held through one of the target port groups
//!   that gateway served (once per fencing; the compare-and-swap makes it one release).
//!   Without a group (or for a gateway fenced before this one started) the reservation
//!   stays until a LOGICAL UNIT RESET through any gateway ends it, the way initiators break
//!   a stale SPC-2 reservation.
//! * **A gateway that starts** reads the object when it opens the LUN.
//!
//! The object is JSON, `format` [`FORMAT`]; one that cannot be decoded is logged and left
//! alone: the LUN keeps what it had, and changes fail (never overwrite what a newer riser
//! wrote).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use std::collections::HashSet;
use std::sync::Mutex;

use riser_bdev::{GroupEvent, MemberState, SharedError, SharedStateHandle};
use serde::{Deserialize, Serialize};

use crate::lun::{Lun, ResetKind, MODE_DSENSE, MODE_SWP, MODE_WCE};
use crate::pr::work::{self, Deferred};
use crate::sense::{Asc, CmdError, CmdResult};
use crate::task::Nexus;

/// The device's shared state this module uses ("lu" is the reset announcements').
pub(crate) const PURPOSE: &str = "lu_state";
/// The `format` field of the object.
pub(crate) const FORMAT: &str = "riser-shared-lu-state";
/// The mode bits that are the logical unit's (MODE_NO_MEDIUM is the removable medium's
/// state of one gateway's LUN, not shared).
pub(crate) const SHARED_MODE: u32 = MODE_WCE | MODE_DSENSE | MODE_SWP;
/// How long a RESERVE that finds the LU reserved through another gateway looks again for
/// a release on its way (see the module's comment).
pub(crate) const RELEASE_GRACE: Duration = Duration::from_millis(500);
const GRACE_STEP: Duration = Duration::from_millis(20);
/// Compare-and-swap rounds before a change gives up.
const MAX_ATTEMPTS: usize = 32;

/// The logical unit's shared state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LuState {
    /// The SPC-2 reservation holder's I_T nexus key.
    pub holder: Option<String>,
    /// Mode bits, [`SHARED_MODE`] only.
    pub mode: u32,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Stored {
    format: String,
    #[serde(default)]
    spc2_holder: Option<String>,
    #[serde(default)]
    wce: bool,
    #[serde(default)]
    d_sense: bool,
    #[serde(default)]
    swp: bool,
}

fn encode(st: &LuState) -> Vec<u8> {
    let s = Stored {
        format: FORMAT.to_string(),
        spc2_holder: st.holder.clone(),
        wce: st.mode & MODE_WCE != 0,
        d_sense: st.mode & MODE_DSENSE != 0,
        swp: st.mode & MODE_SWP != 0,
    };
    serde_json::to_vec_pretty(&s).unwrap_or_default()
}

/// The state in the object's bytes; `None` when empty (the device creates the object empty
/// to watch it: nothing was stored yet).
fn decode(bytes: &[u8]) -> Result<Option<LuState>, String> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let s: Stored = serde_json::from_slice(bytes).map_err(|e| format!("not JSON riser reads: {e}"))?;
    if s.format != FORMAT {
        return Err(format!("format {:?}, not {FORMAT:?}", s.format));
    }
    let mut mode = 0;
    for (on, bit) in [(s.wce, MODE_WCE), (s.d_sense, MODE_DSENSE), (s.swp, MODE_SWP)] {
        if on {
            mode |= bit;
        }
    }
    Ok(Some(LuState { holder: s.spc2_holder, mode }))
}

/// A LUN's handle on its device's shared LU state.
pub(crate) struct SharedLu {
    handle: SharedStateHandle,
    /// The LUN (tasks on the workers hold it while they run).
    me: Weak<Lun>,
    /// The object version the LUN's copy is from: an older read never replaces it.
    applied: AtomicU64,
}

impl SharedLu {
    /// The shared LU state of `lun`'s device, when it has one (logged when it cannot be
    /// opened: SPC-2 reservations and mode parameters are then this gateway's only).
    pub(crate) fn open(lun: &Arc<Lun>) -> Option<SharedLu> {
        let weak = Arc::downgrade(lun);
        let w = weak.clone();
        // The store acknowledges a notify only once the state was re-read (logged inside).
        let on_notify = Box::new(move |_payload: &[u8]| match w.upgrade() {
            Some(l) => load(&l),
            None => Ok(()),
        });
        match lun.bdev().shared_state(PURPOSE, on_notify)? {
            Ok(handle) => {
                log::info!("LUN {} ({}): SPC-2 reservations and mode parameters live in {}", lun.id(), lun.bdev().info().name, handle.describe());
                Some(SharedLu { handle, me: weak, applied: AtomicU64::new(0) })
            }
            Err(e) => {
                log::error!(
                    "LUN {} ({}): cannot open the device's shared LU state: {e}; SPC-2 reservations and mode parameters are this gateway's only",
                    lun.id(),
                    lun.bdev().info().name
                );
                None
            }
        }
    }

    fn describe(&self) -> String {
        self.handle.describe()
    }
}

/// What a LUN whose object does not exist yet has.
fn initial(lun: &Lun) -> LuState {
    LuState { holder: None, mode: lun.default_mode_bits() & SHARED_MODE }
}

/// Makes `st` (read at `version`) the LUN's copy, unless the copy is from a later version.
/// Changed mode parameters raise MODE PARAMETERS CHANGED for every nexus of this gateway
/// but `except` (the one that changed them).
fn apply(lun: &Lun, sh: &SharedLu, st: &LuState, version: u64, except: Option<&Arc<str>>) {
    let mut g = lun.lock();
    if version < sh.applied.load(Ordering::Acquire) {
        return;
    }
    sh.applied.store(version, Ordering::Release);
    if g.spc2_holder.as_deref() != st.holder.as_deref() {
        g.spc2_holder = st.holder.as_deref().map(Arc::from);
        g.spc2_epoch = 0;
    }
    let cur = lun.mode_bits() & SHARED_MODE;
    if cur != st.mode & SHARED_MODE {
        for bit in [MODE_WCE, MODE_DSENSE, MODE_SWP] {
            lun.set_mode_bit(bit, st.mode & bit != 0);
        }
        g.add_ua_all(Asc::MODE_PARAMETERS_CHANGED, except);
    }
    lun.refresh_attn(&g);
}

/// Re-reads the object into the LUN's copy (at creation, after a notify or a re-watch).
/// `Err` (logged) when it cannot be read or decoded: the copy is then left as it was.
pub(crate) fn load(lun: &Lun) -> Result<(), String> {
    let Some(sh) = lun.lu_shared() else {
        return Ok(());
    };
    let r = match sh.handle.read() {
        Ok(Some((bytes, version))) => decode(&bytes).map(|st| apply(lun, sh, &st.unwrap_or_else(|| initial(lun)), version, None)),
        Ok(None) => {
            apply(lun, sh, &initial(lun), 0, None);
            Ok(())
        }
        Err(e) => Err(format!("cannot read it: {e}")),
    };
    if let Err(why) = &r {
        log::error!("LUN {}: the shared LU state in {}: {why}; keeping the last one read", lun.id(), sh.describe());
    }
    r
}

fn comm_failure() -> CmdError {
    CmdError::check(crate::sense::SenseKey::HardwareError, Asc::new(0x08, 0x00))
}

/// Why a change function refused.
enum Refusal {
    /// The answer to the command.
    Cmd(CmdError),
    /// Reserved through another gateway's nexus: may be released any moment.
    HeldElsewhere,
}

/// Reads, changes with `f` (`Ok(false)`: nothing to change), writes by compare-and-swap,
/// applies locally, notifies. On a worker.
fn change(lun: &Lun, what: &str, except: Option<&Arc<str>>, f: &dyn Fn(&mut LuState) -> Result<bool, Refusal>) -> Result<(), Refusal> {
    let Some(sh) = lun.lu_shared() else {
        return Err(Refusal::Cmd(CmdError::internal()));
    };
    let failed = |how: &str, e: &dyn std::fmt::Display| {
        log::error!("LUN {}: {what}: cannot {how} the shared LU state {}: {e}", lun.id(), sh.describe());
        Refusal::Cmd(comm_failure())
    };
    for _ in 0..MAX_ATTEMPTS {
        let (mut st, version) = match sh.handle.read() {
            Ok(Some((bytes, v))) => match decode(&bytes) {
                Ok(st) => (st.unwrap_or_else(|| initial(lun)), Some(v)),
                // Never overwritten: it may be a newer riser's.
                Err(why) => return Err(failed("use", &why)),
            },
            Ok(None) => (initial(lun), None),
            Err(e) => return Err(failed("read", &e)),
        };
        let read = st.clone();
        if !f(&mut st)? || st == read {
            apply(lun, sh, &read, version.unwrap_or(0), except);
            return Ok(());
        }
        match sh.handle.write(&encode(&st), version) {
            Ok(v) => {
                apply(lun, sh, &st, v, except);
                if let Err(e) = sh.handle.notify(b"lu_state") {
                    // Not GOOD: a gateway that did not acknowledge could not be fenced, so
                    // it may still act on the previous state. The change is in the object.
                    log::error!(
                        "LUN {}: {what} fails: the change is in {}, but a gateway that did not acknowledge it could not be fenced either ({e}): it may act on the previous state until it re-reads it",
                        lun.id(),
                        sh.describe()
                    );
                    return Err(Refusal::Cmd(comm_failure()));
                }
                return Ok(());
            }
            Err(SharedError::Changed) => continue,
            Err(e) => return Err(failed("write", &e)),
        }
    }
    log::error!("LUN {}: {what}: the shared LU state {} changed under {MAX_ATTEMPTS} attempts in a row", lun.id(), sh.describe());
    Err(Refusal::Cmd(comm_failure()))
}

fn cmd(r: Result<(), Refusal>) -> CmdResult<()> {
    match r {
        Ok(()) => Ok(()),
        Err(Refusal::Cmd(e)) => Err(e),
        Err(Refusal::HeldElsewhere) => Err(CmdError::reservation_conflict()),
    }
}

/// Queues `task` in the LUN's queue on the pool; the command's result to poll.
fn defer(lun: &Lun, what: &'static str, task: impl FnOnce(&Lun) -> CmdResult<()> + Send + 'static) -> CmdResult<Arc<Deferred>> {
    let Some(me) = lun.lu_shared().and_then(|s| s.me.upgrade()) else {
        return Err(CmdError::internal());
    };
    let (d, done) = Deferred::new();
    let serial = lun.pr_serial();
    let mut q = serial.lock();
    let pool = work::pool();
    let r = pool.submit(serial, &mut q, Box::new(move || done.finish(task(&me))));
    if let Err(why) = r {
        if why != work::Refused::Full || q.log_refusal() {
            log::warn!("LUN {}: {what} not started ({why:?}): the LUN's queue of reservation work is full or has no worker", lun.id());
        }
        return Err(why.to_error());
    }
    Ok(d)
}

/// Queues work no command waits for (a release after a nexus loss or a reset).
fn queue(lun: &Lun, what: &'static str, task: impl FnOnce(&Lun) + Send + 'static) {
    let Some(me) = lun.lu_shared().and_then(|s| s.me.upgrade()) else {
        return;
    };
    let serial = lun.pr_serial();
    let mut q = serial.lock();
    if let Err(why) = work::pool().submit(serial, &mut q, Box::new(move || task(&me))) {
        log::error!("LUN {}: {what} not queued ({why:?}): other gateways keep the old state until the next change", lun.id());
    }
}

/// RESERVE(6)/(10) on a shared LUN (the CDB checked).
pub(crate) fn reserve(lun: &Lun, nexus: &Arc<Nexus>) -> CmdResult<Arc<Deferred>> {
    let n = nexus.clone();
    defer(lun, "RESERVE", move |lun| {
        let me: &str = n.key();
        let t0 = Instant::now();
        loop {
            let r = change(lun, "RESERVE", None, &|st| {
                // With persistent reservations in use RESERVE conflicts (SPC-4 5.12.3).
                let g = lun.lock();
                if !g.pr.regs.is_empty() || g.pr.reservation.is_some() {
                    return Err(Refusal::Cmd(CmdError::reservation_conflict()));
                }
                match st.holder.as_deref() {
                    Some(h) if h != me => {
                        // Through this gateway: its release is queued before this.
                        if g.nexuses.contains_key(h) {
                            Err(Refusal::Cmd(CmdError::reservation_conflict()))
                        } else {
                            Err(Refusal::HeldElsewhere)
                        }
                    }
                    Some(_) => Ok(false),
                    None => {
                        st.holder = Some(me.to_string());
                        Ok(true)
                    }
                }
            });
            match r {
                Err(Refusal::HeldElsewhere) if t0.elapsed() < RELEASE_GRACE => std::thread::sleep(GRACE_STEP),
                r => {
                    if r.is_ok() {
                        // This session of the nexus holds it now (the object knows the nexus only).
                        let mut g = lun.lock();
                        if g.spc2_holder.as_deref() == Some(me) {
                            g.spc2_taken_by(&n);
                        }
                    }
                    return cmd(r);
                }
            }
        }
    })
}

/// RELEASE(6)/(10) on a shared LUN: releasing someone else's (or no) reservation succeeds
/// without effect.
pub(crate) fn release(lun: &Lun, nexus: &Arc<Nexus>) -> CmdResult<Arc<Deferred>> {
    let n = nexus.clone();
    defer(lun, "RELEASE", move |lun| {
        let me: &str = n.key();
        cmd(change(lun, "RELEASE", None, &|st| {
            let g = lun.lock();
            if !g.pr.regs.is_empty() || g.pr.reservation.is_some() {
                return Err(Refusal::Cmd(CmdError::reservation_conflict()));
            }
            Ok(st.holder.as_deref() == Some(me) && st.holder.take().is_some())
        }))
    })
}

/// MODE SELECT changed the shared mode bits to `bits`.
pub(crate) fn set_mode(lun: &Lun, nexus: &Arc<Nexus>, bits: u32) -> CmdResult<Arc<Deferred>> {
    let n = nexus.clone();
    defer(lun, "MODE SELECT", move |lun| {
        cmd(change(lun, "MODE SELECT", Some(n.key()), &|st| {
            st.mode = bits & SHARED_MODE;
            Ok(true)
        }))
    })
}

fn release_if_held(lun: &Lun, key: &str) {
    let _ =
        change(lun, "release on the loss of the holder's I_T nexus", None, &|st| Ok(st.holder.as_deref() == Some(key) && st.holder.take().is_some()));
}

/// The target port group tag an I_T nexus key names (`...|target,t,0xTPGT`).
fn port_group_of(key: &str) -> Option<u32> {
    let (_, tpgt) = key.rsplit_once(",t,0x")?;
    u32::from_str_radix(tpgt, 16).ok()
}

/// Follows the device's gateway group, when it has one: a gateway fenced from now on takes
/// the SPC-2 reservation held through its target port groups with it (see the module's
/// comment). Members already fenced when this LUN starts are left alone: their port groups
/// may be served again by a gateway that rejoined.
pub(crate) fn follow_group(lun: &Arc<Lun>) {
    if lun.lu_shared().is_none() {
        return;
    }
    let Some(group) = lun.bdev().gateway_group() else {
        return;
    };
    let seen: HashSet<u64> = group.members().into_iter().filter(|m| m.state == MemberState::Fenced).map(|m| m.id).collect();
    let seen = Mutex::new(seen);
    let weak = Arc::downgrade(lun);
    // Weak: the group holds its subscribers.
    let g = Arc::downgrade(&group);
    group.subscribe(Box::new(move |ev: &GroupEvent| {
        if *ev != GroupEvent::Changed {
            return;
        }
        let (Some(lun), Some(group)) = (weak.upgrade(), g.upgrade()) else {
            return;
        };
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone: Vec<u32> = Vec::new();
        for m in group.members() {
            if m.state == MemberState::Fenced && seen.insert(m.id) {
                gone.extend(&m.served);
            }
        }
        drop(seen);
        let holder = lun.lock().spc2_holder.clone();
        if let Some(h) = holder.filter(|h| port_group_of(h).is_some_and(|t| gone.contains(&t))) {
            log::warn!("LUN {}: the gateway of the SPC-2 reservation holder {h} was fenced: the reservation is released", lun.id());
            queue(&lun, "release of a fenced gateway's reservation", move |l| release_if_held(l, &h));
        }
    }));
}

/// The I_T nexus `key` is gone: if it held the SPC-2 reservation, release it in the object.
pub(crate) fn nexus_lost(lun: &Lun, key: &Arc<str>) {
    let k = key.clone();
    queue(lun, "release on the loss of the holder's I_T nexus", move |l| release_if_held(l, &k));
}

/// A reset taken through this gateway: SPC-2 reservations end, and a cold reset returns
/// the mode parameters to their defaults (the other gateways applied the same locally on
/// the reset's announcement; this makes the object say so).
pub(crate) fn reset(lun: &Lun, kind: ResetKind) {
    let default = lun.default_mode_bits() & SHARED_MODE;
    queue(lun, "reset of the shared LU state", move |l| {
        let _ = change(l, "reset", None, &|st| {
            st.holder = None;
            if kind == ResetKind::TargetColdReset {
                st.mode = default;
            }
            Ok(true)
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_round_trips_and_refuses_other_formats() {
        let st = LuState { holder: Some("iqn.x,i,0x1|iqn.t,t,0x2".into()), mode: MODE_SWP | MODE_WCE };
        let bytes = encode(&st);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(FORMAT) && text.contains("\"swp\": true") && text.contains("\"d_sense\": false"), "{text}");
        assert_eq!(decode(&bytes).unwrap(), Some(st));
        // Empty: the object exists (to be watched), nothing stored yet.
        assert_eq!(decode(b"").unwrap(), None);
        assert!(decode(br#"{"format": "riser-shared-lu-state-v9", "swp": true}"#).unwrap_err().contains("format"));
        assert!(decode(b"garbage").is_err());
        assert_eq!(port_group_of("iqn.x,i,0x000000000001|iqn.t,t,0x000a"), Some(10));
        assert_eq!(port_group_of("garbage"), None);
        // Fields a newer writer left out read as off.
        assert_eq!(decode(br#"{"format": "riser-shared-lu-state"}"#).unwrap(), Some(LuState { holder: None, mode: 0 }));
    }
}
