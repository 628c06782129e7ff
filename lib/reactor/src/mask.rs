//! Core masks as SPDK writes them: `0x3`, `3`, `[0,1]`, `[0-3,6]`.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CoreMaskError {
    #[error("empty core mask")]
    Empty,
    #[error("invalid core mask {0:?}: expected hex like 0x3 or a list like [0,1] or [0-3]")]
    Invalid(String),
}

/// Parses a core mask into a sorted, de-duplicated list of core numbers.
pub fn parse_core_mask(s: &str) -> Result<Vec<usize>, CoreMaskError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(CoreMaskError::Empty);
    }
    let bad = || CoreMaskError::Invalid(s.to_string());
    let mut cores = Vec::new();
    if let Some(list) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let a: usize = a.trim().parse().map_err(|_| bad())?;
                    let b: usize = b.trim().parse().map_err(|_| bad())?;
                    if a > b || b >= 1024 {
                        return Err(bad());
                    }
                    cores.extend(a..=b);
                }
                None => {
                    let c: usize = part.parse().map_err(|_| bad())?;
                    if c >= 1024 {
                        return Err(bad());
                    }
                    cores.push(c)
                }
            }
        }
    } else {
        let hex = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
        let v = u128::from_str_radix(hex, 16).map_err(|_| bad())?;
        for bit in 0..128 {
            if v & (1u128 << bit) != 0 {
                cores.push(bit);
            }
        }
    }
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return Err(CoreMaskError::Empty);
    }
    Ok(cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_lists() {
        assert_eq!(parse_core_mask("0x3").unwrap(), vec![0, 1]);
        assert_eq!(parse_core_mask("0x1").unwrap(), vec![0]);
        assert_eq!(parse_core_mask("c").unwrap(), vec![2, 3]);
        assert_eq!(parse_core_mask("[0,2]").unwrap(), vec![0, 2]);
        assert_eq!(parse_core_mask("[0-2, 5]").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(parse_core_mask("0x0"), Err(CoreMaskError::Empty));
        assert!(parse_core_mask("zz").is_err());
        assert!(parse_core_mask("[3-1]").is_err());
        assert!(parse_core_mask("").is_err());
    }
}
