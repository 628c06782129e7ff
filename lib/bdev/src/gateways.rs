//! The gateways that export one device (issue 23, highly available gateways): several riser
//! processes in front of one RBD image know each other through the cluster (RBD: the group
//! object `riser_gw.<image id>` next to the image), see who is alive, and fence one that
//! stops answering before anyone acts on its absence (RBD: its RADOS client is put on the
//! OSD blocklist, so nothing it has in flight or sends later reaches the image).
//!
//! The device side (membership, liveness, fencing, rejoining) implements [`GatewayGroup`];
//! the target side (ALUA states that follow liveness, dropping the sessions of a gateway
//! that was fenced) subscribes to its [`GroupEvent`]s. Local devices have no group.
//!
//! Every method may be called from any thread and never blocks on the network (the group
//! keeps its own thread for that); callbacks run on that thread, never on a reactor.

use std::sync::Arc;

/// Whether a member may serve I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Renewing its liveness.
    Live,
    /// Stopped renewing and was fenced (blocklisted): it can no longer reach the device. It
    /// comes back, if it does, as a new member (a new id).
    Fenced,
}

/// One gateway of the group, as this gateway sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Unique per incarnation (RBD: the RADOS client's instance id): a gateway that rejoins
    /// after being fenced has a new one.
    pub id: u64,
    /// For people: `host:pid` of the riser process.
    pub name: String,
    /// What fencing blocks (RBD: the RADOS client address, as `ceph osd blocklist ls` shows it).
    pub addr: String,
    /// The target port group ids (portal group tags) this gateway serves the device through,
    /// as it published them with [`GatewayGroup::set_served`].
    pub served: Vec<u32>,
    pub state: MemberState,
}

/// What a subscriber is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    /// The membership changed (a gateway joined, was fenced, rejoined, or changed what it
    /// serves): read [`GatewayGroup::members`] for the new view.
    Changed,
    /// This gateway was fenced: its I/O to the device fails from now on (the device fails
    /// it fast), and the sessions that reach the device through it should be dropped.
    SelfFenced,
    /// This gateway rejoined as a new member after being fenced and serves I/O again.
    Rejoined,
}

/// Called on the group's thread for every event.
pub type OnGroupEvent = Box<dyn Fn(&GroupEvent) + Send + Sync>;

/// A device's group of gateways.
pub trait GatewayGroup: Send + Sync {
    /// Where the group lives, for messages (`rbd pool/riser_gw.<id>`).
    fn describe(&self) -> String;
    /// This gateway, as the group knows it.
    fn me(&self) -> Member;
    /// Every member this gateway knows of (itself included), live and fenced.
    fn members(&self) -> Vec<Member>;
    /// Publishes the target port group ids this gateway serves the device through (the
    /// target layer calls it when a LUN on the device is exported or unexported).
    fn set_served(&self, tpg_ids: &[u32]);
    /// Whether this gateway is fenced right now (until it has rejoined).
    fn is_fenced(&self) -> bool;
    /// Adds a subscriber; it lives as long as the group.
    fn subscribe(&self, on_event: OnGroupEvent);
}

/// What [`Bdev::gateway_group`](crate::Bdev::gateway_group) gives.
pub type GatewayGroupHandle = Arc<dyn GatewayGroup>;
