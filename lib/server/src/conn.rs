//! A logged-in connection on its reactor: the glue between the datamover, the iSCSI
//! full-feature phase ([`Ffp`]) and the SCSI layer (a [`DeviceChannel`] onto the target's
//! [`ScsiDevice`], which owns the LUN map, REPORT LUNS and the answers for a missing LUN).
//!
//! One poll: datamover events into the FFP, SCSI completions into the FFP, then the FFP's
//! actions out to the datamover and the SCSI layer. Everything here belongs to one reactor.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use riser_config::{Lun, TargetNode};
use riser_iscsi::ffp::{lun_id, Action, CopyStats, Datamover, DmEvent, Ffp, ScsiRequest, TxLimit};
use riser_iscsi::pdu::Op;
use riser_reactor::{Ctx, PollStatus};
use riser_scsi::{DeviceChannel, Nexus, ResetKind, ResetPending, ScsiDevice, TaskEvent};

use crate::logout::{LogoutStep, LogoutTimer};
use crate::registry::{ConnInfo, ConnRegistry};

/// How long a closing connection may take to flush before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How often timers (NOP-In) and config changes are checked.
const TIMER_EVERY: Duration = Duration::from_millis(100);
/// READs larger than this stream out in pieces of this size: each piece is read into its
/// own buffer and sent as soon as it is in, so a READ of any size holds a few pieces of
/// memory, not its whole transfer (the SCSI layer reads at most 4 pieces ahead). Plain
/// WRITEs with more solicited data than this are fetched and written in pieces of this size:
/// a piece's buffer is taken when its data is asked for (R2T, RDMA Read), and freed once
/// written (at most 2 pieces a command).
const STREAM_CHUNK: usize = 1 << 20;

/// A connection in full-feature phase.
pub struct Connection<D: Datamover> {
    info: Arc<ConnInfo>,
    registry: Arc<ConnRegistry>,
    dm: D,
    ffp: Ffp,
    node: Option<Arc<TargetNode>>,
    lun_gen: u64,
    /// The node's LUNs as SCSI sees them, with this connection's channels onto them.
    scsi: DeviceChannel,
    nexus: Arc<Nexus>,
    events: Vec<DmEvent>,
    /// The SCSI layer's events of the last poll (pieces, wants, ends).
    results: Vec<TaskEvent>,
    closing_since: Option<Instant>,
    last_timer: Instant,
    /// When the timer is next due (`last_timer` + [`TIMER_EVERY`]): every pass compares the
    /// time with it, a comparison cheaper than a subtraction.
    next_timer: Instant,
    /// A reset's announcement to the other gateways in flight: the actions after it (its
    /// task management response first) wait until it is settled (never the reactor).
    reset_wait: Option<ResetPending>,
    done: bool,
    /// Payload copies already published to `info.copies`.
    published: CopyStats,
    /// SCSI tasks submitted whose result has not come back (every submit yields exactly
    /// one result, aborted ones too); mirrored into `info.queue_depth`.
    in_flight: u32,
    /// How long the send queue may sit without the initiator taking a byte of it before
    /// the connection is closed (NOP-In timeout; zero: never).
    tx_stall_timeout: Duration,
    /// The datamover's bytes sent when last seen moving (or its queue empty), and when.
    tx_progress: (u64, Instant),
    /// A logout the control plane requested (`iscsi_target_node_request_logout`).
    logout: LogoutTimer,
    /// When the initiator last sent a PDU (an answer to a NOP-In ping aside).
    last_active: Instant,
    /// How long a discovery session may go without one before it is closed (zero: never).
    idle_timeout: Duration,
}

impl<D: Datamover> Connection<D> {
    pub fn new(
        info: Arc<ConnInfo>,
        registry: Arc<ConnRegistry>,
        dm: D,
        ffp: Ffp,
        node: Option<Arc<TargetNode>>,
        nexus: Arc<Nexus>,
        now: Instant,
    ) -> Self {
        let (lun_gen, luns) = match &node {
            Some(n) => n.luns(),
            None => (0, Arc::from(Vec::new())),
        };
        // Reads and writes of this connection share its fair share of the budget.
        let mut scsi = DeviceChannel::new(scsi_device(&luns));
        scsi.set_account(ffp.account().clone());
        scsi.set_stream_chunk(Some(STREAM_CHUNK));
        let mut ffp = ffp;
        ffp.set_write_stream_chunk(STREAM_CHUNK as u32);
        // Every SCSI result comes back here, aborted ones too (see `collect_scsi`): an aborted
        // task keeps its place under the task cap until the SCSI layer has given it back.
        ffp.set_aborted_results(true);
        // Immediate data goes straight into write buffers from the same pool and account.
        let mut dm = dm;
        dm.set_write_buffers(ffp.write_buffers());
        Connection {
            info,
            registry,
            dm,
            ffp,
            node,
            lun_gen,
            scsi,
            nexus,
            events: Vec::with_capacity(64),
            results: Vec::with_capacity(64),
            closing_since: None,
            last_timer: now,
            next_timer: now + TIMER_EVERY,
            reset_wait: None,
            done: false,
            published: CopyStats::default(),
            in_flight: 0,
            tx_stall_timeout: Duration::ZERO,
            tx_progress: (0, now),
            logout: LogoutTimer::default(),
            last_active: now,
            idle_timeout: Duration::ZERO,
        }
    }

    /// Closes the connection once the initiator has sent nothing (answers to NOP-In pings
    /// aside) for `timeout` (zero: never): a discovery session's `discovery_idle_timeout`,
    /// so that held discovery sessions cannot fill `max_discovery_sessions`.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Whether the initiator has been idle past the idle timeout; publishes the idle time.
    fn idle(&mut self, now: Instant) -> Option<String> {
        let idle = now.saturating_duration_since(self.last_active);
        self.info.idle_ms.store(idle.as_millis() as u64, Ordering::Relaxed);
        (!self.idle_timeout.is_zero() && idle >= self.idle_timeout && self.closing_since.is_none()).then(|| {
            format!(
                "discovery session idle for {} s (discovery_idle_timeout {} s): closing it, its slot may be needed",
                idle.as_secs(),
                self.idle_timeout.as_secs()
            )
        })
    }

    /// Bounds what the datamover queues for the initiator: receiving stops while more than
    /// `limit` is queued (a peer that sends and never reads fills its own socket buffers, not
    /// riser's memory), and a queue the initiator has taken nothing of for `stall_timeout`
    /// (the NOP-In timeout; zero: never) closes the connection, since a NOP-In ping could
    /// neither reach such a peer nor its answer be read.
    pub fn with_tx_limits(mut self, limit: TxLimit, stall_timeout: Duration) -> Self {
        self.dm.limit_tx_queue(limit);
        self.tx_stall_timeout = stall_timeout;
        self
    }

    /// Whether the initiator has taken nothing of a non-empty send queue for the stall
    /// timeout; keeps track of the progress.
    fn tx_stalled(&mut self, now: Instant) -> Option<String> {
        let b = self.dm.tx_backlog();
        if b.total == 0 || b.sent != self.tx_progress.0 {
            self.tx_progress = (b.sent, now);
            return None;
        }
        let still = now.duration_since(self.tx_progress.1);
        (!self.tx_stall_timeout.is_zero() && still >= self.tx_stall_timeout).then(|| {
            format!(
                "the initiator has read nothing for {} s ({} bytes queued for it, {} of them outside I/O buffers; nop_timeout {} s): closing a peer that stopped reading",
                still.as_secs(),
                b.total,
                b.unbudgeted,
                self.tx_stall_timeout.as_secs()
            )
        })
    }

    pub fn info(&self) -> &Arc<ConnInfo> {
        &self.info
    }

    /// Registers this connection as a poller on the current reactor.
    pub fn start(self, ctx: &mut Ctx)
    where
        D: 'static,
    {
        self.registry.add(self.info.clone());
        let mut conn = self;
        ctx.add_poller(move |ctx| conn.poll(ctx.now()));
    }

    fn execute(&mut self, req: ScsiRequest) {
        // One atomic load per command: a LUN added a moment ago is visible to the very
        // command that sees its REPORTED LUNS DATA HAS CHANGED unit attention.
        self.refresh_luns();
        self.scsi.submit(req.into_task(&self.nexus));
        self.in_flight = self.in_flight.saturating_add(1);
        self.info.queue_depth.store(self.in_flight, Ordering::Relaxed);
    }

    /// The SCSI layer's events into the FFP; returns how many results and read pieces
    /// came (a streamed write's wants are not counted: the Get_Data they lead to goes out
    /// with the next pass's actions).
    fn collect_scsi(&mut self) -> usize {
        self.scsi.poll(&mut self.results);
        if self.results.is_empty() {
            return 0;
        }
        let mut results = std::mem::take(&mut self.results);
        let (mut n, mut ended) = (0, 0u32);
        // Read data and responses go straight to the datamover while no action waits
        // before them (and no reset holds the actions back).
        let direct = self.reset_wait.is_none();
        // Each event is handled where it lies (only its buffer and sense are taken out of
        // it), then the list is cleared.
        for ev in results.iter_mut() {
            n += usize::from(!matches!(ev, TaskEvent::Want(_)));
            ended += u32::from(ev.ends_task());
            let dm: Option<&mut dyn Datamover> = if direct { Some(&mut self.dm) } else { None };
            self.ffp.on_scsi_in_place(ev, dm);
        }
        results.clear();
        self.results = results;
        if ended > 0 {
            self.in_flight = self.in_flight.saturating_sub(ended);
            self.info.queue_depth.store(self.in_flight, Ordering::Relaxed);
            bump(&self.info.tasks_done, u64::from(ended));
        }
        n
    }

    /// Carries out the FFP's actions; returns how many, and whether a command went to the
    /// SCSI layer.
    fn run_actions(&mut self) -> (usize, bool) {
        let mut executed = false;
        let mut n = 0;
        if let Some(p) = &self.reset_wait {
            if !p.settled() {
                return (0, false);
            }
            self.reset_wait = None;
        }
        while let Some(a) = self.ffp.poll_action() {
            n += 1;
            match a {
                Action::Send(p) => self.dm.send_control(p),
                Action::PutData(p) => self.dm.put_data(p),
                Action::GetData(g) => self.dm.get_data(g),
                Action::Execute(req) => {
                    executed = true;
                    self.execute(req)
                }
                Action::WriteData { itt, lun, offset, buf } => {
                    executed = true;
                    self.scsi.write_data(lun_id(lun), itt.0 as u64, offset, buf)
                }
                Action::Abort { itt, lun } => {
                    self.scsi.abort_task(&self.nexus, lun_id(lun), itt.0 as u64);
                    let _ = self.dm.deallocate_task_resources(itt);
                }
                Action::ResetLun(lun) => {
                    let p = self.scsi.reset_lun(lun_id(lun), ResetKind::LunReset);
                    if !p.settled() {
                        self.reset_wait = Some(p);
                        break;
                    }
                }
                Action::ResetTarget => {
                    let p = self.scsi.reset_target(ResetKind::TargetWarmReset);
                    if !p.settled() {
                        self.reset_wait = Some(p);
                        break;
                    }
                }
                Action::Close { reason, logout, whole_session } => {
                    if whole_session {
                        let (me, tsih) = (self.info.id, self.info.tsih);
                        self.registry.kill_where(|c| c.tsih == tsih && c.id != me);
                    }
                    if logout {
                        log::info!("connection {} ({}): logged out", self.info.id, self.info.initiator_name);
                    } else {
                        log::warn!("connection {} ({}): closing: {reason}", self.info.id, self.info.initiator_name);
                    }
                    self.dm.connection_terminate();
                    self.closing_since.get_or_insert(self.last_timer);
                }
            }
        }
        (n, executed)
    }

    /// One pass; `Done` once the connection is gone and everything is freed.
    pub fn poll(&mut self, now: Instant) -> PollStatus {
        if self.done {
            return PollStatus::Done;
        }
        // One writer (this reactor): a relaxed load and store, no read-modify-write.
        let quiet = self.quiet(now);
        let count = if quiet { &self.info.skipped_polls } else { &self.info.full_polls };
        count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if quiet {
            return PollStatus::Idle;
        }
        let mut work = self.dm.poll(&mut self.events);
        let mut terminated = None;
        let mut stalled = None;
        let mut pdus_in = 0;
        for ev in self.events.drain(..) {
            match ev {
                DmEvent::Control(pdu) => {
                    pdus_in += 1;
                    // An answer to riser's own NOP-In ping keeps no session busy.
                    if !matches!(pdu.op(), Op::NopOut(n) if !n.ttt.is_reserved()) {
                        self.last_active = now;
                    }
                    self.ffp.on_pdu(pdu, now)
                }
                DmEvent::Command { pdu, buf } => {
                    pdus_in += 1;
                    self.last_active = now;
                    self.ffp.on_command_placed(pdu, buf, now)
                }
                DmEvent::DataReady { itt, buf } => self.ffp.on_data_ready(itt, buf),
                DmEvent::DataFailed { itt, reason, .. } => self.ffp.on_data_failed(itt, reason),
                DmEvent::Reject { header, reason } => self.ffp.reject_raw(&header, reason),
                DmEvent::Terminated(why) => terminated = Some(why),
            }
        }
        if pdus_in > 0 {
            bump(&self.info.pdus_in, pdus_in);
        }
        // Data segments the FFP is done with go back to the datamover for reuse.
        while let Some(v) = self.ffp.take_spare() {
            self.dm.recycle(v);
        }
        // Commands held for a CmdSN gap another connection of the session filled.
        self.ffp.release_held();
        // Writes waiting for buffer memory that others have given back meanwhile.
        work += self.ffp.grant_buffers();
        work += self.collect_scsi();
        // Work in progress inside the SCSI layer (a background SANITIZE, I/O in flight)
        // keeps the reactor from backing off to sleep.
        if self.scsi.busy() {
            work += 1;
        }
        if now >= self.next_timer {
            self.last_timer = now;
            self.next_timer = now + TIMER_EVERY;
            self.ffp.on_timer(now);
            self.publish_copies();
            if let Some(why) = self.idle(now) {
                let info = &self.info;
                self.registry.idle_log.warn(|| format!("connection {} ({} from {}): {why}", info.id, info.initiator_name, info.initiator_addr));
                self.dm.connection_terminate();
                self.closing_since = Some(now);
            }
            if self.info.kill.load(Ordering::Acquire) && self.closing_since.is_none() {
                log::info!(
                    "connection {}: closed by the target (session reinstated, discovery session evicted, node deleted or shutdown)",
                    self.info.id
                );
                self.dm.connection_terminate();
                self.closing_since = Some(now);
            }
            self.refresh_luns();
            self.check_logout_request(now);
            stalled = self.tx_stalled(now);
        }
        let (n, executed) = self.run_actions();
        work += n;
        if executed {
            // Devices that finish I/O inside submit (malloc, null) or fast: their completions
            // and the responses go out in this same pass, not the next.
            if self.collect_scsi() > 0 {
                work += self.run_actions().0;
            }
        }
        // Push out what the actions queued in this same pass (events this produces wait in
        // `events` for the next pass).
        if work > 0 {
            work += self.dm.flush(&mut self.events);
        }
        let expired = self.closing_since.is_some_and(|t| now.duration_since(t) > CLOSE_GRACE);
        if let Some(why) = &stalled {
            log::warn!("connection {} ({} from {}): {why}", self.info.id, self.info.initiator_name, self.info.initiator_addr);
        }
        if let Some(why) = terminated.or(stalled).or_else(|| expired.then(|| "close timed out".to_string())) {
            self.teardown(&why);
            return PollStatus::Done;
        }
        if work > 0 {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    /// Whether this pass provably has nothing to do: nothing readable or queued in the
    /// datamover, no task or action in the FFP, nothing in the SCSI layer (no task in
    /// flight, so no completion can be routed here), no close or reset under way, and the
    /// timer (kill and logout requests, pings, timeouts, LUN changes) not due. In doubt: no.
    fn quiet(&self, now: Instant) -> bool {
        self.events.is_empty()
            && self.in_flight == 0
            && self.reset_wait.is_none()
            && self.closing_since.is_none()
            && now < self.next_timer
            && self.dm.quiet()
            && self.ffp.quiet()
            && self.scsi.outstanding() == 0
            && !self.scsi.busy()
    }

    /// A requested logout: the Async Message, then, if the initiator ignores it, the close.
    fn check_logout_request(&mut self, now: Instant) {
        match self.logout.on_timer(&self.info.logout, now) {
            LogoutStep::Nothing => {}
            LogoutStep::Ask(secs) => {
                log::info!("connection {} ({}): asking the initiator to log out within {secs} s", self.info.id, self.info.initiator_name);
                self.ffp.request_logout(secs);
            }
            LogoutStep::Drop(why) if self.closing_since.is_none() => {
                log::warn!("connection {} ({} from {}): {why}", self.info.id, self.info.initiator_name, self.info.initiator_addr);
                self.dm.connection_terminate();
                self.closing_since = Some(now);
            }
            LogoutStep::Drop(_) => {}
        }
    }

    /// Adds the payload copies made since the last call to the connection's counters.
    fn publish_copies(&mut self) {
        let mut now = self.dm.copies();
        now.staged_bytes += self.ffp.staged_bytes();
        let p = self.published;
        self.info.copies.add(CopyStats {
            read_bytes: now.read_bytes.saturating_sub(p.read_bytes),
            solicited_bytes: now.solicited_bytes.saturating_sub(p.solicited_bytes),
            unsolicited_bytes: now.unsolicited_bytes.saturating_sub(p.unsolicited_bytes),
            staged_bytes: now.staged_bytes.saturating_sub(p.staged_bytes),
        });
        self.published = now;
    }

    /// A node's LUN list changed (LUN added): pick up the new snapshot.
    fn refresh_luns(&mut self) {
        if let Some(node) = &self.node {
            if node.generation() != self.lun_gen {
                let (g, luns) = node.luns();
                self.lun_gen = g;
                self.scsi.set_device(scsi_device(&luns));
            }
        }
    }

    /// Frees everything: in-flight SCSI tasks are aborted (their completions dropped),
    /// the datamover closes, the registry forgets the connection.
    fn teardown(&mut self, why: &str) {
        if !self.done {
            self.done = true;
            // In-flight tasks of this I_T nexus end; SPC-2 reservations and PREVENT held by
            // it end with it.
            self.scsi.teardown(&self.nexus);
            self.dm.connection_terminate();
            self.publish_copies();
            self.registry.remove(self.info.id);
            log::info!(
                "connection {} ({} from {}) ended: {why}",
                self.info.id,
                self.info.initiator_name,
                self.info.initiator_addr
            );
        }
    }
}

impl<D: Datamover> Drop for Connection<D> {
    fn drop(&mut self) {
        self.teardown("reactor shutting down");
    }
}

/// Adds `n` to a counter only this connection's reactor writes: a relaxed load and store,
/// no read-modify-write (readers, the RPCs, see one value or the next).
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// A node's LUNs as one SCSI device.
fn scsi_device(luns: &[Lun]) -> Arc<ScsiDevice> {
    Arc::new(ScsiDevice::new(luns.iter().map(|l| l.scsi.clone()).collect()))
}
