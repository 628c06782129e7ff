//! Task management: aborts.

use super::*;

#[test]
fn abort_tasks() {
    let mut e = env();
    let a = e.a.clone();
    // Aborting a task whose I/O is in flight reports it aborted, once.
    let t = e.task(&a, &rw10(op::READ10, 0, 8, 0), 8 * BS as u32, None);
    let tag = t.tag;
    e.ch().submit(t);
    assert!(e.ch().abort_task(&a, tag));
    assert!(!e.ch().abort_task(&a, tag));
    let mut out = vec![];
    while e.ch().outstanding() > 0 {
        e.ch().poll(&mut out);
    }
    assert_eq!(out.len(), 1);
    // Aborted: no result, no data.
    assert!(out[0].is_aborted());
    // A COMPARE AND WRITE waiting for its range is dropped by abort_nexus.
    let g = {
        e.lun.ranges.begin_exclusive();
        e.lun.ranges.try_exclusive(riser_bdev::Lba::new(0), 1).unwrap()
    };
    let mut d = vec![0u8; BS];
    d.extend(vec![1u8; BS]);
    let t = e.task(&a, &caw(0, 1), 2 * BS as u32, Some(d));
    e.ch().submit(t);
    out.clear();
    e.ch().poll(&mut out);
    assert!(out.is_empty());
    assert_eq!(e.ch().abort_nexus(&a), 1);
    e.ch().poll(&mut out);
    assert_eq!(out.len(), 1);
    assert!(out[0].is_aborted());
    e.lun.ranges.release(g);
    assert!(e.lun.ranges.idle());
    assert_eq!(e.ch().outstanding(), 0);
    // A channel dropped with a COMPARE AND WRITE in flight releases its range.
    let mut ch2 = LunChannel::new(e.lun.clone());
    let mut d = vec![0u8; BS];
    d.extend(vec![1u8; BS]);
    let t = e.task(&a, &caw(0, 1), 2 * BS as u32, Some(d));
    ch2.submit(t);
    drop(ch2);
    assert!(e.lun.ranges.idle());
}
