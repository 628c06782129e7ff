//! In memory, for tests of everything above the datamover (the login driver, the connection
//! glue, the iSCSI layer, SCSI): a portal that takes "connections" from a test instead of a
//! socket, each an in-memory duplex byte pipe carrying iSCSI PDUs exactly as TCP would. The
//! server end runs the real TCP login transport and datamover over it (`TcpLogin`,
//! `TcpDatamover`); the test end is a [`MemClient`] that sends and receives whole PDUs.
//! No sockets, no RDMA: deterministic and fast.
//!
//! Behind the `test-util` feature (as tokio does).

use std::collections::{HashMap, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use riser_iscsi::framer::Framer;
use riser_iscsi::login::{LoginSink, PortalSpec, PortalTransport};
use riser_iscsi::negotiate::Transport;
use riser_iscsi::pdu::{Digests, Pdu};

use crate::tcp::portal::{LoginStream, TcpLogin};
use crate::tcp::ByteStream;

/// One direction of a pipe.
#[derive(Default)]
struct Half {
    bytes: VecDeque<u8>,
    closed: bool,
}

#[derive(Default)]
struct Pipe {
    half: Mutex<Half>,
    ready: Condvar,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, Half> {
        self.half.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One end of an in-memory duplex byte stream.
pub struct MemStream {
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
    peer: SocketAddr,
    /// None: never block; Some: block at most this long.
    read_timeout: Option<Duration>,
}

/// Two connected ends: bytes written to one are read from the other.
pub fn stream_pair(a: SocketAddr, b: SocketAddr) -> (MemStream, MemStream) {
    let (p, q) = (Arc::new(Pipe::default()), Arc::new(Pipe::default()));
    (
        MemStream { rx: p.clone(), tx: q.clone(), peer: b, read_timeout: Some(Duration::from_secs(5)) },
        MemStream { rx: q, tx: p, peer: a, read_timeout: Some(Duration::from_secs(5)) },
    )
}

impl Read for MemStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline = self.read_timeout.map(|t| Instant::now() + t);
        let mut h = self.rx.lock();
        loop {
            if !h.bytes.is_empty() {
                let n = buf.len().min(h.bytes.len());
                for (d, s) in buf.iter_mut().zip(h.bytes.drain(..n)) {
                    *d = s;
                }
                return Ok(n);
            }
            if h.closed {
                return Ok(0);
            }
            let Some(deadline) = deadline else {
                return Err(ErrorKind::WouldBlock.into());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(ErrorKind::TimedOut.into());
            }
            h = self.rx.ready.wait_timeout(h, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Write for MemStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut h = self.tx.lock();
        if h.closed {
            return Err(ErrorKind::BrokenPipe.into());
        }
        h.bytes.extend(buf);
        self.tx.ready.notify_all();
        Ok(buf.len())
    }

    /// All of the slices, as a TCP socket with room in its send buffer takes them (the
    /// default would take only the first, a writev per chunk no socket makes).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut h = self.tx.lock();
        if h.closed {
            return Err(ErrorKind::BrokenPipe.into());
        }
        let mut n = 0;
        for b in bufs {
            h.bytes.extend(b.iter());
            n += b.len();
        }
        self.tx.ready.notify_all();
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ByteStream for MemStream {
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.read_timeout = Some(timeout);
        Ok(())
    }

    fn set_nonblocking(&mut self) -> io::Result<()> {
        self.read_timeout = None;
        Ok(())
    }

    fn shutdown(&mut self) {
        for p in [&self.rx, &self.tx] {
            p.lock().closed = true;
            p.ready.notify_all();
        }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        Some(self.peer)
    }
}

impl LoginStream for MemStream {
    /// Writes to a pipe never block (it has no bound), so there is nothing to give up on.
    fn set_write_timeout(&mut self, _timeout: Duration) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for MemStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The portals of an in-memory "network": the server listens through it like through TCP
/// (it negotiates as TCP), tests connect with [`MemPortal::connect`]. Clone it to keep a
/// handle for connecting after giving it to the server.
#[derive(Clone, Default)]
pub struct MemPortal {
    listening: Arc<Mutex<HashMap<SocketAddr, Listening>>>,
}

/// A listening portal of [`MemPortal`]: its spec, where its logins go, and its stop flag.
type Listening = (PortalSpec, Arc<dyn LoginSink>, Arc<AtomicBool>);

impl PortalTransport for MemPortal {
    fn kind(&self) -> Transport {
        Transport::Tcp
    }

    fn listen(&self, portal: PortalSpec, sink: Arc<dyn LoginSink>, stop: Arc<AtomicBool>) -> Result<(), String> {
        let mut l = self.listening.lock().unwrap_or_else(|p| p.into_inner());
        l.insert(portal.addr, (portal, sink, stop));
        Ok(())
    }
}

impl MemPortal {
    /// Connects from `from` to the portal listening on `to`; the server starts its login.
    pub fn connect(&self, from: SocketAddr, to: SocketAddr) -> io::Result<MemClient> {
        let (portal, sink) = {
            let mut l = self.listening.lock().unwrap_or_else(|p| p.into_inner());
            l.retain(|_, (_, _, stop)| !stop.load(std::sync::atomic::Ordering::Acquire));
            let (portal, sink, _) = l.get(&to).ok_or(ErrorKind::ConnectionRefused)?;
            (*portal, sink.clone())
        };
        let (login, client) = connection(from, to);
        if !sink.accept(portal, Box::new(login)) {
            return Err(ErrorKind::ConnectionRefused.into());
        }
        Ok(client)
    }
}

/// One in-memory connection from `from` to `to`, not handed to any server yet: the target's
/// login transport and the initiator's end (to wrap the login transport in a test's own).
pub fn connection(from: SocketAddr, to: SocketAddr) -> (TcpLogin<MemStream>, MemClient) {
    let (server, client) = stream_pair(to, from);
    (TcpLogin::new(server, from, Some(to)), MemClient { stream: client, framer: Framer::new(), digests: Digests::default() })
}

/// The initiator's end of an in-memory connection: whole PDUs in and out.
pub struct MemClient {
    stream: MemStream,
    framer: Framer,
    digests: Digests,
}

impl MemClient {
    /// Sends one PDU.
    pub fn send(&mut self, pdu: &Pdu) -> io::Result<()> {
        let bytes = pdu.to_bytes(self.digests).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&bytes)
    }

    /// Sends raw bytes (a malformed PDU, say).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next PDU, waiting at most `timeout`. None: the target closed the connection.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Option<Pdu>> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.framer.next_pdu() {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(ErrorKind::InvalidData, e.to_string())),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ErrorKind::TimedOut.into());
            }
            self.stream.read_timeout = Some(deadline - now);
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.framer.feed(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::TimedOut => return Err(e),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the target has closed the connection and everything it sent was read.
    pub fn closed(&self) -> bool {
        let h = self.stream.rx.lock();
        h.closed && h.bytes.is_empty()
    }

    /// Closes the connection (the initiator disconnects).
    pub fn close(mut self) {
        self.stream.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::TcpDatamover;
    use riser_bdev::IoBuf;
    use riser_iscsi::ffp::{Datamover, DatamoverParams, DmEvent, GetData, PutData, SnState};
    use riser_iscsi::pdu::{Lun, Op};
    use riser_iscsi::serial::{Itt, Sn};
    use riser_iscsi::testing::{data_out, scsi_response};

    /// The datamover of a connection over an in-memory pipe, and the initiator's end.
    fn connected() -> (TcpDatamover<MemStream>, MemClient) {
        let (server, client) = stream_pair(([10, 0, 0, 1], 3260).into(), ([10, 0, 0, 2], 40000).into());
        let mut dm = TcpDatamover::new(server, &[]).unwrap();
        dm.notice_key_values(DatamoverParams {
            initiator_max_recv_data_segment_length: 4096,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 8192,
            max_outstanding_r2t: 1,
            ..Default::default()
        });
        (dm, MemClient { stream: client, framer: Framer::new(), digests: Digests::default() })
    }

    /// A WRITE of 20000 bytes fetched in two pieces (12000 bytes with more to follow, then
    /// 8000), each into its own buffer, kept on a "disk"; then read back in three pieces
    /// (8192, 8192, 3616 bytes, the last with the response). The initiator answers every R2T
    /// with Data-Out of at most 4096 bytes and reassembles the Data-In by BufferOffset.
    #[test]
    fn a_write_and_a_read_in_pieces_round_trip() {
        let (mut dm, mut c) = connected();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 13 % 256) as u8).collect();
        let mut disk = vec![0u8; data.len()];
        let mut ev = Vec::new();
        let mut r2t_sns = Vec::new();
        for (offset, len, more) in [(0u32, 12_000u32, true), (12_000, 8_000, false)] {
            let buf = IoBuf::from(vec![0u8; len as usize]);
            dm.get_data(GetData { itt: Itt(3), lun: Lun(0), buf, offset, len, base: offset, more, sn: SnState::default() });
            let deadline = Instant::now() + Duration::from_secs(5);
            let buf = loop {
                assert!(Instant::now() < deadline, "Get_Data [{offset}, +{len}) never completed");
                dm.poll(&mut ev);
                if let Some(i) = ev.iter().position(|e| matches!(e, DmEvent::DataReady { .. } | DmEvent::DataFailed { .. })) {
                    match ev.remove(i) {
                        DmEvent::DataReady { itt: Itt(3), buf } => break buf,
                        DmEvent::DataFailed { reason, .. } => panic!("Get_Data failed: {reason}"),
                        _ => panic!("DataReady of another task"),
                    }
                }
                let r = match c.recv(Duration::from_millis(100)) {
                    Ok(Some(p)) => match p.bhs.op {
                        Op::R2t(r) => r,
                        op => panic!("expected R2T, got {op:?}"),
                    },
                    Err(e) if e.kind() == ErrorKind::TimedOut => continue,
                    other => panic!("{other:?}"),
                };
                r2t_sns.push(r.r2t_sn.get());
                let (start, end) = (r.buffer_offset, r.buffer_offset + r.desired_data_transfer_length);
                for (sn, at) in (start..end).step_by(4096).enumerate() {
                    let n = (end - at).min(4096);
                    let d = riser_iscsi::pdu::DataOut { final_bit: at + n == end, ..data_out(Itt(3), r.ttt, Sn(sn as u32), at) };
                    c.send(&Pdu::with_data(Op::DataOut(d), data[at as usize..(at + n) as usize].to_vec())).unwrap();
                }
            };
            disk[offset as usize..(offset + len) as usize].copy_from_slice(buf.as_slice());
        }
        // R2Ts of 8192, 3808 | 8000 bytes: numbered across both Get_Data.
        assert_eq!(r2t_sns, vec![0, 1, 2]);
        assert!(disk == data, "the write landed whole");

        let sn = SnState { stat_sn: Sn(4), exp_cmd_sn: Sn(2), max_cmd_sn: Sn(9) };
        let pieces = [(0usize, 8192usize), (8192, 16_384), (16_384, 20_000)];
        for (k, (from, to)) in pieces.into_iter().enumerate() {
            let response = (k == 2).then(|| Pdu::new(Op::ScsiResponse(scsi_response(Itt(4), 0, sn))));
            let buf = IoBuf::from(disk[from..to].to_vec());
            dm.put_data(PutData { itt: Itt(4), lun: Lun(0), buf, len: (to - from) as u32, offset: from as u32, response, sn });
        }
        while !dm.idle() {
            dm.poll(&mut ev);
        }
        let mut back = vec![0u8; data.len()];
        let mut data_sns = Vec::new();
        loop {
            let p = c.recv(Duration::from_secs(1)).unwrap().expect("a Data-In");
            let Op::DataIn(d) = &p.bhs.op else { panic!("expected Data-In, got {:?}", p.opcode()) };
            data_sns.push(d.data_sn.get());
            back[d.buffer_offset as usize..d.buffer_offset as usize + p.data.len()].copy_from_slice(&p.data);
            if d.status_present {
                assert!(d.final_bit && d.status == 0 && d.stat_sn == Sn(4));
                break;
            }
        }
        assert_eq!(data_sns, (0..data_sns.len() as u32).collect::<Vec<_>>(), "DataSN 0, 1, ... across the pieces");
        assert_eq!(data_sns.len(), 5, "Data-In of 4096 bytes: 2 + 2, and the last piece's 3616 bytes in one");
        assert!(back == data, "the read returns what was written");
    }
}
