//! libiscsi's compliance suite (`iscsi-test-cu`) run against riser, and its CUnit output read
//! back: the suite's own summary and the tests that failed or printed a skip.

use std::collections::BTreeSet;
use std::process::Command;

/// The suite's own verdict plus the tests that printed a skip.
pub struct Outcome {
    pub ran: u32,
    pub passed: u32,
    pub failed: u32,
    pub skipped: BTreeSet<String>,
    pub failed_tests: BTreeSet<String>,
    pub output: String,
}

impl Outcome {
    /// The suite's output of each failed test, from its "Test:" line up to the next test or
    /// suite: what an assertion message shows when a tail of the whole output would not
    /// reach the failures (an intermittent one is then explained by the run that saw it).
    pub fn failed_output(&self) -> String {
        let mut out = String::new();
        let mut suite = "";
        let mut keep = false;
        for line in self.output.lines() {
            let t = line.trim_start();
            if let Some(s) = t.strip_prefix("Suite: ") {
                suite = s.trim();
                keep = false;
            }
            if let Some(rest) = t.strip_prefix("Test: ") {
                let name = format!("{suite}.{}", rest.split(" ...").next().unwrap_or(rest).trim());
                keep = self.failed_tests.contains(&name);
            }
            if keep {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// Runs `iscsi-test-cu --dataloss --allow-sanitize -t PATTERN URL...` with two initiator
/// names (the MultipathIO tests use the second) and reads its output.
pub fn run_tests(pattern: &str, urls: &[&str]) -> Outcome {
    let out = Command::new("iscsi-test-cu")
        .args(["--dataloss", "--allow-sanitize", "-i", "iqn.2024-01.io.riser.test:init1", "-I", "iqn.2024-01.io.riser.test:init2", "-t", pattern])
        .args(urls)
        .output()
        .unwrap_or_else(|e| panic!("iscsi-test-cu is not installed ({e}): run `scripts/setup.sh test` (Debian libiscsi-bin)"));
    parse(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Reads CUnit's output: "Suite: S" and "Test: T ..." lines name the test that a
/// "[SKIPPED]" or "FAILED" line belongs to; the summary row "tests Total Ran Passed Failed
/// Inactive" gives the counts (no row: 0 ran, which callers treat as a failure).
pub fn parse(output: String) -> Outcome {
    let mut o = Outcome { ran: 0, passed: 0, failed: 0, skipped: BTreeSet::new(), failed_tests: BTreeSet::new(), output };
    let mut suite = String::new();
    let mut test = String::new();
    for line in o.output.lines() {
        let t = line.trim_start();
        if let Some(s) = t.strip_prefix("Suite: ") {
            suite = s.trim().to_string();
        }
        if let Some(rest) = t.strip_prefix("Test: ") {
            test = format!("{suite}.{}", rest.split(" ...").next().unwrap_or(rest).trim());
        }
        if line.contains("[SKIPPED]") && !test.is_empty() {
            o.skipped.insert(test.clone());
        }
        if (t.starts_with("FAILED") || line.contains("...FAILED")) && !test.is_empty() {
            o.failed_tests.insert(test.clone());
        }
        let cols: Vec<&str> = t.split_whitespace().collect();
        if cols.first() == Some(&"tests") && cols.len() >= 5 {
            o.ran = cols[2].parse().unwrap_or(0);
            o.passed = cols[3].parse().unwrap_or(0);
            o.failed = cols[4].parse().unwrap_or(u32::MAX);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_skips_and_failures() {
        let out = "Suite: ReadOnly\n  Test: ReadOnlySBC ...\n    [SKIPPED] not read-only\npassed\nSuite: CompareAndWrite\n  Test: Simple ...FAILED\n\nRun Summary:    Type  Total    Ran Passed Failed Inactive\n              suites     2      2    n/a      0        0\n               tests   230    230    229      1        0\n";
        let o = parse(out.to_string());
        assert_eq!((o.ran, o.passed, o.failed), (230, 229, 1));
        assert!(o.skipped.contains("ReadOnly.ReadOnlySBC"));
        assert!(o.failed_tests.contains("CompareAndWrite.Simple"));
    }

    #[test]
    fn the_output_of_failed_tests_is_kept() {
        let out = "Suite: A\n  Test: Good ...passed\n  Test: Bad ...\n    [FAILED] WRITE10 got GOOD\nFAILED\n  Test: Next ...passed\nSuite: B\n  Test: Other ...passed\n";
        let mut o = parse(out.to_string());
        o.failed_tests.insert("A.Bad".into());
        let f = o.failed_output();
        assert!(f.contains("Test: Bad") && f.contains("[FAILED] WRITE10 got GOOD"), "{f}");
        assert!(!f.contains("Good") && !f.contains("Next") && !f.contains("Other"), "{f}");
    }
}
