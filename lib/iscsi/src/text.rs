//! Text key=value data segments (RFC 7143 §6.1) for Login and Text PDUs.
//!
//! A data segment is a list of `key=value` pairs, each followed by one NUL. A pair may span
//! PDUs: with the C (continue) bit set, the text goes on in the next PDU
//! (RFC 7143 §11.10.2, §11.12.2), so [`TextAssembler`] collects raw bytes and splits them
//! into pairs only when C=0 arrives, capping what a peer can make it hold. [`TextOutbox`]
//! is the other direction: a response longer than one PDU goes out in pieces with C=1.
//!
//! The value helpers cover the value types of RFC 7143 §6.1 and §13: numbers (decimal,
//! `0x` hex, `0b` base64), binary (hex or base64), `Yes`/`No`, comma lists, `a~b` ranges
//! and the constants `Reject`, `Irrelevant` and `NotUnderstood`.

use thiserror::Error;

/// Longest key name (RFC 7143 §6.1).
pub const MAX_KEY_NAME_LEN: usize = 63;
/// Longest value unless a key says otherwise (RFC 7143 §6.1).
pub const MAX_VALUE_LEN: usize = 255;
/// Longest value for keys carrying large binary values: CHAP challenge and response
/// (RFC 7143 §6.1 large-binary-value, §12.1.3).
pub const MAX_LARGE_VALUE_LEN: usize = 8192;
/// Default cap on the text of one negotiation step, summed over its C=1 PDUs.
pub const DEFAULT_MAX_TEXT_BYTES: usize = 64 * 1024;
/// Default cap on the PDUs of one C=1 sequence (an empty PDU with C=1 adds no bytes).
pub const DEFAULT_MAX_TEXT_PDUS: usize = 128;

/// A list of key=value pairs, in the order they appeared.
pub type Pairs = Vec<(String, String)>;

/// Malformed text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TextError {
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("\"{0}\" has no '='")]
    MissingEquals(String),
    #[error("empty key name")]
    EmptyKey,
    #[error("key name of {0} bytes is longer than 63")]
    KeyTooLong(usize),
    #[error("key name \"{0}\" has a character outside [A-Za-z0-9.-+@_]")]
    BadKeyName(String),
    #[error("value of {key} is {len} bytes, more than {max}")]
    ValueTooLong { key: String, len: usize, max: usize },
    #[error("text of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("more than {max} PDUs with the C bit")]
    TooManyPdus { max: usize },
}

/// Largest value accepted for `key`.
pub fn max_value_len(key: &str) -> usize {
    match key {
        "CHAP_C" | "CHAP_R" => MAX_LARGE_VALUE_LEN,
        _ => MAX_VALUE_LEN,
    }
}

fn valid_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '@' | '_')
}

/// Split a complete text (all PDUs of a C sequence, ending with C=0) into pairs.
///
/// Empty entries between NULs are skipped and a missing NUL after the last pair is
/// tolerated (RFC 7143 §6.1 asks for it; being lenient here costs nothing).
pub fn parse_pairs(text: &[u8]) -> Result<Pairs, TextError> {
    let mut out = Vec::new();
    for item in text.split(|b| *b == 0) {
        if item.is_empty() {
            continue;
        }
        let item = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| TextError::MissingEquals(truncate(item)))?;
        if key.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if key.len() > MAX_KEY_NAME_LEN {
            return Err(TextError::KeyTooLong(key.len()));
        }
        if !key.chars().all(valid_key_char) {
            return Err(TextError::BadKeyName(truncate(key)));
        }
        let max = max_value_len(key);
        if value.len() > max {
            return Err(TextError::ValueTooLong {
                key: key.to_string(),
                len: value.len(),
                max,
            });
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Encode pairs as `key=value\0...`.
pub fn encode_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (k, val) in pairs {
        v.extend_from_slice(k.as_ref().as_bytes());
        v.push(b'=');
        v.extend_from_slice(val.as_ref().as_bytes());
        v.push(0);
    }
    v
}

/// Collects the text of a C=1 PDU sequence (RFC 7143 §11.10.2 / §11.12.2).
#[derive(Debug, Clone)]
pub struct TextAssembler {
    buf: Vec<u8>,
    pdus: usize,
    max_bytes: usize,
    max_pdus: usize,
}

impl Default for TextAssembler {
    fn default() -> Self {
        TextAssembler::new(DEFAULT_MAX_TEXT_BYTES, DEFAULT_MAX_TEXT_PDUS)
    }
}

impl TextAssembler {
    pub fn new(max_bytes: usize, max_pdus: usize) -> Self {
        TextAssembler {
            buf: Vec::new(),
            pdus: 0,
            max_bytes,
            max_pdus,
        }
    }

    /// Add one PDU's data. Returns the pairs once a PDU with C=0 completes the text,
    /// `None` while more is expected (the peer then gets an empty response and sends the
    /// rest). An empty PDU with C=1 is legal and just counts against the PDU cap.
    /// After an error the assembler is empty again.
    pub fn push(&mut self, data: &[u8], continue_bit: bool) -> Result<Option<Pairs>, TextError> {
        self.pdus += 1;
        if self.pdus > self.max_pdus {
            self.reset();
            return Err(TextError::TooManyPdus { max: self.max_pdus });
        }
        let len = self.buf.len() + data.len();
        if len > self.max_bytes {
            self.reset();
            return Err(TextError::TooLarge {
                len,
                max: self.max_bytes,
            });
        }
        self.buf.extend_from_slice(data);
        if continue_bit {
            return Ok(None);
        }
        let text = std::mem::take(&mut self.buf);
        self.reset();
        parse_pairs(&text).map(Some)
    }

    /// True between a C=1 PDU and the C=0 PDU that ends the sequence.
    pub fn is_partial(&self) -> bool {
        self.pdus > 0
    }

    pub fn reset(&mut self) {
        self.buf = Vec::new();
        self.pdus = 0;
    }
}

/// Response text waiting to be sent, one data segment at a time: every piece but the last
/// goes with C=1 and the peer asks for the next with an empty request.
#[derive(Debug, Clone, Default)]
pub struct TextOutbox {
    text: Vec<u8>,
    sent: usize,
}

impl TextOutbox {
    pub fn new(text: Vec<u8>) -> Self {
        TextOutbox { text, sent: 0 }
    }

    /// The next piece of at most `max` bytes (at least 1) and whether more remains (C bit).
    pub fn next_segment(&mut self, max: usize) -> (Vec<u8>, bool) {
        let rest = self.text.get(self.sent..).unwrap_or_default();
        let n = rest.len().min(max.max(1));
        let piece = rest.get(..n).unwrap_or_default().to_vec();
        self.sent += n;
        (piece, self.sent < self.text.len())
    }

    pub fn is_empty(&self) -> bool {
        self.sent >= self.text.len()
    }
}

// ---- values ----------------------------------------------------------------------------

/// Value errors: the key is then answered with `Reject` (RFC 7143 §6.2).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    #[error("not a number: {0}")]
    NotNumber(String),
    #[error("number does not fit 64 bits")]
    Overflow,
    #[error("not Yes or No: {0}")]
    NotBoolean(String),
    #[error("bad binary encoding")]
    BadBinary,
    #[error("not a range: {0}")]
    NotRange(String),
}

/// The constants a value may be instead of a real value (RFC 7143 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Reject,
    Irrelevant,
    NotUnderstood,
}

impl Special {
    pub fn as_str(self) -> &'static str {
        match self {
            Special::Reject => "Reject",
            Special::Irrelevant => "Irrelevant",
            Special::NotUnderstood => "NotUnderstood",
        }
    }
}

/// `Reject`, `Irrelevant` or `NotUnderstood`, if the value is one of them.
pub fn special(value: &str) -> Option<Special> {
    match value {
        "Reject" => Some(Special::Reject),
        "Irrelevant" => Some(Special::Irrelevant),
        "NotUnderstood" => Some(Special::NotUnderstood),
        _ => None,
    }
}

/// A numerical value: decimal, `0x`/`0X` hex or `0b`/`0B` base64, below 2^64
/// (RFC 7143 §6.1, numerical-value).
pub fn parse_number(s: &str) -> Result<u64, ValueError> {
    let bad = || ValueError::NotNumber(truncate(s));
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let digits = hex.trim_start_matches('0');
        if digits.len() > 16 {
            return Err(ValueError::Overflow);
        }
        return if digits.is_empty() {
            Ok(0)
        } else {
            u64::from_str_radix(digits, 16).map_err(|_| bad())
        };
    }
    if s.starts_with("0b") || s.starts_with("0B") {
        let bytes = parse_binary(s).map_err(|_| bad())?;
        let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
        let significant = bytes.get(first..).unwrap_or_default();
        if significant.len() > 8 {
            return Err(ValueError::Overflow);
        }
        return Ok(significant
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)));
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    s.parse::<u64>().map_err(|_| ValueError::Overflow)
}

/// `Yes` or `No`, case-sensitive (RFC 7143 §6.1 boolean-value).
pub fn parse_bool(s: &str) -> Result<bool, ValueError> {
    match s {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(ValueError::NotBoolean(truncate(s))),
    }
}

pub fn encode_bool(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

/// A comma-separated list of values (RFC 7143 §6.1 list-of-values).
pub fn parse_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',')
}

/// `low~high` with low <= high (RFC 7143 §6.1 numerical-range).
pub fn parse_range(s: &str) -> Result<(u64, u64), ValueError> {
    let (a, b) = s
        .split_once('~')
        .ok_or_else(|| ValueError::NotRange(truncate(s)))?;
    let (a, b) = (parse_number(a)?, parse_number(b)?);
    if a > b {
        return Err(ValueError::NotRange(truncate(s)));
    }
    Ok((a, b))
}

/// A binary value, `0x` hex or `0b` base64 (RFC 7143 §6.1 binary-value); CHAP uses these.
pub fn parse_binary(s: &str) -> Result<Vec<u8>, ValueError> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err(ValueError::BadBinary);
        }
        // an odd number of digits means a leading zero nibble
        let mut out = Vec::with_capacity(hex.len().div_ceil(2));
        let digits: Vec<u8> = hex
            .bytes()
            .map(hex_val)
            .collect::<Option<_>>()
            .ok_or(ValueError::BadBinary)?;
        let (head, tail) = digits.split_at(digits.len() % 2);
        if let Some(h) = head.first() {
            out.push(*h);
        }
        for pair in tail.chunks_exact(2) {
            if let [hi, lo] = pair {
                out.push((hi << 4) | lo);
            }
        }
        return Ok(out);
    }
    if let Some(b64) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        return base64_decode(b64);
    }
    Err(ValueError::BadBinary)
}

/// Encode binary as `0x` hex.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn b64_val(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// RFC 4648 base64 with `=` padding, as RFC 7143 §6.1 asks.
fn base64_decode(s: &str) -> Result<Vec<u8>, ValueError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() & 3 != 0 {
        return Err(ValueError::BadBinary);
    }
    let body = s.trim_end_matches('=');
    let pad = bytes.len() - body.len();
    if pad > 2 {
        return Err(ValueError::BadBinary);
    }
    let vals: Vec<u8> = body
        .bytes()
        .map(b64_val)
        .collect::<Option<_>>()
        .ok_or(ValueError::BadBinary)?;
    let mut out = Vec::with_capacity(vals.len() * 3 / 4);
    for chunk in vals.chunks(4) {
        let mut acc = 0u32;
        for (i, v) in chunk.iter().enumerate() {
            acc |= u32::from(*v) << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return Err(ValueError::BadBinary),
        };
        out.extend_from_slice(acc.to_be_bytes().get(1..1 + n).unwrap_or_default());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            p("InitiatorName", "iqn.2004-10.com.example:host"),
            p("SessionType", "Normal"),
            p("X-com.example.a", ""),
        ];
        let bytes = encode_pairs(&pairs);
        assert_eq!(bytes.last(), Some(&0));
        assert_eq!(parse_pairs(&bytes).unwrap(), pairs);
        // value may contain '='
        assert_eq!(
            parse_pairs(b"TargetAddress=a=b\0").unwrap(),
            vec![p("TargetAddress", "a=b")]
        );
        // last pair without NUL, empty entries
        assert_eq!(
            parse_pairs(b"\0A=1\0\0B=2").unwrap(),
            vec![p("A", "1"), p("B", "2")]
        );
    }

    #[test]
    fn malformed_pairs() {
        assert_eq!(
            parse_pairs(b"NoEquals\0"),
            Err(TextError::MissingEquals("NoEquals".into()))
        );
        assert_eq!(parse_pairs(b"=v\0"), Err(TextError::EmptyKey));
        assert_eq!(
            parse_pairs(b"Bad Key=v\0"),
            Err(TextError::BadKeyName("Bad Key".into()))
        );
        assert_eq!(parse_pairs(b"K=\xff\0"), Err(TextError::NotUtf8));
        let long_key = format!("{}=1\0", "K".repeat(64));
        assert_eq!(
            parse_pairs(long_key.as_bytes()),
            Err(TextError::KeyTooLong(64))
        );
        let ok_key = format!("{}=1\0", "K".repeat(63));
        assert!(parse_pairs(ok_key.as_bytes()).is_ok());
        let long_val = format!("TargetAlias={}\0", "v".repeat(256));
        assert!(matches!(
            parse_pairs(long_val.as_bytes()),
            Err(TextError::ValueTooLong { max: 255, .. })
        ));
        let chap = format!("CHAP_C=0x{}\0", "ab".repeat(1024));
        assert!(parse_pairs(chap.as_bytes()).is_ok());
    }

    #[test]
    fn assembler_joins_split_pairs() {
        let mut a = TextAssembler::default();
        assert_eq!(a.push(b"InitiatorNa", true), Ok(None));
        assert!(a.is_partial());
        assert_eq!(a.push(b"", true), Ok(None)); // C=1 and no data
        assert_eq!(a.push(b"me=iqn.x\0Sess", true), Ok(None));
        let got = a.push(b"ionType=Discovery\0", false).unwrap().unwrap();
        assert_eq!(
            got,
            vec![p("InitiatorName", "iqn.x"), p("SessionType", "Discovery")]
        );
        assert!(!a.is_partial());
        // an empty final PDU is an empty key list
        assert_eq!(a.push(b"", false), Ok(Some(vec![])));
    }

    #[test]
    fn assembler_caps() {
        let mut a = TextAssembler::new(100, 4);
        assert_eq!(a.push(&[b'a'; 60], true), Ok(None));
        assert_eq!(
            a.push(&[b'a'; 60], true),
            Err(TextError::TooLarge { len: 120, max: 100 })
        );
        assert!(!a.is_partial());
        for _ in 0..4 {
            assert_eq!(a.push(b"", true), Ok(None));
        }
        assert_eq!(a.push(b"", true), Err(TextError::TooManyPdus { max: 4 }));
    }

    #[test]
    fn outbox_splits() {
        let mut o = TextOutbox::new(vec![1u8; 20_000]);
        assert_eq!(o.next_segment(8192).0.len(), 8192);
        let (b, more) = o.next_segment(8192);
        assert_eq!((b.len(), more), (8192, true));
        let (b, more) = o.next_segment(8192);
        assert_eq!((b.len(), more), (20_000 - 16384, false));
        assert!(o.is_empty());
        let mut empty = TextOutbox::new(Vec::new());
        assert_eq!(empty.next_segment(10), (vec![], false));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X00000000000000002000"), Ok(8192));
        assert_eq!(parse_number("0bAAAgAA=="), Ok(0x2000)); // 00 00 20 00
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_number("18446744073709551616"),
            Err(ValueError::Overflow)
        );
        assert_eq!(
            parse_number("0x10000000000000000"),
            Err(ValueError::Overflow)
        );
        for bad in ["", "-1", "12a", "0x", "0xg", "1 ", "Yes"] {
            assert!(parse_number(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans_lists_ranges_specials() {
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("No"), Ok(false));
        assert!(parse_bool("yes").is_err());
        assert_eq!(
            parse_list("CRC32C,None").collect::<Vec<_>>(),
            vec!["CRC32C", "None"]
        );
        assert_eq!(parse_range("1~5"), Ok((1, 5)));
        assert!(parse_range("5~1").is_err());
        assert!(parse_range("5").is_err());
        assert_eq!(special("Irrelevant"), Some(Special::Irrelevant));
        assert_eq!(special("reject"), None);
    }

    #[test]
    fn binary_values() {
        assert_eq!(parse_binary("0x0102ff"), Ok(vec![1, 2, 0xff]));
        assert_eq!(parse_binary("0x102"), Ok(vec![1, 2]));
        assert_eq!(parse_binary("0bAQL/"), Ok(vec![1, 2, 0xff]));
        assert_eq!(parse_binary("0bAQI="), Ok(vec![1, 2]));
        assert_eq!(parse_binary("0bAQ=="), Ok(vec![1]));
        for bad in ["0x", "0b", "0bA", "0bA===", "0b!!!!", "12", "0xzz"] {
            assert!(parse_binary(bad).is_err(), "{bad}");
        }
        assert_eq!(encode_hex(&[0, 0xab]), "0x00ab");
    }
}
