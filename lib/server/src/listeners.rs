//! Listeners: one per portal of every started portal group, by the portal's transport,
//! started and stopped as the configuration changes. Each hands its new connections to the
//! login driver.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use riser_iscsi::login::{LoginSink, LoginTransport, PollerStatus, PortalSpec, ReactorPoller};
use riser_reactor::PollStatus;
use riser_iscsi::negotiate::Transport;

use crate::IscsiServer;

/// What a listener holds of the server: new connections go to the login driver.
struct Sink(Weak<IscsiServer>);

impl LoginSink for Sink {
    fn accept(&self, portal: PortalSpec, conn: Box<dyn LoginTransport>) -> bool {
        match self.0.upgrade() {
            Some(server) => server.start_login(portal, conn),
            None => false,
        }
    }

    fn may_accept(&self, peer: SocketAddr) -> bool {
        self.0.upgrade().is_some_and(|server| server.may_start_login(peer))
    }

    fn max_logins(&self) -> Option<usize> {
        self.0.upgrade().map(|server| server.target.options().max_logins as usize)
    }

    fn place(&self) -> usize {
        self.0.upgrade().map_or(0, |s| s.reactors.least_loaded())
    }

    fn attach_poller(&self, reactor: usize, mut poller: ReactorPoller) -> bool {
        let Some(server) = self.0.upgrade() else { return false };
        server
            .reactors
            .send_blocking(reactor, move |ctx| {
                ctx.add_poller(move |_| match poller() {
                    PollerStatus::Busy => PollStatus::Busy,
                    PollerStatus::Idle => PollStatus::Idle,
                    PollerStatus::Done => PollStatus::Done,
                });
            })
            .is_ok()
    }
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "iSCSI",
        Transport::Iser => "iSER",
    }
}

impl IscsiServer {
    /// The [`LoginSink`] a listener of this server gets (what a transport sees of it).
    pub fn login_sink(self: &Arc<Self>) -> Arc<dyn LoginSink> {
        Arc::new(Sink(Arc::downgrade(self)))
    }

    /// Starts listeners for every portal of every started portal group and stops the ones
    /// no longer configured.
    pub fn sync_listeners(self: &Arc<Self>) {
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        let mut want: HashMap<(SocketAddr, Transport), u16> = HashMap::new();
        for pg in self.target.portal_groups() {
            if !pg.started {
                continue;
            }
            for p in &pg.portals {
                let t = if p.iser { Transport::Iser } else { Transport::Tcp };
                want.insert((p.addr, t), pg.tag as u16);
            }
        }
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.retain(|key, stop| {
            let keep = want.contains_key(key);
            if !keep {
                stop.store(true, Ordering::Release);
                log::info!("{} portal {}: listener stopped", transport_name(key.1), key.0);
            }
            keep
        });
        for ((addr, kind), tag) in want {
            if listeners.contains_key(&(addr, kind)) {
                continue;
            }
            let name = transport_name(kind);
            let Some(transport) = self.transports.iter().find(|t| t.kind() == kind) else {
                log::error!("{name} portal {addr} (portal group {tag}): this riser has no {name} transport");
                continue;
            };
            let stop = Arc::new(AtomicBool::new(false));
            let sink = self.login_sink();
            let portal = PortalSpec { addr, portal_group_tag: tag };
            match transport.listen(portal, sink, stop.clone()) {
                Ok(()) => {
                    if kind == Transport::Tcp {
                        log::info!("{name} portal {addr} (portal group {tag}): listening");
                    }
                    listeners.insert((addr, kind), stop);
                }
                Err(e) => log::error!("{name} portal {addr} (portal group {tag}): {e}"),
            }
        }
    }
}
