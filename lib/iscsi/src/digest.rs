//! CRC32C header and data digests (RFC 7143 §13.1, polynomial 0x1EDC6F41, Castagnoli).
//!
//! The `crc32c` crate uses SSE4.2 / ARMv8 CRC instructions when present. The digest goes
//! on the wire least significant byte first: RFC 3720 Appendix B.4 lists 32 zero bytes as
//! digest bytes `aa 36 91 8a`, i.e. the value 0x8A9136AA in little-endian order.
//! On iSER there are no digests (RFC 7145 §7.1); this module is for TCP only.

/// CRC32C of `data` (initial value and final XOR per RFC 3385 / RFC 7143 §13.1).
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continue a CRC32C over more bytes, for data that arrives in pieces.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// HeaderDigest: over the BHS and any AHS (RFC 7143 §11.1).
pub fn header_digest(bhs: &[u8], ahs: &[u8]) -> u32 {
    crc32c_append(crc32c(bhs), ahs)
}

/// DataDigest: over the data segment and its padding (RFC 7143 §11.1).
pub fn data_digest(data: &[u8]) -> u32 {
    let pad = (4 - data.len() % 4) % 4;
    crc32c_append(crc32c(data), &[0u8; 3][..pad])
}

/// Digest bytes as sent on the wire.
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Digest value from its wire bytes.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 3720 Appendix B.4 (the CRC examples, unchanged by RFC 7143).
    #[test]
    fn rfc_test_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
    }

    #[test]
    fn rfc_read10_pdu_vector() {
        // The iSCSI SCSI Read (10) Command PDU of RFC 3720 B.4.
        let pdu: [u8; 48] = [
            0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14,
            0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(to_wire(header_digest(&pdu, &[])), [0x56, 0x3a, 0x96, 0xd9]);
    }

    #[test]
    fn pieces_equal_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let (a, b) = data.split_at(333);
        assert_eq!(crc32c_append(crc32c(a), b), crc32c(&data));
        assert_eq!(header_digest(a, b), crc32c(&data));
    }

    #[test]
    fn data_digest_includes_padding() {
        let d = [1u8, 2, 3, 4, 5];
        assert_eq!(data_digest(&d), crc32c(&[1, 2, 3, 4, 5, 0, 0, 0]));
        assert_eq!(data_digest(&d[..4]), crc32c(&d[..4]));
    }
}
