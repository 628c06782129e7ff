//! Enable_Datamover: the final Login Response is out; the connection gets its parameters
//! (Notice_Key_Values), a reactor (its session's, or the least loaded for a new session) and
//! moves there, where its datamover is built and its [`Connection`] starts polling.

use std::net::IpAddr;
use std::rc::{Rc, Weak};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use riser_config::recheck::SessionAuth;
use riser_config::{IscsiTarget, SendTargets};
use riser_iscsi::ffp::{connection_config, Ffp, TargetLimits, TextResponder, TxLimit};
use riser_iscsi::login::{LoginOutcome, LoginTransport, SessionDecision};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::params::SessionType;
use riser_iscsi::text::Pairs;
use riser_scsi::Nexus;
use serde_json::json;

use crate::conn::Connection;
use crate::login::DISCOVERY_QUEUE_DEPTH;
use crate::registry::ConnInfo;
use crate::sessions::{isid_u64, SessionWindows};
use crate::IscsiServer;

impl IscsiServer {
    /// Enable_Datamover for a login that completed on `t`. Returns the connection's id.
    /// `auth`: what the login proved (kept for the re-check after a change of rules).
    pub fn enable(self: &Arc<Self>, t: Box<dyn LoginTransport>, o: LoginOutcome, auth: SessionAuth) -> Option<u64> {
        let (peer, local, kind) = (t.peer(), t.local(), t.kind());
        let opts = self.target.options();
        let s = &o.session;
        let c = &o.connection;
        let discovery = s.session_type == SessionType::Discovery;
        let node = s.target_name.as_deref().and_then(|n| self.target.find_node(n));
        if !discovery && node.is_none() {
            log::warn!("login from {peer}: target vanished during login");
            return None;
        }
        let queue_depth = node.as_ref().map_or(DISCOVERY_QUEUE_DEPTH, |n| n.queue_depth());
        let iser = kind == Transport::Iser;
        let mut limits = TargetLimits::new(
            queue_depth,
            Duration::from_secs(opts.nop_in_interval as u64),
            Duration::from_secs(opts.nop_timeout as u64),
        );
        limits.data_out_timeout = Duration::from_secs(opts.data_out_timeout as u64);
        let (ffp_cfg, dm_params) = connection_config(&o, kind, &limits);
        // What the connection may queue for the initiator, and how long the initiator may
        // leave it there untaken.
        let tx_limit = TxLimit::new(opts.max_tx_queue_bytes as usize);
        let tx_stall = Duration::from_secs(opts.nop_timeout as u64);
        // A discovery session holds a slot others may need: closed once idle.
        let idle_timeout = if discovery { Duration::from_secs(opts.discovery_idle_timeout as u64) } else { Duration::ZERO };
        let isid = isid_u64(&o.identity.isid.0);
        let target_name = s.target_name.clone().unwrap_or_default();
        let tsih = o.tsih();
        let joining = matches!(o.decision, SessionDecision::AddConnection { .. });
        let reactor = self
            .session_reactor(tsih, (!joining).then_some(s))
            .unwrap_or_else(|| self.reactors.least_loaded());
        let lcore = self.reactors.stats().get(reactor).map_or(0, |s| s.core);
        let info = Arc::new(ConnInfo {
            id: self.conns.next_id(),
            cid: o.identity.cid,
            tsih,
            isid,
            reactor,
            lcore,
            initiator_name: s.initiator_name.clone(),
            initiator_addr: peer.to_string(),
            target_addr: local.map(|l| l.to_string()).unwrap_or_default(),
            target_node_name: target_name.clone(),
            pg_tag: u32::from(o.identity.portal_group_tag),
            transport: if iser { "iser" } else { "tcp" },
            params: json!({
                "SessionType": if discovery { "Discovery" } else { "Normal" },
                "HeaderDigest": if c.header_digest { "CRC32C" } else { "None" },
                "DataDigest": if c.data_digest { "CRC32C" } else { "None" },
                "MaxRecvDataSegmentLength": c.max_recv_data_segment_length,
                "InitiatorMaxRecvDataSegmentLength": c.max_send_data_segment_length,
                "MaxBurstLength": s.max_burst_length,
                "FirstBurstLength": s.first_burst_length,
                "InitialR2T": s.initial_r2t,
                "ImmediateData": s.immediate_data,
                "MaxOutstandingR2T": s.max_outstanding_r2t,
                "MaxConnections": s.max_connections,
                "ErrorRecoveryLevel": s.error_recovery_level,
                "QueueDepth": queue_depth,
                "RDMAExtensions": s.rdma_extensions,
                "TargetRecvDataSegmentLength": c.target_recv_data_segment_length,
                "InitiatorRecvDataSegmentLength": c.initiator_recv_data_segment_length,
            }),
            kill: AtomicBool::new(false),
            pdus_in: Default::default(),
            tasks_done: Default::default(),
            queue_depth: Default::default(),
            copies: Default::default(),
            logout: Default::default(),
            auth,
            idle_ms: Default::default(),
            skipped_polls: Default::default(),
            full_polls: Default::default(),
        });
        let make_dm = match t.enable_datamover() {
            Ok(f) => f,
            Err(e) => {
                log::error!("connection from {peer}: cannot switch to full-feature phase: {e}");
                return None;
            }
        };
        let nexus = Nexus::new(&s.initiator_name, isid, &target_name, o.identity.portal_group_tag);
        // Under the node's ALUA description; its target port is the first one the
        // description gives the portal group's target port group (by default the tag).
        let nexus = Arc::new(match &node {
            Some(n) => {
                let alua = n.alua().clone();
                let rel = alua.groups().iter().find(|g| g.id == nexus.target_port_group).map(|g| g.ports()[0]);
                let mut nexus = nexus.with_alua(alua);
                if let Some(rel) = rel {
                    nexus.rel_target_port = rel;
                }
                nexus
            }
            None => nexus,
        });
        let responder = SendTargetsResponder {
            target: self.target.clone(),
            initiator_name: s.initiator_name.clone(),
            initiator_addr: peer.ip(),
            local_addr: local.map(|l| l.ip()).unwrap_or(peer.ip()),
        };
        let registry = self.conns.clone();
        // A connection that never starts on its reactor leaves no session behind.
        let server = Arc::downgrade(self);
        let never_started = move || {
            if let Some(s) = server.upgrade() {
                s.connection_gone(tsih);
            }
        };
        let conn_id = info.id;
        let (exp_cmd_sn, stat_sn) = (o.exp_cmd_sn, o.stat_sn);
        self.reactors.add_load(reactor, 1);
        log::info!(
            "connection {} from {peer} ({}) to {} logged in (TSIH {}, reactor {reactor})",
            info.id,
            s.initiator_name,
            if discovery { "discovery" } else { &target_name },
            tsih
        );
        let sent = self.reactors.send_blocking(reactor, move |ctx| {
            let now = ctx.now();
            let mut dm = match make_dm() {
                Ok(dm) => dm,
                Err(e) => {
                    log::error!("connection {}: cannot switch to full-feature phase: {e}", info.id);
                    ctx.handle().add_load(reactor, -1);
                    never_started();
                    return;
                }
            };
            dm.notice_key_values(dm_params);
            let windows = ctx.local(SessionWindows::default);
            windows.0.retain(|_, w| w.strong_count() > 0);
            let mut ffp = if joining {
                match windows.0.get(&tsih).and_then(Weak::upgrade) {
                    Some(w) => Ffp::join(ffp_cfg, w, stat_sn, now),
                    None => {
                        log::warn!("connection {}: session {tsih} ended during login", info.id);
                        ctx.handle().add_load(reactor, -1);
                        never_started();
                        return;
                    }
                }
            } else {
                let ffp = Ffp::new(ffp_cfg, exp_cmd_sn, stat_sn, now);
                windows.0.insert(tsih, Rc::downgrade(&ffp.window()));
                ffp
            };
            ffp.set_responder(Box::new(responder));
            Connection::new(info, registry, dm, ffp, node, nexus, now)
                .with_tx_limits(tx_limit, tx_stall)
                .with_idle_timeout(idle_timeout)
                .start(ctx);
        });
        if sent.is_err() {
            log::warn!("connection from {peer}: reactors are stopping");
            return None;
        }
        Some(conn_id)
    }
}

/// Answers SendTargets from the target configuration, for this initiator.
struct SendTargetsResponder {
    target: Arc<IscsiTarget>,
    initiator_name: String,
    initiator_addr: IpAddr,
    local_addr: IpAddr,
}

impl TextResponder for SendTargetsResponder {
    fn respond(&mut self, request: &Pairs) -> Pairs {
        let mut out = Pairs::new();
        for (_, v) in request {
            let which = if v == "All" { SendTargets::All } else { SendTargets::One(v) };
            for (name, addrs) in self.target.send_targets(&self.initiator_name, self.initiator_addr, self.local_addr, which) {
                out.push(("TargetName".into(), name));
                out.extend(addrs.into_iter().map(|a| ("TargetAddress".to_string(), a)));
            }
        }
        out
    }
}
