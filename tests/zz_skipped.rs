//! Runs after the other test executables (cargo runs them in name order) and prints how many
//! tests skipped their body since the last report (no usable GPU, no ptxas, GPU property tests
//! not asked for), so a green `cargo test` says what it did not check. Not a libtest harness
//! (`harness = false` in Cargo.toml): its output is not captured.

use std::collections::{BTreeMap, BTreeSet};

fn main() {
    let dir = kvio_suite::skip_dir();
    // reason -> (note file, test name): test names are unique within one executable.
    let mut why: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            for line in text.lines() {
                let (test, reason) = line.split_once('\t').unwrap_or((line, "?"));
                why.entry(reason.to_string())
                    .or_default()
                    .insert((file.clone(), test.to_string()));
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    let total: usize = why.values().map(BTreeSet::len).sum();
    if total == 0 {
        println!("kvio: no test skipped its body");
        return;
    }
    println!(
        "kvio: {total} tests passed without running their body \
         (KVIO_REQUIRE_GPU=1 / KVIO_REQUIRE_PTXAS=1 make such a skip fail):"
    );
    for (reason, tests) in &why {
        let shown: Vec<&str> = tests.iter().take(4).map(|(_, t)| t.as_str()).collect();
        let more = tests.len() - shown.len();
        let tail = if more > 0 {
            format!(", +{more} more")
        } else {
            String::new()
        };
        println!(
            "  {:>3} × {reason} ({}{tail})",
            tests.len(),
            shown.join(", ")
        );
    }
}
