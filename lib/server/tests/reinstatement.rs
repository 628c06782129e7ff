//! Session reinstatement and the I_T nexus (issue #22's leftovers): a reinstated session is
//! the same I_T nexus as the session it replaces, and the old session's connection may end
//! seconds after the new session started (it is closed once its queued data is out, or after
//! the close grace when the initiator reads nothing any more). Its end must not release what
//! the new session took meanwhile: riser before released the new session's RESERVE when the
//! old connection went, and another initiator could write under it. Over real TCP sockets,
//! so that what the old session does not read backs up.

mod common;

use std::time::{Duration, Instant};

use riser_initiator::scsi::{rw_cdb, Dir};
use riser_initiator::session::Unsolicited;

use common::*;

/// RESERVATION CONFLICT.
const CONFLICT: u8 = 0x18;

fn reserve6<W: Wire>(c: &mut Client<W>) -> u8 {
    let (itt, pdus) = c.s.scsi_command(&[0x16, 0, 0, 0, 0, 0], 0, &[], Unsolicited::Negotiated).expect("RESERVE(6)");
    c.send(pdus);
    c.completion(itt).status
}

#[test]
fn the_old_sessions_end_leaves_the_reservation_the_new_session_took() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let addr = format!("127.0.0.1:{port}");
    let env = Env::tcp(&addr);
    let connect = || TcpWire::connect(addr.parse().expect("address"));
    let (mut other, _) = Client::login_over(connect(), 2, keys(true, false, 65536));
    // The old session asks for 32 MiB and reads none of it: its connection cannot close
    // before the close grace.
    let (mut old, _) = Client::login_over(connect(), 1, keys(true, false, 65536));
    for _ in 0..32 {
        let (_, pdu) = old.s.read(&rw_cdb(Dir::Read, 0, 2048), 1 << 20).expect("a READ");
        old.send([pdu]);
    }
    std::thread::sleep(Duration::from_millis(300));
    // The initiator comes back with a new connection: session reinstatement.
    let (mut new, _) = Client::login_over(connect(), 1, keys(true, false, 65536));
    assert_eq!(reserve6(&mut new), 0, "RESERVE(6) through the new session");
    assert_eq!(other.read(0, 512).status, CONFLICT, "another initiator under the reservation");
    // The old session's connection ends (after the close grace).
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.connections().len() > 2 {
        assert!(Instant::now() < deadline, "the old connection still there: {:?}", env.connections());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(other.read(0, 512).status, CONFLICT, "the old session's end released the new session's reservation");
    assert_eq!(reserve6(&mut new), 0, "the new session still holds it");
    // Released by its holder, the LUN is the other initiator's again.
    let (itt, pdus) = new.s.scsi_command(&[0x17, 0, 0, 0, 0, 0], 0, &[], Unsolicited::Negotiated).expect("RELEASE(6)");
    new.send(pdus);
    good(&new.completion(itt));
    good(&other.read(0, 512));
    drop(old);
    new.logout();
    other.logout();
}
