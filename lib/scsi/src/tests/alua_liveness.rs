//! ALUA that follows liveness (issue 23): the pure computation (members + preferred states +
//! failback policy → effective states), the [`Alua`] state machine over it (transitioning
//! while taking over, held groups, failback), and what a nexus sees through it.

use std::collections::BTreeSet;

use riser_bdev::{Member, MemberState};

use super::*;
use crate::alua::{effective, liveness, AccessState, Alua, Change, Failback, Liveness, PortGroup, Why};
use crate::sense::{Asc, CmdError, SenseKey};

use AccessState::{ActiveNonOptimized as Ano, ActiveOptimized as Ao, Standby as Sb, Transitioning as Tr, Unavailable as Un};

const READ10: [u8; 10] = [op::READ10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const RTPG: [u8; 12] = [op::MAINTENANCE_IN, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];

fn member(id: u64, name: &str, served: &[u32], state: MemberState) -> Member {
    Member { id, name: name.into(), addr: format!("10.0.0.{id}:0/{id}"), served: served.to_vec(), state }
}
fn live(id: u64, name: &str, served: &[u32]) -> Member {
    member(id, name, served, MemberState::Live)
}
fn fenced(id: u64, name: &str, served: &[u32]) -> Member {
    member(id, name, served, MemberState::Fenced)
}

fn groups(d: &[(u16, AccessState)]) -> Vec<PortGroup> {
    d.iter().map(|&(id, st)| PortGroup::new(id, st)).collect()
}

/// (id, state, why) of the effective groups.
fn states(e: &crate::alua::Effective) -> Vec<(u16, AccessState, &'static str)> {
    e.groups.iter().map(|(g, w)| (g.id, g.state, w.name())).collect()
}

fn none() -> BTreeSet<u16> {
    BTreeSet::new()
}

#[test]
fn liveness_downs_a_group_only_when_fenced_members_alone_served_it() {
    // This gateway (a) serves 1, b served 2 and was fenced.
    let m = vec![vec![live(1, "a:1", &[1]), fenced(2, "b:2", &[2])]];
    let l = liveness(&m, &[1], false);
    assert_eq!(l.down.into_iter().collect::<Vec<_>>(), [(2, Why::Fenced(vec!["b:2".into()]))]);
    assert_eq!(l.live.into_iter().collect::<Vec<_>>(), [1]);
    // b rejoined as a new member serving 2 again: nothing is down.
    let m = vec![vec![live(1, "a:1", &[1]), fenced(2, "b:2", &[2]), live(3, "b:3", &[2])]];
    let l = liveness(&m, &[1], false);
    assert!(l.down.is_empty());
    assert_eq!(l.live.into_iter().collect::<Vec<_>>(), [1, 2]);
    // A gateway that stopped answering but is not fenced keeps its group (no action on an
    // absence); one serving nothing counts for nothing.
    let m = vec![vec![live(1, "a:1", &[1]), live(2, "b:2", &[2]), fenced(4, "c:4", &[])]];
    assert!(liveness(&m, &[1], false).down.is_empty());
    // This gateway's old, fenced incarnation before it republished: its own groups are
    // not down while it is live.
    let m = vec![vec![fenced(1, "a:1", &[1]), live(5, "a:5", &[]), live(2, "b:2", &[2])]];
    assert!(liveness(&m, &[1], false).down.is_empty());
    // This gateway fenced: its local groups are down, the live peer's are live.
    let l = liveness(&m, &[1], true);
    assert_eq!(l.down.into_iter().collect::<Vec<_>>(), [(1, Why::SelfFenced)]);
    assert_eq!(l.live.into_iter().collect::<Vec<_>>(), [2]);
    // Two devices: a group down in one device's gateway group is down.
    let m = vec![vec![live(1, "a:1", &[1]), live(2, "b:2", &[2])], vec![live(11, "a:11", &[1]), fenced(12, "b:12", &[2])]];
    assert_eq!(liveness(&m, &[1], false).down.keys().copied().collect::<Vec<_>>(), [2]);
    // Tags beyond 16 bits are no target port groups.
    assert!(liveness(&[vec![fenced(2, "b", &[70000])]], &[1], false).down.is_empty());
}

#[test]
fn effective_states_from_preferred_liveness_and_policy() {
    let pref = groups(&[(1, Ao), (2, Sb)]);
    let l = |m: Vec<Member>, fenced_here: bool| liveness(&[m], &[1], fenced_here);
    // Nobody fenced: the preferred states.
    let e = effective(&pref, &l(vec![live(1, "a", &[1]), live(2, "b", &[2])], false), &none(), Failback::Auto);
    assert_eq!(states(&e), [(1, Ao, "preferred"), (2, Sb, "preferred")]);
    // The standby gateway fenced: its group unavailable, the active one stays as it is.
    let e = effective(&pref, &l(vec![live(1, "a", &[1]), fenced(2, "b", &[2])], false), &none(), Failback::Auto);
    assert_eq!(states(&e), [(1, Ao, "preferred"), (2, Un, "fenced")]);
    // Seen from b's side: the active gateway (a, group 1) fenced; b's group takes over.
    let lb = liveness(&[vec![fenced(1, "a", &[1]), live(2, "b", &[2])]], &[2], false);
    let e = effective(&pref, &lb, &none(), Failback::Auto);
    assert_eq!(states(&e), [(1, Un, "fenced"), (2, Ao, "taking_over")]);
    assert!(e.held.is_empty(), "auto failback holds nothing");
    // Manual failback: group 1 is held from then on ...
    let e = effective(&pref, &lb, &none(), Failback::Manual);
    assert_eq!(e.held.iter().copied().collect::<Vec<_>>(), [1]);
    // ... and stays out of service once a rejoined a serves it again, b still optimized.
    let back = liveness(&[vec![fenced(1, "a", &[1]), live(3, "a2", &[1]), live(2, "b", &[2])]], &[2], false);
    let e2 = effective(&pref, &back, &e.held, Failback::Manual);
    assert_eq!(states(&e2), [(1, Un, "held"), (2, Ao, "taking_over")]);
    // Auto failback (or the administrator releasing the hold): the preferred states.
    assert_eq!(states(&effective(&pref, &back, &e.held, Failback::Auto)), [(1, Ao, "preferred"), (2, Sb, "preferred")]);
    assert_eq!(states(&effective(&pref, &back, &none(), Failback::Manual)), [(1, Ao, "preferred"), (2, Sb, "preferred")]);
    // Three gateways: a fenced standby moves nobody else; a fenced active one promotes
    // every live group, but not groups nobody serves.
    let pref3 = groups(&[(1, Ao), (2, Ano), (3, Sb), (4, Sb)]);
    let m = vec![live(1, "a", &[1]), live(2, "b", &[2]), fenced(3, "c", &[3])];
    assert_eq!(
        states(&effective(&pref3, &liveness(&[m], &[1], false), &none(), Failback::Auto)),
        [(1, Ao, "preferred"), (2, Ano, "preferred"), (3, Un, "fenced"), (4, Sb, "preferred")]
    );
    let m = vec![fenced(1, "a", &[1]), live(2, "b", &[2]), live(3, "c", &[3])];
    assert_eq!(
        states(&effective(&pref3, &liveness(&[m], &[2], false), &none(), Failback::Auto)),
        [(1, Un, "fenced"), (2, Ao, "taking_over"), (3, Ao, "taking_over"), (4, Sb, "preferred")]
    );
    // This gateway fenced: its own group unavailable, the peer's takes over.
    let e = effective(&pref, &l(vec![fenced(1, "a", &[1]), live(2, "b", &[2])], true), &none(), Failback::Auto);
    assert_eq!(states(&e), [(1, Un, "self_fenced"), (2, Ao, "taking_over")]);
    // Without a description: the local group shows only while it is not active/optimized.
    let e = effective(&[], &l(vec![live(1, "a", &[1])], true), &none(), Failback::Auto);
    assert_eq!(states(&e), [(1, Un, "self_fenced")]);
    assert_eq!(states(&effective(&[], &l(vec![live(1, "a", &[1])], false), &none(), Failback::Auto)), []);
    assert_eq!(Failback::from_name("manual"), Some(Failback::Manual));
    assert_eq!(Failback::from_name("Auto"), None);
}

fn ch(id: u16, old: AccessState, new: AccessState, why: Why) -> Change {
    Change { id, old, new, why }
}

#[test]
fn takeover_reports_transitioning_then_optimized_and_failback_follows_the_policy() {
    let a = Alua::new();
    let mut g1 = PortGroup::new(1, Ao);
    g1.pref = true;
    assert!(a.set_groups(vec![g1, PortGroup::new(2, Sb)]));
    // This gateway serves group 2; the gateway of group 1 is fenced.
    let down = liveness(&[vec![fenced(1, "a:100", &[1]), live(2, "b:200", &[2])]], &[2], false);
    let c = a.set_liveness(down.clone());
    let fenced_a = Why::Fenced(vec!["a:100".into()]);
    assert_eq!(c, [ch(1, Ao, Un, fenced_a.clone()), ch(2, Sb, Tr, Why::TakingOver)]);
    assert!(a.is_transitioning());
    let read = crate::cdb::Cdb::new(&READ10);
    assert_eq!(a.check(2, &read), Err(CmdError::check(SenseKey::NotReady, Asc::LUN_NOT_ACCESSIBLE_TRANSITIONING)));
    assert_eq!(a.finish_transition(), [ch(2, Tr, Ao, Why::TakingOver)]);
    assert!(!a.is_transitioning());
    assert_eq!(a.check(2, &read), Ok(()));
    assert_eq!(a.check(1, &read), Err(CmdError::check(SenseKey::NotReady, Asc::LUN_NOT_ACCESSIBLE_UNAVAILABLE)));
    let g = a.groups();
    assert_eq!(g.iter().map(|g| (g.id, g.state, g.status, g.pref)).collect::<Vec<_>>(), [(1, Un, 2, true), (2, Ao, 2, false)]);
    // The preferred states are kept apart from the effective ones.
    assert_eq!(a.preferred().iter().map(|g| g.state).collect::<Vec<_>>(), [Ao, Sb]);
    let v = a.view();
    assert_eq!(
        v.iter().map(|v| (v.group.id, v.preferred, v.effective, v.why.name())).collect::<Vec<_>>(),
        [(1, Ao, Un, "fenced"), (2, Sb, Ao, "taking_over")]
    );

    // The fenced member drops out of the record: group 1 stays down (no recovery by absence).
    assert!(a.set_liveness(liveness(&[vec![live(2, "b:200", &[2])]], &[2], false)).is_empty());
    assert_eq!(a.state_of(1), Un);

    // a rejoins: auto failback returns to the preferred states; a group already active
    // does not go through transitioning on the way back.
    let back = liveness(&[vec![fenced(1, "a:100", &[1]), live(3, "a:300", &[1]), live(2, "b:200", &[2])]], &[2], false);
    assert_eq!(a.set_liveness(back.clone()), [ch(1, Un, Ao, Why::Preferred), ch(2, Ao, Sb, Why::Preferred)]);
    assert!(!a.is_transitioning());

    // Manual: the same fencing, then the rejoin changes nothing ...
    assert!(a.set_failback(Failback::Manual).is_empty());
    a.set_liveness(down.clone());
    a.finish_transition();
    assert!(a.set_liveness(back.clone()).is_empty(), "manual failback: the failed-over states stay");
    assert_eq!(a.view()[0].why, Why::Held);
    // ... until the administrator fails back.
    let (c, released) = a.failback_now();
    assert_eq!(released, [1]);
    assert_eq!(c, [ch(1, Un, Ao, Why::Preferred), ch(2, Ao, Sb, Why::Preferred)]);
    // A failback while the group is still fenced keeps it unavailable.
    a.set_liveness(down.clone());
    a.finish_transition();
    let (c, released) = a.failback_now();
    assert!(c.is_empty() && released.is_empty(), "{c:?} {released:?}");
    // Setting the held group's state releases it too; switching to auto fails back.
    a.set_liveness(back.clone());
    assert_eq!(a.state_of(1), Un);
    assert_eq!(a.set_preferred_state(1, Ano), Some(vec![ch(1, Un, Ano, Why::Preferred), ch(2, Ao, Sb, Why::Preferred)]));
    a.set_preferred_state(1, Ao);
    a.set_liveness(down);
    a.finish_transition();
    a.set_liveness(back);
    assert_eq!(a.state_of(1), Un);
    assert_eq!(a.set_failback(Failback::Auto).len(), 2);
    assert_eq!(a.state_of(1), Ao);
    // A new description releases every hold as well, and nothing changes without liveness.
    assert_eq!(a.set_liveness(Liveness::default()), []);
}

#[test]
fn a_fenced_gateway_reports_its_group_unavailable_with_an_implicit_change() {
    let mut e = env();
    let alua = Alua::new();
    // No description: the nexus's group alone, active/optimized.
    let n = Arc::new(Nexus::new("iqn.2024-01.test:alua", 0x23d0_0000_0201, "iqn.2024-01.test:tgt", 1).with_alua(alua.clone()));
    e.check(&n, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None, (6, 0x29, 0x00));
    e.ok(&n, &READ10, 512, None);
    let c = alua.set_liveness(liveness(&[vec![fenced(1, "a:1", &[1]), live(2, "b:2", &[2])]], &[1], true));
    assert_eq!(c, [ch(1, Ao, Un, Why::SelfFenced)]);
    e.lun.establish_ua_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    e.check(&n, &READ10, 512, None, (6, 0x2A, 0x06));
    e.check(&n, &READ10, 512, None, (2, 0x04, 0x0C));
    // RTPG: group 1 unavailable, STATUS CODE implicit change.
    let d = e.ok(&n, &RTPG, 256, None);
    assert_eq!(d, [0, 0, 0, 12, 0x03, 0x8F, 0, 1, 0, 2, 0, 1, 0, 0, 0, 1]);
    // Rejoined: back to no description, active/optimized.
    assert_eq!(alua.set_liveness(liveness(&[vec![live(3, "a:3", &[1]), live(2, "b:2", &[2])]], &[1], false)), [ch(1, Un, Ao, Why::Preferred)]);
    e.ok(&n, &READ10, 512, None);
}
