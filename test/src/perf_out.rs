//! Reading riser-perf's report lines in tests.

/// The counts of riser-perf's `aborts: sent N, function complete N (answered before N,
/// aborted N), ...` line, by name: the first line of `out` that contains `marker` (e.g.
/// "aborts: ", or a VM script's "abort-iser: aborts: "), read from after the marker.
pub fn abort_counts(out: &str, marker: &str) -> AbortCounts {
    let line = out
        .lines()
        .find_map(|l| l.split_once(marker).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no {marker:?} line:\n{out}"));
    let mut v = Vec::new();
    let mut words: Vec<&str> = Vec::new();
    for tok in line.split([' ', ',', '(', ')']).filter(|t| !t.is_empty()) {
        match tok.parse::<u64>() {
            Ok(n) => {
                v.push((words.join(" "), n));
                words.clear();
            }
            Err(_) => words.push(tok),
        }
    }
    AbortCounts(v)
}

/// Named counts of one report line.
#[derive(Debug)]
pub struct AbortCounts(pub Vec<(String, u64)>);

impl AbortCounts {
    /// The count called `name`; panics when the line has none.
    pub fn get(&self, name: &str) -> u64 {
        self.0.iter().find(|(k, _)| k == name).map(|(_, n)| *n).unwrap_or_else(|| panic!("no {name:?} in {:?}", self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_counts_by_name() {
        let out = "x\nabort-iser: aborts: sent 12, function complete 3 (answered before 0, aborted 3), task does not exist 9, errors 0\n";
        let c = abort_counts(out, "aborts: ");
        assert_eq!(c.get("sent"), 12);
        assert_eq!(c.get("function complete"), 3);
        assert_eq!(c.get("answered before"), 0);
        assert_eq!(c.get("aborted"), 3);
        assert_eq!(c.get("task does not exist"), 9);
        assert_eq!(c.get("errors"), 0);
    }
}
