//! Test support (feature `test-util`): a [`GatewayGroup`] driven by the test
//! ([`FakeGatewayGroup`]) and a device that has one ([`GroupedBdev`], any device with a
//! group attached), so the target layer's reaction to membership, fencing and rejoining is
//! tested without a cluster.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::gateways::{GatewayGroup, GatewayGroupHandle, GroupEvent, Member, MemberState, OnGroupEvent};
use crate::{Bdev, BdevError, BdevInfo, IoChannel, IoKind, Lba, LbaRun, OnNotify, SharedStateHandle};

/// A gateway group whose membership the test sets. Events are delivered on the calling
/// thread (the test's), as the real group delivers them on its own.
pub struct FakeGatewayGroup {
    inner: Mutex<Inner>,
    subscribers: Mutex<Vec<Arc<OnGroupEvent>>>,
}

struct Inner {
    me: Member,
    peers: Vec<Member>,
    fenced: bool,
    /// Every `set_served` call, in order.
    served_calls: Vec<Vec<u32>>,
}

impl FakeGatewayGroup {
    /// A group in which this gateway is `me` (live, serving nothing yet).
    pub fn new(me_id: u64, me_name: &str) -> Arc<FakeGatewayGroup> {
        let me = Member { id: me_id, name: me_name.into(), addr: format!("10.0.0.1:0/{me_id}"), served: Vec::new(), state: MemberState::Live };
        Arc::new(FakeGatewayGroup {
            inner: Mutex::new(Inner { me, peers: Vec::new(), fenced: false, served_calls: Vec::new() }),
            subscribers: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells every subscriber (on this thread).
    pub fn emit(&self, ev: GroupEvent) {
        let subs: Vec<Arc<OnGroupEvent>> = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for s in subs {
            s(&ev);
        }
    }

    /// Adds or replaces (by id) a peer, then emits [`GroupEvent::Changed`].
    pub fn set_peer(&self, id: u64, name: &str, served: &[u32], state: MemberState) {
        {
            let mut i = self.lock();
            i.peers.retain(|m| m.id != id);
            i.peers.push(Member { id, name: name.into(), addr: format!("10.0.0.2:0/{id}"), served: served.to_vec(), state });
        }
        self.emit(GroupEvent::Changed);
    }

    /// This gateway is fenced (its member too), then [`GroupEvent::SelfFenced`].
    pub fn fence_me(&self) {
        {
            let mut i = self.lock();
            i.fenced = true;
            i.me.state = MemberState::Fenced;
        }
        self.emit(GroupEvent::SelfFenced);
    }

    /// This gateway rejoins as member `new_id` (the old one stays, fenced), then
    /// [`GroupEvent::Rejoined`].
    pub fn rejoin_me(&self, new_id: u64) {
        {
            let mut i = self.lock();
            let old = i.me.clone();
            i.peers.push(old.clone());
            i.me = Member { id: new_id, addr: format!("10.0.0.1:0/{new_id}"), served: Vec::new(), state: MemberState::Live, ..old };
            i.fenced = false;
        }
        self.emit(GroupEvent::Rejoined);
    }

    /// Every `set_served` call so far.
    pub fn served_calls(&self) -> Vec<Vec<u32>> {
        self.lock().served_calls.clone()
    }

    /// Subscribers so far.
    pub fn subscribers(&self) -> usize {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl GatewayGroup for FakeGatewayGroup {
    fn describe(&self) -> String {
        "fake group".into()
    }
    fn me(&self) -> Member {
        self.lock().me.clone()
    }
    fn members(&self) -> Vec<Member> {
        let i = self.lock();
        std::iter::once(i.me.clone()).chain(i.peers.iter().cloned()).collect()
    }
    fn set_served(&self, tpg_ids: &[u32]) {
        let mut i = self.lock();
        i.me.served = tpg_ids.to_vec();
        i.served_calls.push(tpg_ids.to_vec());
    }
    fn is_fenced(&self) -> bool {
        self.lock().fenced
    }
    fn subscribe(&self, on_event: OnGroupEvent) {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::new(on_event));
    }
}

/// A device (`inner`) exported by a group of gateways (`group`).
pub struct GroupedBdev {
    inner: Arc<dyn Bdev>,
    group: GatewayGroupHandle,
}

impl GroupedBdev {
    pub fn new(inner: Arc<dyn Bdev>, group: GatewayGroupHandle) -> Arc<GroupedBdev> {
        Arc::new(GroupedBdev { inner, group })
    }
}

impl Bdev for GroupedBdev {
    fn info(&self) -> &BdevInfo {
        self.inner.info()
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.inner.supports(kind)
    }
    fn open_channel(self: Arc<Self>) -> Box<dyn IoChannel> {
        self.inner.clone().open_channel()
    }
    fn config_json(&self) -> (&'static str, serde_json::Value) {
        self.inner.config_json()
    }
    fn driver_specific(&self) -> serde_json::Value {
        self.inner.driver_specific()
    }
    fn rescan_blocks(&self) -> Option<Result<u64, BdevError>> {
        self.inner.rescan_blocks()
    }
    fn set_num_blocks(&self, num_blocks: u64) {
        self.inner.set_num_blocks(num_blocks)
    }
    fn provisioning(&self, lba: Lba, max_blocks: u64, max_runs: usize) -> Option<Result<Vec<LbaRun>, BdevError>> {
        self.inner.provisioning(lba, max_blocks, max_runs)
    }
    fn shared_state(&self, purpose: &str, on_notify: OnNotify) -> Option<Result<SharedStateHandle, BdevError>> {
        self.inner.shared_state(purpose, on_notify)
    }
    fn gateway_group(&self) -> Option<GatewayGroupHandle> {
        Some(self.group.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BdevRegistry;

    #[test]
    fn the_registry_gives_the_device_with_its_group() {
        let mut reg = BdevRegistry::new();
        let name = reg.create_malloc(Some("M0"), 64, 512, None).unwrap();
        let inner = reg.get(&name).unwrap();
        reg.delete(&name, None).unwrap();
        let g = FakeGatewayGroup::new(1, "a:1");
        reg.register(GroupedBdev::new(inner, g.clone())).unwrap();
        // Through the registry's counting wrapper, as LUNs get it.
        let b = reg.claim("M0", "test").unwrap();
        let group = b.gateway_group().expect("the counting wrapper forwards gateway_group");
        group.set_served(&[3]);
        assert_eq!(g.served_calls(), [vec![3]]);
        assert_eq!(group.members().len(), 1);
        assert!(reg.get("Malloc0").is_none() && reg.create_null("N0", 8, 512, None).is_ok());
        assert!(reg.get("N0").unwrap().gateway_group().is_none(), "a local device has no group");
    }
}
