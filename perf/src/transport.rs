//! One initiator session over either transport, TCP ([`Conn`]) or iSER ([`IserConn`]), as
//! the URL says: what the client threads of the initiator mode drive.

use crate::conn::Conn;
use crate::iser::IserConn;
use riser_initiator::scsi::{Completion, Dir};
use riser_initiator::session::{AbortStats, IserKeys, LoginOptions, Negotiated};
use riser_initiator::url::{self, TargetUrl};

/// One session over either transport: what the client threads drive.
#[allow(clippy::large_enum_variant)] // one per session, never moved on the data path
pub enum Session {
    Tcp(Conn),
    Iser(Box<IserConn>),
}

/// Calls the same method on either transport.
macro_rules! both {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            Session::Tcp($c) => $e,
            Session::Iser($c) => $e,
        }
    };
}

impl Session {
    /// Connects and logs in over the URL's transport; `qd`: the I/Os it will carry at once.
    pub fn login(url: &TargetUrl, opts: &LoginOptions, qd: usize) -> Result<Session, String> {
        match url.transport {
            url::Transport::Tcp => Conn::login(url, opts).map(Session::Tcp),
            url::Transport::Iser => {
                IserConn::login(url, opts, qd).map(|c| Session::Iser(Box::new(c)))
            }
        }
    }

    pub fn label(&self) -> &str {
        both!(self, c => &c.label)
    }

    pub fn is_iser(&self) -> bool {
        matches!(self, Session::Iser(_))
    }

    pub fn neg(&self) -> Negotiated {
        both!(self, c => c.neg)
    }

    /// The iSER keys (None on TCP).
    pub fn iser_keys(&self) -> Option<IserKeys> {
        match self {
            Session::Tcp(_) => None,
            Session::Iser(c) => Some(c.iser),
        }
    }

    pub fn block_size(&self) -> u32 {
        both!(self, c => c.block_size)
    }

    pub fn num_blocks(&self) -> u64 {
        both!(self, c => c.num_blocks)
    }

    pub fn wait_ready(&mut self) -> Result<(), String> {
        both!(self, c => c.wait_ready())
    }

    pub fn read_capacity(&mut self) -> Result<(), String> {
        both!(self, c => c.read_capacity())
    }

    pub fn logout(&mut self) -> Result<(), String> {
        both!(self, c => c.logout())
    }

    /// `copy_reads`: whether read data must be readable through [`Self::buf`] (verify);
    /// TCP always has it.
    pub fn start_io(&mut self, qd: usize, bs: usize, copy_reads: bool) -> Result<(), String> {
        match self {
            Session::Tcp(c) => {
                c.start_io(qd, bs);
                Ok(())
            }
            Session::Iser(c) => c.start_io(qd, bs, copy_reads),
        }
    }

    #[inline]
    pub fn submit(&mut self, slot: usize, dir: Dir, lba: u64, blocks: u32) {
        both!(self, c => c.submit(slot, dir, lba, blocks))
    }

    #[inline]
    pub fn flush(&mut self) -> Result<bool, String> {
        both!(self, c => c.flush())
    }

    #[inline]
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<bool, String> {
        both!(self, c => c.poll(out))
    }

    /// Runs one SCSI command without data out (none of the session's I/O in flight) and
    /// waits for its status.
    pub fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<riser_initiator::scsi::CmdResult, String> {
        both!(self, c => c.exec(cdb, read_len))
    }

    pub fn inflight(&self) -> usize {
        both!(self, c => c.inflight())
    }

    /// `--abort-every N` (after [`Self::start_io`]; see [`riser_initiator::session::Aborter`]).
    pub fn abort_every(&mut self, n: u32) {
        both!(self, c => c.abort_every(n))
    }

    /// `--abort-every`: what the target answered, and the first violation.
    pub fn abort_stats(&self) -> Option<(AbortStats, Result<(), String>)> {
        both!(self, c => c.abort_stats())
    }

    pub fn lba(&self, slot: usize) -> u64 {
        both!(self, c => c.lba(slot))
    }

    pub fn buf(&self, slot: usize) -> &[u8] {
        both!(self, c => c.buf(slot))
    }

    pub fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
        both!(self, c => c.buf_mut(slot))
    }

    /// Before sleeping in poll(2) when idle: the fd and events to wait for (the socket; for
    /// iSER the armed CQ's completion channel), or None when there is work already (no sleep).
    pub fn sleep_fd(&mut self) -> Option<(i32, i16)> {
        match self {
            Session::Tcp(c) => {
                let mut events = libc::POLLIN;
                if c.wants_write() {
                    events |= libc::POLLOUT;
                }
                Some((c.fd(), events))
            }
            Session::Iser(c) => c.arm().map(|fd| (fd, libc::POLLIN)),
        }
    }

    /// After the sleep.
    pub fn woke(&mut self) {
        if let Session::Iser(c) = self {
            c.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Without an RDMA device (the build machine) an iser:// login fails with a message, no
    /// panic.
    #[test]
    fn login_without_rdma_is_a_clear_error() {
        let url = riser_initiator::url::parse("iser://127.0.0.1:3260/iqn.2024-01.test:x/0").unwrap();
        let opts = LoginOptions {
            initiator_name: riser_initiator::session::INITIATOR_NAME.into(),
            header_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(2),
            isid: [0x80, 0, 0, 0, 0, 1],
            chap: None,
        };
        match Session::login(&url, &opts, 4) {
            Ok(_) => panic!("an iSER login to 127.0.0.1 cannot succeed"),
            Err(e) => {
                eprintln!("{e}");
                assert!(
                    e.starts_with("iser://127.0.0.1:3260/iqn.2024-01.test:x/0: "),
                    "{e}"
                );
            }
        }
    }
}
