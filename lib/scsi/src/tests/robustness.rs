//! Malformed input and thread-safety of the shared types.

use super::*;

#[test]
fn malformed_cdbs_never_panic() {
    // Every opcode with random bytes and random data: a status, never a panic.
    let mut e = env();
    let a = e.a.clone();
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20000u32 {
        let mut cdb = [0u8; 16];
        for b in cdb.iter_mut() {
            *b = rnd() as u8;
        }
        cdb[0] = (i % 256) as u8;
        if cdb[0] == op::START_STOP_UNIT
            || cdb[0] == op::MODE_SELECT6
            || cdb[0] == op::MODE_SELECT10
        {
            continue; // would change LUN state for the rest of the loop
        }
        let edtl = (rnd() % 70000) as u32;
        let data = if rnd() % 2 == 0 {
            Some((0..(rnd() % 5000)).map(|_| rnd() as u8).collect())
        } else {
            None
        };
        let r = e.run(&a, &cdb, edtl, data);
        assert!(r.data_len <= edtl as usize);
        if r.status == Status::CheckCondition {
            assert!(r.sense_triplet().is_some());
        }
    }
}

#[test]
fn shared_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Lun>();
    send_sync::<Nexus>();
    send::<ScsiTask<'static>>();
    send::<ScsiResult>();
}
