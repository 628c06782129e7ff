//! NVMe commands as the kernel's passthrough interfaces take them, and the Identify data
//! riser reads: pure data, no I/O (unit-tested on any host).
//!
//! `struct nvme_uring_cmd` (io_uring `IORING_OP_URING_CMD`, `NVME_URING_CMD_IO`) and
//! `struct nvme_passthru_cmd` (`NVME_IOCTL_ADMIN_CMD`) share one 72-byte layout
//! (include/uapi/linux/nvme_ioctl.h): opcode u8, flags u8, rsvd u16, nsid u32, cdw2 u32,
//! cdw3 u32, metadata u64, addr u64, metadata_len u32, data_len u32, cdw10..cdw15 u32,
//! timeout_ms u32, and a last u32 (reserved; the admin ioctl's `result`). Little-endian on
//! every machine this runs on (x86_64, aarch64).

/// `_IOWR('N', nr, 72 bytes)`.
const fn iowr_n(nr: u32) -> u32 {
    (3 << 30) | ((CMD_LEN as u32) << 16) | ((b'N' as u32) << 8) | nr
}

/// Size of the command structure.
pub const CMD_LEN: usize = 72;
/// `NVME_IOCTL_ADMIN_CMD`.
pub const NVME_IOCTL_ADMIN_CMD: u32 = iowr_n(0x41);
/// `NVME_URING_CMD_IO`: an I/O command through io_uring on /dev/ngXnY.
pub const NVME_URING_CMD_IO: u32 = iowr_n(0x80);

/// NVM command set opcodes (NVMe 1.4 / NVM Command Set 1.0).
pub mod opc {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
    /// Admin: Identify.
    pub const IDENTIFY: u8 = 0x06;
}

/// Force Unit Access (Read/Write/Write Zeroes CDW12 bit 30).
pub const CDW12_FUA: u32 = 1 << 30;
/// Deallocate (Write Zeroes CDW12 bit 25).
pub const CDW12_DEAC: u32 = 1 << 25;
/// Attribute Deallocate (Dataset Management CDW11 bit 2).
pub const DSM_AD: u32 = 1 << 2;
/// Dataset Management: at most 256 ranges per command, 16 bytes each.
pub const DSM_MAX_RANGES: usize = 256;
/// Read/Write/Write Zeroes: NLB is a 0's based 16-bit field.
pub const MAX_NLB: u64 = 1 << 16;

/// One NVMe command in the passthrough layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeCmd {
    pub opcode: u8,
    pub nsid: u32,
    pub addr: u64,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub timeout_ms: u32,
}

impl NvmeCmd {
    /// The 72 bytes the kernel reads, in the first 72 of the 80 an SQE128 carries.
    pub fn to_bytes(&self) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0] = self.opcode;
        b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[36..40].copy_from_slice(&self.data_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.cdw10.to_le_bytes());
        b[44..48].copy_from_slice(&self.cdw11.to_le_bytes());
        b[48..52].copy_from_slice(&self.cdw12.to_le_bytes());
        b[52..56].copy_from_slice(&self.cdw13.to_le_bytes());
        b[64..68].copy_from_slice(&self.timeout_ms.to_le_bytes());
        b
    }

    /// Read or Write of `blocks` (1..=65536) blocks at `slba` into/from `len` bytes at `addr`.
    pub fn rw(write: bool, nsid: u32, slba: u64, blocks: u64, addr: u64, len: u32, fua: bool) -> NvmeCmd {
        debug_assert!((1..=MAX_NLB).contains(&blocks));
        NvmeCmd {
            opcode: if write { opc::WRITE } else { opc::READ },
            nsid,
            addr,
            data_len: len,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: ((blocks - 1) as u32 & 0xFFFF) | if fua { CDW12_FUA } else { 0 },
            ..NvmeCmd::default()
        }
    }

    pub fn flush(nsid: u32) -> NvmeCmd {
        NvmeCmd { opcode: opc::FLUSH, nsid, ..NvmeCmd::default() }
    }

    /// Write Zeroes of `blocks` (1..=65536) blocks; `deallocate` lets the device unmap them.
    pub fn write_zeroes(nsid: u32, slba: u64, blocks: u64, deallocate: bool, fua: bool) -> NvmeCmd {
        debug_assert!((1..=MAX_NLB).contains(&blocks));
        NvmeCmd {
            opcode: opc::WRITE_ZEROES,
            nsid,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: ((blocks - 1) as u32 & 0xFFFF)
                | if deallocate { CDW12_DEAC } else { 0 }
                | if fua { CDW12_FUA } else { 0 },
            ..NvmeCmd::default()
        }
    }

    /// Dataset Management, deallocate, over `ranges` (1..=256) range descriptors of 16 bytes
    /// each at `addr` (see [`dsm_range`]).
    pub fn dsm_deallocate(nsid: u32, addr: u64, ranges: usize) -> NvmeCmd {
        debug_assert!((1..=DSM_MAX_RANGES).contains(&ranges));
        NvmeCmd {
            opcode: opc::DSM,
            nsid,
            addr,
            data_len: (ranges * 16) as u32,
            cdw10: (ranges - 1) as u32,
            cdw11: DSM_AD,
            ..NvmeCmd::default()
        }
    }

    /// Identify: CNS 0x00 (namespace `nsid`) or 0x01 (controller), 4096 bytes at `addr`.
    pub fn identify(cns: u8, nsid: u32, addr: u64) -> NvmeCmd {
        NvmeCmd { opcode: opc::IDENTIFY, nsid, addr, data_len: 4096, cdw10: cns as u32, timeout_ms: 10_000, ..NvmeCmd::default() }
    }
}

/// One Dataset Management range: context attributes 0, `blocks` (1..=u32::MAX), `slba`.
pub fn dsm_range(slba: u64, blocks: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[4..8].copy_from_slice(&blocks.to_le_bytes());
    r[8..16].copy_from_slice(&slba.to_le_bytes());
    r
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).trim().to_string()
}

/// What riser uses of Identify Controller (CNS 01h).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdCtrl {
    pub vid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Maximum Data Transfer Size: 2^mdts minimum pages; 0 = no limit.
    pub mdts: u8,
    pub cntlid: u16,
    /// Optional NVM Command Support (ONCS).
    pub oncs: u16,
    /// A volatile write cache is present (VWC bit 0).
    pub vwc: bool,
    /// Number of namespaces (NN).
    pub nn: u32,
}

impl IdCtrl {
    pub fn parse(b: &[u8]) -> Option<IdCtrl> {
        if b.len() < 4096 {
            return None;
        }
        Some(IdCtrl {
            vid: le16(b, 0),
            serial: text(&b[4..24]),
            model: text(&b[24..64]),
            firmware: text(&b[64..72]),
            mdts: b[77],
            cntlid: le16(b, 78),
            oncs: le16(b, 520),
            vwc: b[525] & 1 != 0,
            nn: le32(b, 516),
        })
    }

    /// Dataset Management supported (ONCS bit 2).
    pub fn dsm(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }

    /// Write Zeroes supported (ONCS bit 3).
    pub fn write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }
}

/// What riser uses of Identify Namespace (CNS 00h).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdNs {
    /// Namespace size in logical blocks (NSZE).
    pub nsze: u64,
    /// Thin provisioning (NSFEAT bit 0).
    pub thin: bool,
    /// Deallocated blocks read as zeros (DLFEAT bits 2:0 = 001b).
    pub dealloc_reads_zeroes: bool,
    /// Write Zeroes with DEAC deallocates (DLFEAT bit 3).
    pub write_zeroes_deallocates: bool,
    /// The formatted LBA size in bytes (2^LBADS of the current LBA format).
    pub block_size: u32,
    /// Metadata bytes per block of the current format (riser serves only 0).
    pub metadata_size: u16,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

impl IdNs {
    pub fn parse(b: &[u8]) -> Option<IdNs> {
        if b.len() < 4096 {
            return None;
        }
        let flbas = b[26];
        let nlbaf = b[25] as usize; // 0's based
        // FLBAS bits 3:0, and 6:5 as the upper bits when more than 16 formats exist.
        let idx = (flbas & 0x0F) as usize | (((flbas >> 5) & 0x3) as usize) << 4;
        if idx > nlbaf || idx > 63 {
            return None;
        }
        let lbaf = le32(b, 128 + 4 * idx);
        let lbads = (lbaf >> 16) & 0xFF;
        if !(9..=16).contains(&lbads) {
            return None; // unformatted, or a size no one uses
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(IdNs {
            nsze: le64(b, 0),
            thin: b[24] & 1 != 0,
            dealloc_reads_zeroes: b[33] & 0x7 == 1,
            write_zeroes_deallocates: b[33] & 0x8 != 0,
            block_size: 1 << lbads,
            metadata_size: (lbaf & 0xFFFF) as u16,
            nguid,
            eui64,
        })
    }
}

/// NVMe status (the CQE's status field without the phase bit, as the kernel returns it in
/// a passthrough command's positive result) in words.
pub fn status_text(status: i32) -> String {
    let sct = (status >> 8) & 0x7;
    let sc = status & 0xFF;
    let what = match (sct, sc) {
        (0, 0x01) => "invalid command opcode",
        (0, 0x02) => "invalid field in command",
        (0, 0x04) => "data transfer error",
        (0, 0x06) => "internal error",
        (0, 0x0B) => "invalid namespace or format",
        (0, 0x80) => "LBA out of range",
        (0, 0x81) => "capacity exceeded",
        (0, 0x82) => "namespace not ready",
        (2, 0x80) => "write fault",
        (2, 0x81) => "unrecovered read error",
        (2, 0x86) => "access denied",
        (2, 0x87) => "deallocated or unwritten logical block",
        _ => "error",
    };
    format!("NVMe status {status:#x} (type {sct}, code {sc:#04x}: {what})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // linux/nvme_ioctl.h: _IOWR('N', 0x41, struct nvme_admin_cmd) and
        // _IOWR('N', 0x80, struct nvme_uring_cmd), both 72 bytes.
        assert_eq!(NVME_IOCTL_ADMIN_CMD, 0xC048_4E41);
        assert_eq!(NVME_URING_CMD_IO, 0xC048_4E80);
    }

    #[test]
    fn read_write_fields() {
        let c = NvmeCmd::rw(true, 1, 0x1_2345_6789, 8, 0xdead_b000, 4096, true);
        let b = c.to_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(le32(&b, 4), 1, "nsid");
        assert_eq!(le64(&b, 24), 0xdead_b000, "addr");
        assert_eq!(le32(&b, 36), 4096, "data_len");
        assert_eq!(le32(&b, 40), 0x2345_6789, "cdw10: SLBA low");
        assert_eq!(le32(&b, 44), 0x1, "cdw11: SLBA high");
        assert_eq!(le32(&b, 48), 7 | (1 << 30), "cdw12: NLB 0's based, FUA");
        assert!(b[72..].iter().all(|&x| x == 0));
        let r = NvmeCmd::rw(false, 2, 0, 65536, 0x1000, 1 << 25, false).to_bytes();
        assert_eq!(r[0], 0x02);
        assert_eq!(le32(&r, 48), 0xFFFF, "65536 blocks, no FUA");
    }

    #[test]
    fn flush_zeroes_and_deallocate() {
        let f = NvmeCmd::flush(3).to_bytes();
        assert_eq!((f[0], le32(&f, 4), le64(&f, 24), le32(&f, 36)), (0, 3, 0, 0));
        let z = NvmeCmd::write_zeroes(1, 100, 16, true, false).to_bytes();
        assert_eq!(z[0], 0x08);
        assert_eq!(le32(&z, 40), 100);
        assert_eq!(le32(&z, 48), 15 | (1 << 25));
        let d = NvmeCmd::dsm_deallocate(1, 0x4000, 3).to_bytes();
        assert_eq!(d[0], 0x09);
        assert_eq!(le32(&d, 36), 48, "three 16-byte ranges");
        assert_eq!(le32(&d, 40), 2, "NR is 0's based");
        assert_eq!(le32(&d, 44), 4, "AD");
        let r = dsm_range(0x10_0000_0001, 77);
        assert_eq!(le32(&r, 0), 0);
        assert_eq!(le32(&r, 4), 77);
        assert_eq!(le64(&r, 8), 0x10_0000_0001);
        let i = NvmeCmd::identify(1, 0, 0x8000).to_bytes();
        assert_eq!((i[0], le32(&i, 36), le32(&i, 40)), (0x06, 4096, 1));
    }

    #[test]
    fn identify_controller() {
        let mut b = vec![0u8; 4096];
        b[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        b[4..24].copy_from_slice(b"riser-serial        ");
        b[24..64].copy_from_slice(format!("{:<40}", "QEMU NVMe Ctrl").as_bytes());
        b[64..72].copy_from_slice(b"8.0.0   ");
        b[77] = 7;
        b[78..80].copy_from_slice(&5u16.to_le_bytes());
        b[516..520].copy_from_slice(&256u32.to_le_bytes());
        b[520..522].copy_from_slice(&0x015Du16.to_le_bytes());
        b[525] = 0x07;
        let c = IdCtrl::parse(&b).unwrap();
        assert_eq!(c.vid, 0x1b36);
        assert_eq!(c.serial, "riser-serial");
        assert_eq!(c.model, "QEMU NVMe Ctrl");
        assert_eq!(c.firmware, "8.0.0");
        assert_eq!((c.mdts, c.cntlid, c.nn), (7, 5, 256));
        assert!(c.vwc && c.dsm() && c.write_zeroes());
        b[520..522].copy_from_slice(&0x0001u16.to_le_bytes());
        b[525] = 0x06; // flush-broadcast bits only: no cache
        let c = IdCtrl::parse(&b).unwrap();
        assert!(!c.vwc && !c.dsm() && !c.write_zeroes());
        assert_eq!(IdCtrl::parse(&b[..100]), None);
    }

    #[test]
    fn identify_namespace() {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(&(1u64 << 21).to_le_bytes());
        b[24] = 1; // thin
        b[25] = 1; // two formats
        b[26] = 1; // current: format 1
        b[33] = 0x09; // reads zeros, write zeroes deallocates
        b[104..120].copy_from_slice(&[0xAB; 16]);
        b[128..132].copy_from_slice(&(9u32 << 16).to_le_bytes());
        b[132..136].copy_from_slice(&(12u32 << 16).to_le_bytes());
        let n = IdNs::parse(&b).unwrap();
        assert_eq!(n.nsze, 1 << 21);
        assert_eq!(n.block_size, 4096);
        assert_eq!(n.metadata_size, 0);
        assert!(n.thin && n.dealloc_reads_zeroes && n.write_zeroes_deallocates);
        assert_eq!(n.nguid, [0xAB; 16]);
        b[26] = 0;
        b[33] = 0x02; // deallocated blocks read as all ones
        b[128..132].copy_from_slice(&(9u32 << 16 | 8).to_le_bytes());
        let n = IdNs::parse(&b).unwrap();
        assert_eq!((n.block_size, n.metadata_size), (512, 8));
        assert!(!n.dealloc_reads_zeroes && !n.write_zeroes_deallocates);
        b[128..132].copy_from_slice(&0u32.to_le_bytes()); // LBADS 0: not formatted
        assert_eq!(IdNs::parse(&b), None);
    }

    #[test]
    fn status_words() {
        assert!(status_text(0x281).contains("unrecovered read error"));
        assert!(status_text(0x80).contains("LBA out of range"));
    }
}
