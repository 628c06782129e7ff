//! (to be written: see rbd_gateways.rs)

use riser_tests::ceph::CephCluster;

pub fn check(_ceph: &CephCluster) {}
