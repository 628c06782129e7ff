//! A logical unit: identity, geometry and the state shared by every session and reactor
//! (unit attentions, reservations, mode parameters, medium state).
//!
//! The data path reads two atomics ([`Lun::attn`] and the mode bits) and takes the mutex
//! only when one says there is something to look at (a unit attention is pending, or a
//! reservation exists): READ and WRITE never lock in the common case.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use riser_bdev::{Bdev, IoKind, Lba};

use crate::lock::RangeLock;
use crate::pr::PrState;
use crate::pr::store::PrStore;
use crate::sanitize::SanitizeState;
use crate::sense::Asc;
use crate::task::Nexus;
use crate::xcopy::CopyResults;

/// `attn` bit: some I_T nexus has a unit attention queued.
pub(crate) const ATTN_UA: u32 = 1;
/// `attn` bit: a persistent reservation or an SPC-2 reservation exists.
pub(crate) const ATTN_RESERVED: u32 = 2;
/// `attn` bit: a sanitize operation is running or has failed (commands are gated).
pub(crate) const ATTN_SANITIZE: u32 = 4;

/// Mode bit: write cache enabled (caching mode page WCE).
pub(crate) const MODE_WCE: u32 = 1;
/// Mode bit: descriptor format sense data (control mode page D_SENSE).
pub(crate) const MODE_DSENSE: u32 = 2;
/// Mode bit: software write protect (control mode page SWP).
pub(crate) const MODE_SWP: u32 = 4;
/// Mode bit: the medium is ejected (removable LUNs only).
pub(crate) const MODE_NO_MEDIUM: u32 = 8;

/// How a LUN presents itself. `Default` gives riser's values; the control plane fills in
/// the target name and LUN id.
#[derive(Clone, Debug)]
pub struct LunConfig {
    pub id: u64,
    /// iSCSI name of the target node that exports this LUN (VPD 0x83 SCSI target name).
    pub target_name: String,
    /// T10 vendor identification: 8 ASCII characters at most.
    pub vendor: String,
    /// Product identification: 16 ASCII characters at most (default: the bdev's product).
    pub product: Option<String>,
    /// Product revision level: 4 ASCII characters at most.
    pub revision: String,
    /// Unit serial number (VPD 0x80); default: the bdev UUID as 32 hex digits.
    pub serial: Option<String>,
    /// Report a removable medium (INQUIRY RMB): START STOP UNIT can eject and load it.
    pub removable: bool,
    /// Hardware write protect: every write fails with DATA PROTECT.
    pub read_only: bool,
    /// Thin provisioning (READ CAPACITY(16) LBPME, UNMAP, WRITE SAME with UNMAP); default:
    /// when the device supports unmap.
    pub thin_provisioning: Option<bool>,
    /// Offer SANITIZE OVERWRITE (SBC-3). Off by default: riser's LUNs present a
    /// non-rotating, thin-provisioned medium, whose sanitize methods are BLOCK ERASE
    /// (deallocate) and CRYPTOGRAPHIC ERASE; an overwrite would also map every block of a
    /// thin LU. BLOCK ERASE, CRYPTOGRAPHIC ERASE and EXIT FAILURE MODE are always offered
    /// (BLOCK ERASE on thin-provisioned LUNs).
    pub sanitize_overwrite: bool,
    /// Physical block size in bytes, reported as LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT
    /// in READ CAPACITY(16) (SBC-3 5.16.2) and as the OPTIMAL TRANSFER LENGTH GRANULARITY.
    /// `None` (the default): the device's (a RAM device's is its logical block size: it does
    /// no read-modify-write below any size; a block device's is what BLKPBSZGET says). Set it to describe a backing
    /// store with larger physical blocks (e.g. 4096 under 512-byte logical blocks); a value
    /// that is not a power-of-two multiple of the logical block size is ignored.
    pub physical_block_size: Option<u32>,
    /// Where persistent reservations made with APTPL=1 are kept across restarts (one file
    /// per device UUID and LUN, see `pr_store`); the LUN loads its file at creation.
    /// `None`: APTPL is refused (REPORT CAPABILITIES PTPL_C = 0).
    pub state_dir: Option<PathBuf>,
}

impl Default for LunConfig {
    fn default() -> Self {
        LunConfig {
            id: 0,
            target_name: String::new(),
            vendor: "RISER".into(),
            product: None,
            revision: "0001".into(),
            serial: None,
            removable: false,
            read_only: false,
            thin_provisioning: None,
            sanitize_overwrite: false,
            physical_block_size: None,
            state_dir: None,
        }
    }
}

/// Per-I_T-nexus state on one LUN.
#[derive(Default, Debug)]
pub(crate) struct NexusState {
    /// Pending unit attentions, oldest first (SPC-4 5.14).
    pub ua: Vec<Asc>,
    /// PREVENT ALLOW MEDIUM REMOVAL: this nexus prevents removal (SBC-3 5.13).
    pub prevent: bool,
    /// The newest session of the I_T nexus that sent a command here (its [`Nexus::id`]): a
    /// reinstated session is the same nexus, and the old session's end must not drop what
    /// the new one has here ([`Lun::nexus_lost`]).
    pub latest: u64,
}

/// State shared by all nexuses, behind [`Lun::state`].
#[derive(Default)]
pub(crate) struct LunState {
    pub nexuses: HashMap<Arc<str>, NexusState>,
    pub pr: PrState,
    /// SPC-2 RESERVE(6)/(10) holder.
    pub spc2_holder: Option<Arc<str>>,
    /// The newest session of the holder's I_T nexus that took (or took again) the SPC-2
    /// reservation (its [`Nexus::id`]; 0: not known, e.g. read from a shared LU's object):
    /// the end of an older session of the same nexus does not release it.
    pub spc2_epoch: u64,
    pub copies: CopyResults,
    /// SANITIZE: running, failed or idle (SBC-3 4.11). Not changed by resets or nexus
    /// loss: a sanitize operation survives them.
    pub sanitize: SanitizeState,
}

impl LunState {
    /// The state of `key`, created with a POWER ON UA the first time the nexus is seen
    /// (SPC-4 5.14: power on establishes a UA for every I_T nexus).
    pub fn nexus(&mut self, key: &Arc<str>) -> &mut NexusState {
        self.nexuses
            .entry(key.clone())
            .or_insert_with(|| NexusState {
                ua: vec![Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET],
                ..Default::default()
            })
    }

    /// `nexus` sends a command: its state ([`Self::nexus`]), which knows the newest session
    /// of the I_T nexus seen.
    pub fn nexus_seen(&mut self, nexus: &Nexus) -> &mut NexusState {
        let n = self.nexus(nexus.key());
        n.latest = n.latest.max(nexus.id);
        n
    }

    /// `nexus` holds the SPC-2 reservation (took it, or took it again).
    pub fn spc2_taken_by(&mut self, nexus: &Nexus) {
        if self.spc2_holder.as_ref() == Some(nexus.key()) {
            self.spc2_epoch = self.spc2_epoch.max(nexus.id);
        } else {
            self.spc2_holder = Some(nexus.key().clone());
            self.spc2_epoch = nexus.id;
        }
    }

    /// Queues `asc` for one nexus. A reset-class UA (29h) replaces everything queued,
    /// other UAs are not repeated.
    pub fn add_ua(&mut self, key: &Arc<str>, asc: Asc) {
        let n = self.nexus(key);
        push_ua(&mut n.ua, asc);
    }

    /// Queues `asc` for every known nexus, except `except`.
    pub fn add_ua_all(&mut self, asc: Asc, except: Option<&Arc<str>>) {
        for (k, n) in self.nexuses.iter_mut() {
            if except.is_some_and(|e| e == k) {
                continue;
            }
            push_ua(&mut n.ua, asc);
        }
    }

    pub fn any_ua(&self) -> bool {
        self.nexuses.values().any(|n| !n.ua.is_empty())
    }

    pub fn reserved(&self) -> bool {
        self.spc2_holder.is_some() || self.pr.reservation.is_some()
    }
}

fn push_ua(q: &mut Vec<Asc>, asc: Asc) {
    if asc.asc() == 0x29 {
        // A reset supersedes everything reported before it.
        q.retain(|a| a.asc() == 0x29 && a.0 > asc.0);
        if !q.contains(&asc) {
            q.push(asc);
        }
        q.sort_by_key(|a| if a.asc() == 0x29 { 0 } else { 1 });
        return;
    }
    if !q.contains(&asc) {
        q.push(asc);
    }
}

/// IEEE company id used in NAA designators. riser has no registered OUI; the value only
/// has to be constant so that the designator stays unique through the UUID bits.
pub const IEEE_COMPANY_ID: u32 = 0x00_00_00;

/// NAA IEEE Registered Extended designator (SPC-4 7.8.6.6.6): NAA 6, the 24-bit company
/// id, then 100 bits of vendor specific identifier taken from `uuid`.
fn naa6(oui: u32, uuid: &[u8; 16]) -> [u8; 16] {
    let mut d = [0u8; 16];
    // 4 bits NAA, 24 bits OUI, 4 bits of uuid: the first 32 bits.
    let head: u32 = (0x6 << 28) | ((oui & 0xFF_FFFF) << 4) | (uuid[0] >> 4) as u32;
    d[..4].copy_from_slice(&head.to_be_bytes());
    // The remaining 96 bits: the uuid shifted by 4 bits.
    for i in 4..16 {
        d[i] = (uuid[i - 4] << 4) | (uuid[i - 3] >> 4);
    }
    d
}

/// A logical unit. Shared (`Arc<Lun>`) by every reactor; created on the control plane.
pub struct Lun {
    cfg: LunConfig,
    bdev: Arc<dyn Bdev>,
    block_size: u32,
    /// The size the initiators were last told of (READ CAPACITY): a device that grew
    /// since (a rescan) raises CAPACITY DATA HAS CHANGED on the next command.
    known_blocks: AtomicU64,
    /// The mode bits at power on: WCE when the device has a volatile write cache.
    default_mode: u32,
    thin: bool,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT.
    lbppbe: u8,
    serial: String,
    product: String,
    /// NAA IEEE Registered Extended designator (type 6), 16 bytes, from the bdev UUID.
    naa: [u8; 16],
    pub(crate) attn: AtomicU32,
    pub(crate) mode: AtomicU32,
    pub(crate) state: Mutex<LunState>,
    /// The persistent reservation state file (APTPL), when there is a state directory.
    pr_store: Option<PrStore>,
    /// Reservations kept with the device, shared by every gateway (see `pr::shared`).
    pr_shared: std::sync::OnceLock<crate::pr::shared::SharedPr>,
    /// Serializes PERSISTENT RESERVE OUT across the state file's write or the shared
    /// state's update (taken on a `pr::work` worker only, before `state`, never while
    /// holding it; a reactor never waits for it).
    pr_io: Mutex<()>,
    /// PERSISTENT RESERVE OUT work of this LUN queued on the worker pool, in order (see
    /// `pr::work`).
    pr_serial: Arc<crate::pr::work::Serial>,
    pub(crate) ranges: RangeLock,
    /// A running sanitize operation lost the executor that drove it (its connection
    /// ended): the next executor to poll takes it over.
    pub(crate) sanitize_orphan: AtomicBool,
    /// LUN numbers of the target this LUN belongs to, as last told: a change raises
    /// REPORTED LUNS DATA HAS CHANGED.
    target_luns: Mutex<Vec<u64>>,
    /// Resets to and from the other gateways exporting the device (shared devices only).
    lu_events: std::sync::OnceLock<crate::lu_events::LuEvents>,
    /// SPC-2 reservation and mode parameters kept with the device, shared by every
    /// gateway (see `lu_shared`).
    lu_shared: std::sync::OnceLock<crate::lu_shared::SharedLu>,
    /// Rate limits per initiator on this LUN (`iscsi_target_node_set_qos_limit`).
    pub initiator_qos: riser_bdev::qos::QosTable,
}

/// Events that reset part of the LUN state (SAM-5 5.12, 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetKind {
    /// LOGICAL UNIT RESET task management function.
    LunReset,
    /// TARGET WARM RESET.
    TargetWarmReset,
    /// TARGET COLD RESET.
    TargetColdReset,
}

impl Lun {
    pub fn new(cfg: LunConfig, bdev: Arc<dyn Bdev>) -> Arc<Lun> {
        let info = bdev.info().clone();
        let thin = cfg
            .thin_provisioning
            .unwrap_or(bdev.supports(IoKind::Unmap))
            && bdev.supports(IoKind::Unmap);
        let serial = cfg
            .serial
            .clone()
            .unwrap_or_else(|| info.uuid.simple().to_string());
        let product = cfg
            .product
            .clone()
            .unwrap_or_else(|| info.product_name.to_string());
        let naa = naa6(IEEE_COMPANY_ID, info.uuid.as_bytes());
        // The LUN's setting, else what the device says (a file system's block size).
        let lbppbe = match cfg.physical_block_size.or(Some(info.physical_block_size)) {
            Some(p) if p > info.block_size && p % info.block_size == 0 => {
                let ratio = p / info.block_size;
                if ratio.is_power_of_two() && ratio.trailing_zeros() <= 15 {
                    ratio.trailing_zeros() as u8
                } else {
                    log::warn!("LUN {}: physical block size {p} ignored: not a power-of-two multiple of {}", cfg.id, info.block_size);
                    0
                }
            }
            Some(p) if p != info.block_size => {
                log::warn!(
                    "LUN {}: physical block size {p} ignored: not a multiple of {}",
                    cfg.id,
                    info.block_size
                );
                0
            }
            _ => 0,
        };
        let mode = if info.volatile_write_cache { MODE_WCE } else { 0 };
        // Registrations and the reservation saved with APTPL=1 by an earlier run.
        let pr_store = cfg.state_dir.as_deref().map(|d| PrStore::new(d, info.uuid, cfg.id));
        let pr = pr_store.as_ref().and_then(PrStore::load).unwrap_or_default();
        let lun = Arc::new(Lun {
            block_size: info.block_size,
            known_blocks: AtomicU64::new(info.num_blocks()),
            default_mode: mode,
            thin,
            lbppbe,
            serial,
            product,
            naa,
            cfg,
            bdev,
            attn: AtomicU32::new(0),
            mode: AtomicU32::new(mode),
            state: Mutex::new(LunState { pr, ..LunState::default() }),
            pr_store,
            pr_shared: std::sync::OnceLock::new(),
            pr_io: Mutex::new(()),
            pr_serial: Arc::default(),
            ranges: RangeLock::default(),
            sanitize_orphan: AtomicBool::new(false),
            target_luns: Mutex::new(Vec::new()),
            initiator_qos: Default::default(),
            lu_events: std::sync::OnceLock::new(),
            lu_shared: std::sync::OnceLock::new(),
        });
        if let Some(ev) = crate::lu_events::LuEvents::open(&lun) {
            let _ = lun.lu_events.set(ev);
        }
        if let Some(sh) = crate::pr::shared::SharedPr::open(lun.bdev(), lun.id(), Arc::downgrade(&lun)) {
            let _ = lun.pr_shared.set(sh);
            lun.lock().pr = PrState::default();
            // A failure is logged; the LUN starts with no reservations and the watch
            // re-reads until a read succeeds.
            let _ = crate::pr::shared::load(&lun);
        }
        if let Some(sh) = crate::lu_shared::SharedLu::open(&lun) {
            let _ = lun.lu_shared.set(sh);
            // Logged when it fails: the defaults stay.
            let _ = crate::lu_shared::load(&lun);
            crate::lu_shared::follow_group(&lun);
        }
        // A restored reservation is checked from the first command on.
        lun.refresh_attn(&lun.lock());
        lun
    }

    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    pub fn config(&self) -> &LunConfig {
        &self.cfg
    }

    pub fn bdev(&self) -> &Arc<dyn Bdev> {
        &self.bdev
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The device's size now (it grows when a rescan finds a larger backing store).
    pub fn num_blocks(&self) -> u64 {
        self.bdev.info().num_blocks()
    }

    /// The address just past the last block.
    pub(crate) fn end_lba(&self) -> Lba {
        Lba::new(self.num_blocks())
    }

    /// Raises CAPACITY DATA HAS CHANGED for every I_T nexus (SBC-3 4.x, SPC-4 5.14) once
    /// the device's size differs from the one last seen. One atomic load per command.
    pub(crate) fn check_capacity(&self) {
        let now = self.bdev.info().num_blocks();
        let seen = self.known_blocks.load(Ordering::Acquire);
        if now != seen
            && self
                .known_blocks
                .compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            log::info!("LUN {}: capacity changed from {seen} to {now} blocks", self.cfg.id);
            self.establish_ua_all(Asc::CAPACITY_DATA_HAS_CHANGED);
        }
    }

    /// Channels open on this LUN, one per connection that addressed it (see
    /// [`LunChannel`](crate::LunChannel)); a channel of a LUN that left its target's map
    /// lives until its tasks in flight are done. 0: no I/O of this LUN can reach the device
    /// any more (`iscsi_target_node_remove_lun` waits for that before releasing it).
    pub fn open_channels(&self) -> usize {
        self.ranges.counters()
    }

    /// Whether the device has a volatile write cache (the caching mode page's WCE can be
    /// changed only then; without one every write is durable anyway).
    pub fn volatile_write_cache(&self) -> bool {
        self.bdev.info().volatile_write_cache
    }

    /// Mode bits at power on.
    pub(crate) fn default_mode_bits(&self) -> u32 {
        self.default_mode
    }

    pub fn thin_provisioned(&self) -> bool {
        self.thin
    }

    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT (see [`LunConfig::physical_block_size`]).
    pub fn lbppb_exponent(&self) -> u8 {
        self.lbppbe
    }

    pub fn serial(&self) -> &str {
        &self.serial
    }

    pub fn product(&self) -> &str {
        &self.product
    }

    pub(crate) fn naa(&self) -> &[u8; 16] {
        &self.naa
    }

    /// The APTPL state file, when the LUN has a state directory.
    pub(crate) fn pr_store(&self) -> Option<&PrStore> {
        self.pr_store.as_ref().filter(|_| self.pr_shared.get().is_none())
    }

    /// The device's shared reservation state, when the LUN's reservations live there.
    pub(crate) fn pr_shared(&self) -> Option<&crate::pr::shared::SharedPr> {
        self.pr_shared.get()
    }

    /// The device's shared LU state, when the LUN's SPC-2 reservation and mode parameters
    /// live there.
    pub(crate) fn lu_shared(&self) -> Option<&crate::lu_shared::SharedLu> {
        self.lu_shared.get()
    }

    /// Held by PERSISTENT RESERVE OUT around its change and the state file's write.
    pub(crate) fn pr_io_lock(&self) -> MutexGuard<'_, ()> {
        self.pr_io.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue of this LUN's PERSISTENT RESERVE OUT work on the worker pool.
    pub(crate) fn pr_serial(&self) -> &Arc<crate::pr::work::Serial> {
        &self.pr_serial
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LunState> {
        // A panic while holding the lock leaves the state usable: take it anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Recomputes the fast-path flags from the state; call with the lock held, after any
    /// change to unit attentions or reservations.
    pub(crate) fn refresh_attn(&self, st: &LunState) {
        let mut a = 0;
        if st.any_ua() {
            a |= ATTN_UA;
        }
        if st.reserved() {
            a |= ATTN_RESERVED;
        }
        if st.sanitize.active() {
            a |= ATTN_SANITIZE;
        }
        self.attn.store(a, Ordering::Release);
    }

    pub(crate) fn mode_bits(&self) -> u32 {
        self.mode.load(Ordering::Acquire)
    }

    pub(crate) fn set_mode_bit(&self, bit: u32, on: bool) {
        if on {
            self.mode.fetch_or(bit, Ordering::AcqRel);
        } else {
            self.mode.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Whether sense data is returned in descriptor format (D_SENSE).
    pub fn descriptor_sense(&self) -> bool {
        self.mode_bits() & MODE_DSENSE != 0
    }

    /// Whether writes are refused (hardware write protect: the LUN's option or a read-only
    /// device; or software write protect).
    pub fn write_protected(&self) -> bool {
        self.cfg.read_only || self.mode_bits() & MODE_SWP != 0 || !self.bdev.supports(IoKind::Write)
    }

    /// Queues a unit attention for every I_T nexus that has used this LUN, e.g.
    /// REPORTED LUNS DATA HAS CHANGED (3F/0E) after the LUN map of the target changed, or
    /// CAPACITY DATA HAS CHANGED.
    pub fn establish_ua_all(&self, asc: Asc) {
        let mut st = self.lock();
        st.add_ua_all(asc, None);
        self.refresh_attn(&st);
    }

    /// Queues a unit attention for one I_T nexus.
    pub fn establish_ua(&self, nexus: &Nexus, asc: Asc) {
        let mut st = self.lock();
        st.add_ua(nexus.key(), asc);
        self.refresh_attn(&st);
    }

    /// Unit attentions queued for `nexus` (oldest first); for tests and diagnostics.
    pub fn pending_ua(&self, nexus: &Nexus) -> Vec<Asc> {
        let st = self.lock();
        st.nexuses
            .get(nexus.key())
            .map(|n| n.ua.clone())
            .unwrap_or_default()
    }

    /// The I_T nexus is gone (session closed or dropped): SPC-2 reservations it held are
    /// released (SPC-2 5.5.1) and its medium removal prevention ends (SBC-3 5.13).
    /// Persistent reservations stay (SPC-4 5.12).
    ///
    /// A reinstated session is the same I_T nexus with a newer [`Nexus`] (a larger id), and
    /// the old session's connection may end after the new session started: what a newer
    /// session of the nexus took (the reservation, taken again or not) or used here (its
    /// unit attentions, PREVENT, copy results) is not this session's to drop.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        let mut st = self.lock();
        let key = nexus.key();
        let superseded = st.nexuses.get(key).is_some_and(|n| n.latest > nexus.id);
        if st.spc2_holder.as_ref() == Some(key) && st.spc2_epoch <= nexus.id {
            st.spc2_holder = None;
            // Released for every gateway too, on a worker (queued without the state's
            // lock: the queue's is taken before it elsewhere).
            drop(st);
            crate::lu_shared::nexus_lost(self, key);
            st = self.lock();
        }
        // Its state goes with it (prevention ends, SBC-3 5.13; copy results are dropped);
        // if the initiator port comes back it is a new nexus and sees POWER ON first.
        if !superseded {
            st.nexuses.remove(key);
            st.copies.by_list.retain(|(k, _), _| k != key);
        }
        self.refresh_attn(&st);
    }

    /// Applies the shared-state part of a reset (the iSCSI layer also aborts the tasks on
    /// every reactor with [`LunChannel::abort_all`](crate::LunChannel::abort_all)): SPC-2
    /// reservations are released, medium removal is allowed, mode parameters return to
    /// their defaults on a cold reset, and every nexus gets a reset unit attention
    /// (SAM-5 6.3.3; SPC-4 5.14). Persistent reservations survive (SPC-4).
    ///
    /// Returns the announcement of the reset to the other gateways exporting the same
    /// device, if there are any, for the caller to hold the task management response until
    /// it is [settled](crate::lu_events::Announcement::settled) (see `lu_events`): it never
    /// waits for it itself.
    pub fn reset(&self, kind: ResetKind) -> Option<Arc<crate::lu_events::Announcement>> {
        self.reset_local(kind);
        // The same logical unit behind other gateways (see lu_events), and its shared
        // state (see lu_shared).
        crate::lu_shared::reset(self, kind);
        self.lu_events.get().and_then(|ev| ev.announce(kind))
    }

    /// [`Lun::reset`] on this gateway only (a peer's reset arrives here).
    pub(crate) fn reset_local(&self, kind: ResetKind) {
        let mut st = self.lock();
        st.spc2_holder = None;
        for n in st.nexuses.values_mut() {
            n.prevent = false;
        }
        let asc = match kind {
            ResetKind::LunReset => Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
            ResetKind::TargetWarmReset => Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET,
            ResetKind::TargetColdReset => Asc::POWER_ON_OCCURRED,
        };
        if kind == ResetKind::TargetColdReset {
            // Power on: mode parameters back to defaults, medium loaded.
            self.mode.store(self.default_mode, Ordering::Release);
        }
        st.add_ua_all(asc, None);
        self.refresh_attn(&st);
    }

    /// Whether any nexus prevents medium removal.
    pub(crate) fn removal_prevented(st: &LunState) -> bool {
        st.nexuses.values().any(|n| n.prevent)
    }
}

impl Lun {
    /// Tells the LUN which LUN numbers its target exports (REPORT LUNS itself is answered
    /// by the [`ScsiDevice`](crate::ScsiDevice); see
    /// [`ScsiDevice::announce_luns`](crate::ScsiDevice::announce_luns)). When the set
    /// changes after it was first given, every nexus gets REPORTED LUNS DATA HAS CHANGED
    /// (SPC-4 6.33, SAM-5 5.14).
    pub fn set_target_luns(&self, luns: &[u64]) {
        let mut ids = luns.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let changed = {
            let mut cur = self.target_luns.lock().unwrap_or_else(|e| e.into_inner());
            let changed = !cur.is_empty() && *cur != ids;
            *cur = ids;
            changed
        };
        if changed {
            self.establish_ua_all(Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
        }
    }

    /// The target's LUN numbers as last given to [`set_target_luns`](Self::set_target_luns)
    /// (this LUN's own number until told otherwise).
    pub fn target_luns(&self) -> Vec<u64> {
        let cur = self.target_luns.lock().unwrap_or_else(|e| e.into_inner());
        if cur.is_empty() {
            vec![self.cfg.id]
        } else {
            cur.clone()
        }
    }

    /// Drops a pending unit attention of `nexus` (e.g. REPORTED LUNS DATA HAS CHANGED once
    /// REPORT LUNS ran).
    pub fn clear_ua(&self, nexus: &Nexus, asc: Asc) {
        if self.attn.load(Ordering::Acquire) & ATTN_UA == 0 {
            return;
        }
        let mut st = self.lock();
        if let Some(n) = st.nexuses.get_mut(nexus.key()) {
            n.ua.retain(|a| *a != asc);
        }
        self.refresh_attn(&st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ua_queue_order() {
        let mut q = vec![];
        push_ua(&mut q, Asc::MODE_PARAMETERS_CHANGED);
        push_ua(&mut q, Asc::MODE_PARAMETERS_CHANGED);
        assert_eq!(q, vec![Asc::MODE_PARAMETERS_CHANGED]);
        push_ua(&mut q, Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED);
        assert_eq!(q, vec![Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED]);
        push_ua(&mut q, Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
        assert_eq!(
            q,
            vec![
                Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
                Asc::REPORTED_LUNS_DATA_HAS_CHANGED
            ]
        );
    }
}
