//! The SCSI side of the initiator, common to its transports: status codes and sense data,
//! the error of a failed I/O, READ/WRITE CDBs, and the setup commands (TEST UNIT READY
//! until ready, READ CAPACITY) run through any session that can execute one command at a
//! time ([`ScsiExec`]).

use std::time::Duration;

/// SCSI status codes (SAM-5).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// Sense key, additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Sense {
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const NOT_READY: u8 = 0x2;

    /// From the data segment of a SCSI Response: 2-byte SenseLength, then the sense data
    /// (fixed format 0x70/0x71 or descriptor format 0x72/0x73).
    pub fn parse(segment: &[u8]) -> Option<Sense> {
        let len = u16::from_be_bytes([*segment.first()?, *segment.get(1)?]) as usize;
        let s = segment.get(2..2 + len)?;
        match s.first()? & 0x7f {
            0x70 | 0x71 => Some(Sense {
                key: s.get(2)? & 0x0f,
                asc: *s.get(12).unwrap_or(&0),
                ascq: *s.get(13).unwrap_or(&0),
            }),
            0x72 | 0x73 => Some(Sense {
                key: s.get(1)? & 0x0f,
                asc: *s.get(2).unwrap_or(&0),
                ascq: *s.get(3).unwrap_or(&0),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const KEYS: [&str; 16] = [
            "NO SENSE",
            "RECOVERED ERROR",
            "NOT READY",
            "MEDIUM ERROR",
            "HARDWARE ERROR",
            "ILLEGAL REQUEST",
            "UNIT ATTENTION",
            "DATA PROTECT",
            "BLANK CHECK",
            "VENDOR SPECIFIC",
            "COPY ABORTED",
            "ABORTED COMMAND",
            "RESERVED",
            "VOLUME OVERFLOW",
            "MISCOMPARE",
            "COMPLETED",
        ];
        let what = match (self.asc, self.ascq) {
            (0x04, _) => ": logical unit not ready",
            (0x20, 0x00) => ": invalid command operation code",
            (0x21, 0x00) => ": LBA out of range",
            (0x24, 0x00) => ": invalid field in CDB",
            (0x25, 0x00) => ": logical unit not supported (no such LUN)",
            (0x27, _) => ": write protected",
            (0x29, _) => ": power on, reset or bus device reset occurred",
            (0x2a, _) => ": parameters changed",
            (0x3a, _) => ": medium not present",
            _ => "",
        };
        write!(
            f,
            "{} (ASC/ASCQ {:#04x}/{:#04x}{what})",
            KEYS[(self.key & 0xf) as usize],
            self.asc,
            self.ascq
        )
    }
}

/// What came back for a command that did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoError {
    pub status: u8,
    pub sense: Option<Sense>,
    pub what: String,
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)?;
        if let Some(s) = self.sense {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

/// The name of a SCSI status, for messages.
pub fn status_name(s: u8) -> String {
    match s {
        0x00 => "GOOD".into(),
        0x02 => "CHECK CONDITION".into(),
        0x04 => "CONDITION MET".into(),
        0x08 => "BUSY".into(),
        0x18 => "RESERVATION CONFLICT".into(),
        0x28 => "TASK SET FULL".into(),
        0x30 => "ACA ACTIVE".into(),
        0x40 => "TASK ABORTED".into(),
        s => format!("status {s:#04x}"),
    }
}

/// The direction of an I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Read,
    Write,
}

/// One finished I/O.
#[derive(Debug)]
pub struct Completion {
    pub slot: usize,
    pub result: Result<(), IoError>,
    /// `--abort-every`: the slot's task was aborted (no status); the slot is free again.
    pub aborted: bool,
}

/// Result of a management SCSI command.
pub struct CmdResult {
    pub status: u8,
    pub sense: Option<Sense>,
    pub data: Vec<u8>,
}

/// READ/WRITE (10) when the LBA and length fit, (16) otherwise.
pub fn rw_cdb(dir: Dir, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    if lba + blocks as u64 <= u32::MAX as u64 + 1 && blocks <= 0xffff {
        c[0] = if dir == Dir::Read { 0x28 } else { 0x2a };
        c[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        c[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
    } else {
        c[0] = if dir == Dir::Read { 0x88 } else { 0x8a };
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
    }
    c
}

/// A session that can run one management SCSI command at a time (setup and teardown).
pub trait ScsiExec {
    /// Runs one SCSI command (no data out) and waits for its status.
    fn exec(&mut self, cdb: &[u8], read_len: u32) -> Result<CmdResult, String>;
    fn label(&self) -> &str;
}

/// TEST UNIT READY until GOOD: a new I_T nexus first gets a POWER ON / RESET unit
/// attention, and a target may report NOT READY (becoming ready) or BUSY for a while.
pub fn wait_ready<E: ScsiExec>(c: &mut E) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..30 {
        let r = c.exec(&[0u8; 6], 0)?;
        match (r.status, r.sense) {
            (status::GOOD, _) => return Ok(()),
            (status::CHECK_CONDITION, Some(s)) if s.key == Sense::UNIT_ATTENTION => {
                last = format!("CHECK CONDITION, {s}");
            }
            (status::CHECK_CONDITION, Some(s)) if s.key == Sense::NOT_READY => {
                last = format!("CHECK CONDITION, {s}");
                std::thread::sleep(Duration::from_millis(100));
            }
            (status::BUSY | status::TASK_SET_FULL, _) => {
                last = status_name(r.status);
                std::thread::sleep(Duration::from_millis(100));
            }
            (s, sense) => {
                return Err(format!(
                    "{}: TEST UNIT READY failed: {}{}",
                    c.label(),
                    status_name(s),
                    sense.map(|x| format!(", {x}")).unwrap_or_default()
                ))
            }
        }
    }
    Err(format!(
        "{}: the LUN did not become ready (last: {last})",
        c.label()
    ))
}

/// READ CAPACITY (16), or (10) if the target does not know (16): (block size, blocks).
pub fn read_capacity<E: ScsiExec>(c: &mut E) -> Result<(u32, u64), String> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = c.exec(&cdb, 32)?;
    let (last_lba, block_size) = if r.status == status::GOOD && r.data.len() >= 12 {
        (
            u64::from_be_bytes(r.data[0..8].try_into().unwrap_or_default()),
            u32::from_be_bytes(r.data[8..12].try_into().unwrap_or_default()),
        )
    } else {
        let r10 = c.exec(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8)?;
        if r10.status != status::GOOD || r10.data.len() < 8 {
            return Err(format!(
                "{}: READ CAPACITY failed: (16) {}{}, (10) {}{}",
                c.label(),
                status_name(r.status),
                r.sense.map(|x| format!(", {x}")).unwrap_or_default(),
                status_name(r10.status),
                r10.sense.map(|x| format!(", {x}")).unwrap_or_default()
            ));
        }
        (
            u32::from_be_bytes(r10.data[0..4].try_into().unwrap_or_default()) as u64,
            u32::from_be_bytes(r10.data[4..8].try_into().unwrap_or_default()),
        )
    };
    if !(512..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(format!(
            "{}: the LUN reports a block size of {block_size} bytes",
            c.label()
        ));
    }
    Ok((block_size, last_lba.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs() {
        let c = rw_cdb(Dir::Read, 0x1234, 8);
        assert_eq!(&c[..10], &[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 8, 0]);
        let c = rw_cdb(Dir::Write, u32::MAX as u64 - 7, 8);
        assert_eq!(c[0], 0x2a);
        let c = rw_cdb(Dir::Write, u32::MAX as u64, 8);
        assert_eq!(c[0], 0x8a);
        assert_eq!(&c[2..14], &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 8]);
        assert_eq!(rw_cdb(Dir::Read, 0, 0x10000)[0], 0x88);
    }

    #[test]
    fn sense_formats() {
        let mut fixed = vec![0, 18, 0x70, 0, 0x06, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0x00];
        fixed.resize(20, 0);
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (6, 0x29, 0));
        assert!(s.to_string().starts_with("UNIT ATTENTION"));
        let desc = [0, 8, 0x72, 0x05, 0x24, 0x00, 0, 0, 0, 0];
        let s = Sense::parse(&desc).unwrap();
        assert_eq!((s.key, s.asc), (5, 0x24));
        assert_eq!(Sense::parse(&[0, 40, 0x70]), None);
        assert_eq!(Sense::parse(&[]), None);
    }
}
