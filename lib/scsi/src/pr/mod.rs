//! Persistent reservations (SPC-4 5.12, 6.15, 6.16) and SPC-2 RESERVE/RELEASE (SPC-2 7.21,
//! 7.23), and the conflict rules every command is checked against.
//!
//! Where the state lives: in the LUN (memory, and the APTPL file of [`crate::pr::store`]
//! when there is a state directory), or, for a device shared by several gateways (an RBD
//! image), with the device, see [`shared`]. Either way every command is checked against
//! the LUN's in-memory copy ([`conflicts`]); only PERSISTENT RESERVE OUT differs: when
//! its change must be made durable (the APTPL file, or a device's shared state) it runs on
//! the bounded worker pool of [`work`] and completes later, the reactor polling meanwhile.
//!
//! When the in-memory state changes, for a PR OUT that must be durable: only once the
//! change is (after the file's write, fsync, rename and the directory's fsync, or the
//! shared object's write), in the same step the command's status is decided. SPC-4
//! 5.12.5 requires that registrations made under APTPL survive a power loss; a command
//! that ends in GOOD is durable, and one that fails (the write failed) changed nothing,
//! neither on disk nor in what other I_T nexuses saw meanwhile (applying at once and
//! undoing on failure would let others see, and act on, a state that never was, e.g. a
//! preemption that took back its REGISTRATIONS PREEMPTED). Until then commands from other
//! nexuses are checked against the state before it: they are ordered before the PR OUT,
//! as commands in the task set with the SIMPLE task attribute may be (SAM-5). PR OUTs of one LUN run one at a time in arrival order, so the
//! second of two makes durable a state that includes the first.
//!
//! ALL_TG_PT (SPC-4 5.12.7): a registration made with it is one entry that covers every I_T
//! nexus of its initiator port (through any target port, so through any gateway); without
//! it a registration is its I_T nexus's only. A reservation is held by the holder's
//! registration, so through every nexus that registration covers.
//!
//! SPEC_I_PT (SPC-4 5.12.7) and REGISTER AND MOVE (SPC-4 5.12.8) name other initiator ports
//! by iSCSI TransportID ([`parse_transport_id`]): format 01b names an initiator port (name
//! and ISID), format 00b an initiator device (the name alone), registered as a registration
//! whose initiator part is the name alone and that covers every initiator port (ISID) of
//! that name ([`Registration::covers`]), as Linux's target does. Both work the same on a
//! local LUN and on a device's shared state (they are service actions of [`apply_pr_out`]).

use std::sync::Arc;

use crate::cdb::{get_be64, put_be16, put_be32, put_be64, Cdb};
use crate::lun::{Lun, LunState};
use crate::sense::{Asc, CmdError, CmdResult};
use crate::task::Nexus;

pub(crate) mod shared;
pub(crate) mod store;
pub(crate) mod work;

/// Persistent reservation types (SPC-4 table 170).
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_RO: u8 = 5;
    pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
    pub const WRITE_EXCLUSIVE_AR: u8 = 7;
    pub const EXCLUSIVE_ACCESS_AR: u8 = 8;
}
use pr_type::*;

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
}

fn all_registrants(t: u8) -> bool {
    t == WRITE_EXCLUSIVE_AR || t == EXCLUSIVE_ACCESS_AR
}

/// One registered I_T nexus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub key: u64,
    pub nexus: Arc<str>,
    pub transport_id: Vec<u8>,
    pub rel_target_port: u16,
    /// Registered with ALL_TG_PT: covers the initiator port through every target port.
    pub all_tg_pt: bool,
}

/// The initiator port and the target port of a nexus key (`<initiator port>|<target port>`).
fn ports_of(nexus: &str) -> (&str, &str) {
    nexus.split_once('|').unwrap_or((nexus, ""))
}

impl Registration {
    /// Whether this is the registration of `nexus`: its own I_T nexus, or (ALL_TG_PT) any
    /// nexus of the same initiator port. A registration made for an initiator device (an
    /// iSCSI TransportID of format 00b: the name without `,i,0x<ISID>`) covers every
    /// initiator port of that name.
    pub fn covers(&self, nexus: &str) -> bool {
        if &*self.nexus == nexus {
            return true;
        }
        let (ri, rt) = ports_of(&self.nexus);
        let (ni, nt) = ports_of(nexus);
        let initiator = ri == ni || (!ri.contains(",i,0x") && ni.split_once(",i,0x").is_some_and(|(name, _)| name == ri));
        initiator && (self.all_tg_pt || rt == nt)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub ty: u8,
    /// The holder for non all-registrants types; for all-registrants types every
    /// registrant holds it and this is the nexus that created it.
    pub holder: Arc<str>,
}

#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub(crate) struct PrState {
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub reservation: Option<Reservation>,
    /// Persist through power loss: the last REGISTER (AND IGNORE EXISTING KEY) had APTPL=1
    /// (SPC-4 5.12.5); the state is then in the LUN's state file (see [`crate::pr::store`]).
    pub aptpl: bool,
}

impl PrState {
    fn reg(&self, nexus: &Arc<str>) -> Option<&Registration> {
        self.regs.iter().find(|r| r.covers(nexus))
    }

    fn is_holder(&self, nexus: &Arc<str>) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.ty) => self.reg(nexus).is_some(),
            Some(r) => &r.holder == nexus || self.reg(&r.holder).is_some_and(|h| h.covers(nexus)),
            None => false,
        }
    }

    /// Removes the registration of `nexus`, releasing the reservation when the holder goes
    /// away (SPC-4 5.12.11.2.3). Returns whether the reservation was released and its type.
    fn unregister(&mut self, nexus: &Arc<str>) -> Option<u8> {
        let i = self.regs.iter().position(|r| r.covers(nexus))?;
        let gone = self.regs.remove(i);
        let released = match &self.reservation {
            Some(r) if all_registrants(r.ty) => self.regs.is_empty(),
            Some(r) => gone.covers(&r.holder),
            None => false,
        };
        if released {
            self.reservation.take().map(|r| r.ty)
        } else {
            None
        }
    }
}

/// How reservations affect a command (SPC-4 table 54, SBC-3 table 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrClass {
    /// Allowed in the presence of any reservation.
    Allowed,
    /// Reads medium or state: conflicts with Exclusive Access types.
    Read,
    /// Changes medium or state: conflicts with every type.
    Write,
    /// MODE SENSE and friends: allowed under Write Exclusive, conflict under Exclusive
    /// Access (SPC-4 table 54), and conflict under an SPC-2 reservation.
    ReadState,
    /// PERSISTENT RESERVE IN/OUT: never conflicts with persistent reservations; OUT
    /// conflicts with an SPC-2 reservation held by another nexus.
    Pr,
    /// RESERVE / RELEASE (6/10): see SPC-4 5.12.3.
    Spc2,
    /// TEST UNIT READY, START STOP UNIT (start)...: allowed under persistent reservations,
    /// conflict under an SPC-2 reservation of another nexus (SPC-2 5.5.1).
    AllowedPr,
}

/// Whether `class` from `nexus` conflicts with the current reservations.
pub(crate) fn conflicts(st: &LunState, nexus: &Arc<str>, class: PrClass) -> bool {
    if let Some(h) = &st.spc2_holder {
        if h != nexus {
            // SPC-2 reservations: everything but a short list conflicts (SPC-2 5.5.1).
            // PERSISTENT RESERVE OUT is refused by pr_out itself; IN only reads.
            return !matches!(class, PrClass::Allowed | PrClass::Spc2 | PrClass::Pr);
        }
    }
    let Some(res) = &st.pr.reservation else {
        return false;
    };
    if st.pr.is_holder(nexus) {
        return false;
    }
    let registered = st.pr.reg(nexus).is_some();
    let exclusive_access = matches!(res.ty, EXCLUSIVE_ACCESS | EXCLUSIVE_ACCESS_RO | EXCLUSIVE_ACCESS_AR);
    let registrants_may_access = matches!(res.ty, WRITE_EXCLUSIVE_RO | EXCLUSIVE_ACCESS_RO | WRITE_EXCLUSIVE_AR | EXCLUSIVE_ACCESS_AR);
    if registrants_may_access && registered {
        return false;
    }
    match class {
        PrClass::Allowed | PrClass::Pr | PrClass::AllowedPr => false,
        PrClass::Spc2 => true,
        PrClass::Read | PrClass::ReadState => exclusive_access,
        PrClass::Write => true,
    }
}

// ------------------------------------------------------------------------------------
// PERSISTENT RESERVE IN

/// PERSISTENT RESERVE IN (SPC-4 6.15): builds the parameter data.
pub(crate) fn pr_in(lun: &Lun, cdb: &Cdb) -> CmdResult<Vec<u8>> {
    let st = lun.lock();
    let pr = &st.pr;
    match cdb.service_action() {
        0x00 => {
            // READ KEYS
            let mut v = vec![0u8; 8 + 8 * pr.regs.len()];
            put_be32(&mut v, 0, pr.generation);
            put_be32(&mut v, 4, (8 * pr.regs.len()) as u32);
            for (i, r) in pr.regs.iter().enumerate() {
                put_be64(&mut v, 8 + 8 * i, r.key);
            }
            Ok(v)
        }
        0x01 => {
            // READ RESERVATION
            let mut v = vec![0u8; 8];
            put_be32(&mut v, 0, pr.generation);
            if let Some(res) = &pr.reservation {
                v.resize(24, 0);
                put_be32(&mut v, 4, 16);
                // For all-registrants types the key is zero (SPC-4 6.15.3.3).
                let key = if all_registrants(res.ty) { 0 } else { pr.reg(&res.holder).map_or(0, |r| r.key) };
                put_be64(&mut v, 8, key);
                v[21] = res.ty & 0x0F; // scope 0 (LU)
            }
            Ok(v)
        }
        0x02 => {
            // REPORT CAPABILITIES (SPC-4 6.15.4)
            let mut v = vec![0u8; 8];
            put_be16(&mut v, 0, 8);
            v[2] = 0x10; // CRH: RESERVE/RELEASE handled per SPC-4 5.12.3
            v[2] |= 0x08; // SIP_C: SPEC_I_PT
            v[2] |= 0x04; // ATP_C: ALL_TG_PT
            if persists(lun) {
                v[2] |= 0x01; // PTPL_C: a state directory, or the device's shared state
            }
            v[3] = 0x80 | (0x1 << 4); // TMV, ALLOW COMMANDS = 001b
            if pr.aptpl {
                v[3] |= 0x01; // PTPL_A
            }
            // Supported types: WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
            v[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
            v[5] = 0x01;
            Ok(v)
        }
        0x03 => {
            // READ FULL STATUS (SPC-4 6.15.5)
            let mut v = vec![0u8; 8];
            put_be32(&mut v, 0, pr.generation);
            for r in &pr.regs {
                let mut d = vec![0u8; 24];
                put_be64(&mut d, 0, r.key);
                if let Some(res) = &pr.reservation {
                    if all_registrants(res.ty) || r.covers(&res.holder) {
                        d[12] |= 0x01; // R_HOLDER
                        d[13] = res.ty & 0x0F;
                    }
                }
                if r.all_tg_pt {
                    d[12] |= 0x02; // ALL_TG_PT: the descriptor stands for every target port
                }
                put_be16(&mut d, 18, r.rel_target_port);
                put_be32(&mut d, 20, r.transport_id.len() as u32);
                d.extend_from_slice(&r.transport_id);
                v.extend_from_slice(&d);
            }
            let n = (v.len() - 8) as u32;
            put_be32(&mut v, 4, n);
            Ok(v)
        }
        _ => Err(CmdError::invalid_cdb(1, Some(4))),
    }
}

// ------------------------------------------------------------------------------------
// PERSISTENT RESERVE OUT

/// Whether registrations can persist through power loss (PTPL_C): a state directory, or
/// a device whose shared state outlives every gateway.
fn persists(lun: &Lun) -> bool {
    lun.pr_store().is_some() || lun.pr_shared().is_some()
}

/// A PERSISTENT RESERVE OUT, decoded and checked (everything that does not depend on the
/// reservation state).
#[derive(Clone, Debug, Default)]
pub(crate) struct PrOutReq {
    pub sa: u8,
    pub scope: u8,
    pub ty: u8,
    pub key: u64,
    pub sark: u64,
    /// REGISTER or REGISTER AND IGNORE EXISTING KEY: APTPL and ALL_TG_PT count.
    pub register: bool,
    pub aptpl: bool,
    pub all_tg_pt: bool,
    /// REGISTER with SPEC_I_PT: the other initiator ports (or devices) to register.
    pub spec_i_pt: Vec<TransportId>,
    /// REGISTER AND MOVE: where the reservation goes (the initiator and the relative
    /// target port identifier), and whether the sender's registration goes (UNREG).
    pub move_to: Option<(TransportId, u16)>,
    pub unreg: bool,
}

/// An iSCSI TransportID (SPC-4 7.6.4.6) from a parameter list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TransportId {
    /// The initiator port (`name,i,0x<ISID>`, format 01b) or device (`name`, format 00b)
    /// as nexus keys spell it.
    pub initiator: String,
    /// The TransportID's bytes, as READ FULL STATUS reports them.
    pub bytes: Vec<u8>,
}

/// TransportIDs in one SPEC_I_PT list at most (beyond: INSUFFICIENT REGISTRATION
/// RESOURCES, as SPC-4 5.12.7 lets a device server that lacks room answer).
const MAX_SPEC_I_PT: usize = 64;

/// Parses the iSCSI TransportID at the start of `p` (`at`: its offset in the parameter
/// list, for the sense); returns it and its length.
pub(crate) fn parse_transport_id(p: &[u8], at: usize) -> CmdResult<(TransportId, usize)> {
    let bad = |byte: usize| CmdError::invalid_param(byte as u16, None);
    if p.len() < 4 {
        return Err(CmdError::param_list_length());
    }
    let format = p[0] >> 6;
    if p[0] & 0x0F != 0x05 || format > 1 {
        // Not iSCSI (the only transport riser serves), or a format iSCSI does not have.
        return Err(bad(at));
    }
    // SPC-4 wants at least 20 bytes, a multiple of 4; initiators that pad less (sg_persist
    // pads short names to 24 bytes in all, not always to a multiple of 4) are taken.
    let len = u16::from_be_bytes([p[2], p[3]]) as usize;
    if len == 0 {
        return Err(bad(at + 2));
    }
    if p.len() < 4 + len {
        return Err(CmdError::param_list_length());
    }
    let body = &p[4..4 + len];
    // NUL-terminated; a name that fills the field without one is taken whole.
    let name_end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let text = std::str::from_utf8(&body[..name_end]).map_err(|_| bad(at + 4))?;
    let initiator = if format == 0 {
        if text.is_empty() || text.contains(",i,") {
            return Err(bad(at + 4));
        }
        text.to_string()
    } else {
        let (name, isid) = text.split_once(",i,0x").or_else(|| text.split_once(",I,0X")).ok_or_else(|| bad(at + 4))?;
        let isid = u64::from_str_radix(isid, 16).ok().filter(|_| !name.is_empty() && isid.len() <= 12).ok_or_else(|| bad(at + 4))?;
        format!("{name},i,0x{isid:012x}")
    };
    Ok((TransportId { initiator, bytes: p[..4 + len].to_vec() }, 4 + len))
}

fn parse_pr_out(lun: &Lun, cdb: &Cdb, param: &[u8]) -> CmdResult<PrOutReq> {
    let sa = cdb.service_action();
    let scope = cdb.u8(2) >> 4;
    let ty = cdb.u8(2) & 0x0F;
    let len = cdb.be32(5) as usize;
    if sa > 0x07 {
        // REPLACE LOST RESERVATION is not supported.
        return Err(CmdError::invalid_cdb(1, Some(4)));
    }
    if len < 24 || param.len() < len {
        return Err(CmdError::param_list_length());
    }
    let param = &param[..len];
    let key = get_be64(param, 0);
    let sark = get_be64(param, 8);
    if sa == 0x07 {
        return parse_register_and_move(lun, param, key, sark);
    }
    let flags = param[20];
    let spec_i_pt = flags & 0x08 != 0;
    if spec_i_pt && sa != 0x00 {
        // SPEC_I_PT is REGISTER's only (SPC-4 6.16.3).
        return Err(CmdError::invalid_param(20, Some(3)));
    }
    if !spec_i_pt && len != 24 {
        return Err(CmdError::param_list_length());
    }
    // APTPL and ALL_TG_PT count only in REGISTER and REGISTER AND IGNORE EXISTING KEY
    // (SPC-4 6.16.4).
    let register = matches!(sa, 0x00 | 0x06);
    let aptpl = register && flags & 0x01 != 0;
    let all_tg_pt = register && flags & 0x04 != 0;
    if aptpl && !persists(lun) {
        // No state directory: persist through power loss is not offered (PTPL_C = 0).
        return Err(CmdError::invalid_param(20, Some(0)));
    }
    let mut req = PrOutReq { sa, scope, ty, key, sark, register, aptpl, all_tg_pt, ..PrOutReq::default() };
    if spec_i_pt {
        // The TransportIDs follow the 24 bytes, after their length (SPC-4 6.16.3).
        if len < 28 {
            return Err(CmdError::param_list_length());
        }
        let tpdl = cdb_be32(param, 24) as usize;
        if 28 + tpdl != len {
            return Err(CmdError::param_list_length());
        }
        let mut at = 28;
        while at < len {
            if req.spec_i_pt.len() == MAX_SPEC_I_PT {
                return Err(CmdError::illegal(Asc::INSUFFICIENT_REGISTRATION_RESOURCES));
            }
            let (tid, n) = parse_transport_id(&param[at..], at)?;
            req.spec_i_pt.push(tid);
            at += n;
        }
    }
    Ok(req)
}

fn cdb_be32(p: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

/// The parameter list of REGISTER AND MOVE (SPC-4 6.16.4, table 226): keys, UNREG and
/// APTPL (byte 17), the relative target port identifier (18..20) and one TransportID after
/// its length (20..24).
fn parse_register_and_move(lun: &Lun, param: &[u8], key: u64, sark: u64) -> CmdResult<PrOutReq> {
    let aptpl = param[17] & 0x01 != 0;
    let unreg = param[17] & 0x02 != 0;
    let rel_port = u16::from_be_bytes([param[18], param[19]]);
    let tpdl = cdb_be32(param, 20) as usize;
    if 24 + tpdl != param.len() || tpdl < 24 {
        return Err(CmdError::param_list_length());
    }
    if aptpl && !persists(lun) {
        return Err(CmdError::invalid_param(17, Some(0)));
    }
    if rel_port == 0 {
        return Err(CmdError::invalid_param(18, None));
    }
    let (tid, n) = parse_transport_id(&param[24..], 24)?;
    if n != tpdl {
        return Err(CmdError::param_list_length());
    }
    Ok(PrOutReq { sa: 0x07, key, sark, aptpl, unreg, move_to: Some((tid, rel_port)), ..PrOutReq::default() })
}

/// Applies `req` from `nexus` to `st` (the LUN's state, or a copy of the shared one).
pub(crate) fn apply_pr_out(st: &mut LunState, nexus: &Nexus, req: &PrOutReq) -> CmdResult<()> {
    let r = pr_out_locked(st, nexus, req);
    // REGISTER AND MOVE carries APTPL too (SPC-4 6.16.4).
    if r.is_ok() && (req.register || req.sa == 0x07) {
        st.pr.aptpl = req.aptpl;
    }
    r
}

/// How a PERSISTENT RESERVE OUT went on.
pub(crate) enum PrOutcome {
    /// Done: GOOD.
    Done,
    /// Running on the worker pool (the APTPL file's write, or the device's shared state);
    /// the executor polls it.
    Deferred(Arc<work::Deferred>),
}

/// PERSISTENT RESERVE OUT (SPC-4 6.16) with its parameter list `param`.
pub(crate) fn pr_out(lun: &Arc<Lun>, nexus: &Arc<Nexus>, cdb: &Cdb, param: &[u8]) -> CmdResult<PrOutcome> {
    let req = parse_pr_out(lun, cdb, param)?;
    let shared = lun.pr_shared().is_some();
    if !shared && lun.pr_store().is_none() {
        // Memory only: nothing to wait for.
        return pr_out_memory(lun, nexus, &req).map(|()| PrOutcome::Done);
    }
    // Held to look at the LUN's queue and to queue; never across I/O.
    let serial = lun.pr_serial();
    let mut q = serial.lock();
    if shared {
        // SPC-2 reservations stay per gateway: checked here, against this one's.
        if let Some(h) = &lun.lock().spc2_holder {
            if h != nexus.key() {
                return Err(CmdError::reservation_conflict());
            }
        }
    } else if q.idle() && !(req.aptpl || lun.lock().pr.aptpl) {
        // APTPL neither in force nor asked for: nothing to write. Done here, in order:
        // nothing is queued before it, and nothing can be while the queue's lock is held.
        return pr_out_memory(lun, nexus, &req).map(|()| PrOutcome::Done);
    }
    let (d, done) = work::Deferred::new();
    let (l, n) = (lun.clone(), nexus.clone());
    let sa = req.sa;
    let task: work::Task = if shared {
        Box::new(move || done.finish(shared::run(&l, &n, &req)))
    } else {
        Box::new(move || done.finish(pr_out_durable(&l, &n, &req)))
    };
    let pool = work::pool();
    if let Err(why) = pool.submit(serial, &mut q, task) {
        match why {
            work::Refused::Full if q.log_refusal() => log::warn!(
                "LUN {}: {} PERSISTENT RESERVE OUTs already wait for their turn; BUSY to the one (service action {:#x}) from {} ({} refused so far on this LUN; other LUNs are not affected)",
                lun.id(),
                pool.per_serial(),
                sa,
                nexus.initiator_port(),
                q.refused()
            ),
            // Logged above for the first and every 1000th: a flood must not flood the log.
            work::Refused::Full => {}
            work::Refused::NoThread => log::warn!(
                "LUN {}: PERSISTENT RESERVE OUT (service action {:#x}) from {} not started: no worker thread",
                lun.id(),
                sa,
                nexus.initiator_port()
            ),
        }
        return Err(why.to_error());
    }
    Ok(PrOutcome::Deferred(d))
}

/// PERSISTENT RESERVE OUT on a LUN's in-memory state, nothing to persist (on the caller's
/// thread).
fn pr_out_memory(lun: &Lun, nexus: &Nexus, req: &PrOutReq) -> CmdResult<()> {
    let mut st = lun.lock();
    if let Some(h) = &st.spc2_holder {
        if h != nexus.key() {
            return Err(CmdError::reservation_conflict());
        }
    }
    let r = apply_pr_out(&mut st, nexus, req);
    lun.refresh_attn(&st);
    r
}

/// The unit attentions a PR OUT queued in a scratch state (POWER ON aside: every nexus is
/// new there).
pub(crate) fn raised(scratch: &LunState) -> Vec<(Arc<str>, Asc)> {
    let mut v = Vec::new();
    for (k, n) in &scratch.nexuses {
        for a in &n.ua {
            if *a != Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET {
                v.push((k.clone(), *a));
            }
        }
    }
    v
}

/// PERSISTENT RESERVE OUT on a LUN with an APTPL file, on a worker of [`work`]: the change
/// is made on a copy of the state, the copy written to the file while APTPL is in force
/// (APTPL=0 removes the file, SPC-4 5.12.5), and only then made the LUN's state, with its
/// unit attentions. A failed write changes nothing. No lock a reactor takes is held across
/// the write (the LUN's is taken twice, briefly: to copy, then to install).
fn pr_out_durable(lun: &Lun, nexus: &Nexus, req: &PrOutReq) -> CmdResult<()> {
    let Some(store) = lun.pr_store() else {
        return Err(CmdError::internal());
    };
    // The LUN's work runs one task at a time already (its Serial); this keeps it so for
    // anything else that may one day change the state off the queue.
    let _one = lun.pr_io_lock();
    let mut scratch = {
        let st = lun.lock();
        if let Some(h) = &st.spc2_holder {
            if h != nexus.key() {
                return Err(CmdError::reservation_conflict());
            }
        }
        LunState { pr: st.pr.clone(), ..LunState::default() }
    };
    let before = scratch.pr.clone();
    apply_pr_out(&mut scratch, nexus, req)?;
    if scratch.pr != before && (scratch.pr.aptpl || before.aptpl) {
        #[cfg(test)]
        crate::pr::store::tests::before_write(store);
        let written = if scratch.pr.aptpl { store.save(&scratch.pr) } else { store.remove() };
        if let Err(e) = written {
            log::error!(
                "LUN {}: cannot {} persistent reservation state {}: {e}; PERSISTENT RESERVE OUT from {} fails, the reservation state is unchanged",
                lun.id(),
                if scratch.pr.aptpl { "write" } else { "remove" },
                store.path().display(),
                nexus.initiator_port()
            );
            return Err(CmdError::illegal(Asc::INSUFFICIENT_REGISTRATION_RESOURCES));
        }
    }
    let uas = raised(&scratch);
    let mut st = lun.lock();
    st.pr = scratch.pr;
    for (n, a) in &uas {
        st.add_ua(n, *a);
    }
    lun.refresh_attn(&st);
    Ok(())
}

fn pr_out_locked(st: &mut LunState, nexus: &Nexus, req: &PrOutReq) -> CmdResult<()> {
    let PrOutReq { sa, scope, ty, key, sark, .. } = *req;
    let me = nexus.key().clone();
    let my_key = st.pr.reg(&me).map(|r| r.key);
    match sa {
        0x00 | 0x06 => {
            // REGISTER / REGISTER AND IGNORE EXISTING KEY (SPC-4 5.12.7)
            let ignore = sa == 0x06;
            if !req.spec_i_pt.is_empty() && my_key.is_some() {
                // SPEC_I_PT from a registered I_T nexus (SPC-4 5.12.7).
                return Err(CmdError::illegal(Asc::INVALID_FIELD_IN_CDB));
            }
            match my_key {
                None => {
                    if !ignore && key != 0 {
                        return Err(CmdError::reservation_conflict());
                    }
                    let specified = if sark != 0 { specified(st, nexus, req)? } else { Vec::new() };
                    if sark != 0 {
                        st.pr.regs.push(Registration {
                            key: sark,
                            nexus: me.clone(),
                            transport_id: nexus.transport_id(),
                            rel_target_port: nexus.rel_target_port,
                            all_tg_pt: req.all_tg_pt,
                        });
                        st.pr.regs.extend(specified);
                        st.pr.generation = st.pr.generation.wrapping_add(1);
                    }
                }
                Some(k) => {
                    if !ignore && key != k {
                        return Err(CmdError::reservation_conflict());
                    }
                    if sark == 0 {
                        if let Some(ty) = st.pr.unregister(&me) {
                            released_ua(st, ty, &me);
                        }
                    } else if let Some(r) = st.pr.regs.iter_mut().find(|r| r.covers(&me)) {
                        r.key = sark;
                    }
                    st.pr.generation = st.pr.generation.wrapping_add(1);
                }
            }
            Ok(())
        }
        0x01 => {
            // RESERVE (SPC-4 5.12.9)
            let Some(k) = my_key else {
                return Err(CmdError::reservation_conflict());
            };
            if k != key {
                return Err(CmdError::reservation_conflict());
            }
            if scope != 0 {
                return Err(CmdError::invalid_cdb(2, Some(4)));
            }
            if !valid_type(ty) {
                return Err(CmdError::invalid_cdb(2, Some(0)));
            }
            match &st.pr.reservation {
                Some(res) => {
                    if st.pr.is_holder(&me) && res.ty == ty {
                        Ok(())
                    } else {
                        Err(CmdError::reservation_conflict())
                    }
                }
                None => {
                    st.pr.reservation = Some(Reservation { ty, holder: me });
                    Ok(())
                }
            }
        }
        0x02 => {
            // RELEASE (SPC-4 5.12.11.2)
            let Some(k) = my_key else {
                return Err(CmdError::reservation_conflict());
            };
            if k != key {
                return Err(CmdError::reservation_conflict());
            }
            let Some(res) = st.pr.reservation.clone() else {
                return Ok(());
            };
            if !st.pr.is_holder(&me) {
                return Ok(());
            }
            if scope != 0 || ty != res.ty {
                return Err(CmdError::illegal(Asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION));
            }
            st.pr.reservation = None;
            released_ua(st, res.ty, &me);
            Ok(())
        }
        0x03 => {
            // CLEAR (SPC-4 5.12.11.3)
            let Some(k) = my_key else {
                return Err(CmdError::reservation_conflict());
            };
            if k != key {
                return Err(CmdError::reservation_conflict());
            }
            let others: Vec<Arc<str>> = st.pr.regs.iter().filter(|r| !r.covers(&me)).map(|r| r.nexus.clone()).collect();
            st.pr.regs.clear();
            st.pr.reservation = None;
            st.pr.generation = st.pr.generation.wrapping_add(1);
            for n in others {
                st.add_ua(&n, Asc::RESERVATIONS_PREEMPTED);
            }
            Ok(())
        }
        0x04 | 0x05 => preempt(st, &me, my_key, key, sark, scope, ty),
        0x07 => register_and_move(st, nexus, my_key, req),
        _ => Err(CmdError::invalid_cdb(1, Some(4))),
    }
}

/// The nexus key of `initiator` through target port `rel_port` of the target `nexus` is a
/// nexus of (riser's relative target port identifier is the portal group tag, see
/// [`Nexus::new`]).
fn nexus_through(initiator: &str, nexus: &Nexus, rel_port: u16) -> Arc<str> {
    format!("{initiator}|{},t,0x{rel_port:04x}", nexus.target_name).into()
}

/// SPEC_I_PT (SPC-4 5.12.7): the registrations, with SARK, of the I_T nexus of each
/// TransportID through the target port the command came through (every target port with
/// ALL_TG_PT), to be made all or none: one already registered fails the command with
/// nothing registered. The sender's own nexus, listed or not, is registered by the caller.
fn specified(st: &LunState, nexus: &Nexus, req: &PrOutReq) -> CmdResult<Vec<Registration>> {
    let me = nexus.key();
    let mut new: Vec<Registration> = Vec::new();
    for (i, tid) in req.spec_i_pt.iter().enumerate() {
        let key = nexus_through(&tid.initiator, nexus, nexus.rel_target_port);
        let reg = Registration { key: req.sark, nexus: key, transport_id: tid.bytes.clone(), rel_target_port: nexus.rel_target_port, all_tg_pt: req.all_tg_pt };
        if reg.covers(me) && reg.nexus == *me {
            // The sender itself.
            continue;
        }
        // Registered already, or (an initiator device) covering a nexus that is.
        let taken = |n: &Arc<str>| {
            st.pr.reg(n).is_some() || st.pr.regs.iter().any(|r| reg.covers(&r.nexus)) || new.iter().any(|r| r.covers(n) || reg.covers(&r.nexus))
        };
        if taken(&reg.nexus) || reg.covers(me) {
            log::info!("PERSISTENT RESERVE OUT REGISTER with SPEC_I_PT from {}: TransportID {i} ({}) is registered already", nexus.initiator_port(), tid.initiator);
            return Err(CmdError::invalid_param(28, None));
        }
        new.push(reg);
    }
    Ok(new)
}

/// REGISTER AND MOVE (SPC-4 5.12.8): the holder of a reservation (not an all-registrants
/// one) gives it to another I_T nexus, registering that nexus with SARK if it is not
/// registered, and unregistering itself when UNREG is set.
fn register_and_move(st: &mut LunState, nexus: &Nexus, my_key: Option<u64>, req: &PrOutReq) -> CmdResult<()> {
    let me = nexus.key().clone();
    let Some((tid, rel_port)) = &req.move_to else {
        return Err(CmdError::internal());
    };
    // Unregistered, or another key: RESERVATION CONFLICT (SPC-4 5.12.8).
    if my_key != Some(req.key) {
        return Err(CmdError::reservation_conflict());
    }
    if req.sark == 0 {
        return Err(CmdError::invalid_param(8, None));
    }
    let Some(res) = st.pr.reservation.clone() else {
        return Err(CmdError::reservation_conflict());
    };
    if all_registrants(res.ty) || !st.pr.is_holder(&me) {
        return Err(CmdError::reservation_conflict());
    }
    let dest = nexus_through(&tid.initiator, nexus, *rel_port);
    if dest == me || st.pr.reg(&dest).is_some_and(|r| r.covers(&me)) {
        // The destination is the sender's own I_T nexus (or one its registration covers).
        return Err(CmdError::invalid_param(24, None));
    }
    let holder = match st.pr.regs.iter().find(|r| r.covers(&dest)) {
        // Registered already: its key stays (SPC-4 5.12.8 c)).
        Some(r) => r.nexus.clone(),
        None => {
            st.pr.regs.push(Registration { key: req.sark, nexus: dest.clone(), transport_id: tid.bytes.clone(), rel_target_port: *rel_port, all_tg_pt: false });
            dest
        }
    };
    st.pr.reservation = Some(Reservation { ty: res.ty, holder });
    if req.unreg {
        if let Some(i) = st.pr.regs.iter().position(|r| r.covers(&me)) {
            st.pr.regs.remove(i);
        }
    }
    st.pr.generation = st.pr.generation.wrapping_add(1);
    Ok(())
}

/// UA RESERVATIONS RELEASED for the other registrants when a registrants-only or
/// all-registrants reservation goes away (SPC-4 5.12.11.2.2).
fn released_ua(st: &mut LunState, ty: u8, me: &Arc<str>) {
    if matches!(ty, WRITE_EXCLUSIVE_RO | EXCLUSIVE_ACCESS_RO | WRITE_EXCLUSIVE_AR | EXCLUSIVE_ACCESS_AR) {
        let others: Vec<Arc<str>> = st.pr.regs.iter().filter(|r| !r.covers(me)).map(|r| r.nexus.clone()).collect();
        for n in others {
            st.add_ua(&n, Asc::RESERVATIONS_RELEASED);
        }
    }
}

/// PREEMPT / PREEMPT AND ABORT (SPC-4 5.12.11.4). Tasks of preempted nexuses are not
/// aborted here (the iSCSI layer owns them).
fn preempt(st: &mut LunState, me: &Arc<str>, my_key: Option<u64>, key: u64, sark: u64, scope: u8, ty: u8) -> CmdResult<()> {
    let Some(k) = my_key else {
        return Err(CmdError::reservation_conflict());
    };
    if k != key {
        return Err(CmdError::reservation_conflict());
    }
    let res = st.pr.reservation.clone();
    let preempts_holder = match &res {
        None => false,
        Some(r) if all_registrants(r.ty) => sark == 0,
        Some(r) => st.pr.reg(&r.holder).is_some_and(|h| h.key == sark),
    };
    if preempts_holder {
        if scope != 0 {
            return Err(CmdError::invalid_cdb(2, Some(4)));
        }
        if !valid_type(ty) {
            return Err(CmdError::invalid_cdb(2, Some(0)));
        }
    }
    if sark == 0 && !preempts_holder {
        return Err(CmdError::invalid_param(8, None));
    }
    // Registrations to remove: those with SARK (all but ours when SARK is zero under an
    // all-registrants reservation). The preempting nexus keeps its own (SPC-4 5.12.11.4).
    let victims: Vec<Arc<str>> = st.pr.regs.iter().filter(|r| !r.covers(me) && (sark == 0 || r.key == sark)).map(|r| r.nexus.clone()).collect();
    if victims.is_empty() && !preempts_holder {
        return Err(CmdError::reservation_conflict());
    }
    st.pr.regs.retain(|r| !victims.contains(&r.nexus));
    if preempts_holder {
        let old = res.as_ref().map(|r| r.ty);
        st.pr.reservation = Some(Reservation { ty, holder: me.clone() });
        // Remaining registrants see their reservation change type (SPC-4 5.12.11.4.3).
        if old != Some(ty) {
            let others: Vec<Arc<str>> = st.pr.regs.iter().filter(|r| !r.covers(me)).map(|r| r.nexus.clone()).collect();
            for n in others {
                st.add_ua(&n, Asc::RESERVATIONS_RELEASED);
            }
        }
    }
    for v in &victims {
        st.add_ua(v, Asc::REGISTRATIONS_PREEMPTED);
    }
    st.pr.generation = st.pr.generation.wrapping_add(1);
    Ok(())
}

// ------------------------------------------------------------------------------------
// SPC-2 RESERVE / RELEASE

/// RESERVE(6)/(10) (SPC-2 7.21): the whole LU for this nexus. Third-party and extent
/// reservations are not supported. On a LUN whose device several gateways share, the
/// reservation is the device's (`lu_shared`): decided on a worker, `Some` result to poll.
pub(crate) fn reserve(lun: &Lun, nexus: &Arc<Nexus>, cdb: &Cdb) -> CmdResult<Option<Arc<work::Deferred>>> {
    if cdb.opcode() == crate::cdb::op::RESERVE10 && cdb.u8(1) & 0x12 != 0 {
        // 3RDPTY / LONGID
        return Err(CmdError::invalid_cdb(1, Some(4)));
    }
    if cdb.opcode() == crate::cdb::op::RESERVE6 && cdb.u8(1) & 0x01 != 0 {
        // EXTENT
        return Err(CmdError::invalid_cdb(1, Some(0)));
    }
    if lun.lu_shared().is_some() {
        // Queued behind any PERSISTENT RESERVE OUT of the LUN, decided in order with them.
        return crate::lu_shared::reserve(lun, nexus).map(Some);
    }
    // A PERSISTENT RESERVE OUT queued or running on the worker pool may be about to make
    // a registration: RESERVE waits for it (BUSY: the initiator retries), and none is
    // queued while this one looks (the queue's lock is held).
    let q = lun.pr_serial().lock();
    if !q.idle() {
        return Err(work::busy());
    }
    let mut st = lun.lock();
    // With persistent reservations in use RESERVE conflicts (SPC-4 5.12.3).
    if !st.pr.regs.is_empty() || st.pr.reservation.is_some() {
        return Err(CmdError::reservation_conflict());
    }
    match &st.spc2_holder {
        Some(h) if h != nexus.key() => Err(CmdError::reservation_conflict()),
        _ => {
            st.spc2_taken_by(nexus);
            lun.refresh_attn(&st);
            Ok(None)
        }
    }
}

/// RELEASE(6)/(10) (SPC-2 7.23): releasing someone else's (or no) reservation succeeds
/// without effect. Shared as RESERVE is.
pub(crate) fn release(lun: &Lun, nexus: &Arc<Nexus>, cdb: &Cdb) -> CmdResult<Option<Arc<work::Deferred>>> {
    if cdb.opcode() == crate::cdb::op::RELEASE10 && cdb.u8(1) & 0x12 != 0 {
        return Err(CmdError::invalid_cdb(1, Some(4)));
    }
    if lun.lu_shared().is_some() {
        return crate::lu_shared::release(lun, nexus).map(Some);
    }
    let mut st = lun.lock();
    if !st.pr.regs.is_empty() || st.pr.reservation.is_some() {
        return Err(CmdError::reservation_conflict());
    }
    if st.spc2_holder.as_ref() == Some(nexus.key()) {
        st.spc2_holder = None;
        lun.refresh_attn(&st);
    }
    Ok(None)
}
