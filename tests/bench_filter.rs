//! The bench's reading of criterion's command-line filter (`benches/filter.rs`): the rows it
//! skips before their untimed first call must be exactly the rows criterion does not run.

#[path = "../benches/filter.rs"]
mod filter;

use filter::Filter;

fn args(a: &[&str]) -> Filter {
    Filter::from_args(a.iter().map(|s| s.to_string()))
}

const IDS: [&str; 6] = [
    "ceiling/ceiling-device-copy/0",
    "v0-update/v0-update-T-kvio-bf16/16384",
    "v0-update/v0-update-T-kvio-fp8-e4m3/16384",
    "v0-update/v0-update-batch-kvio-fp8-e4m3-seq1024/16",
    "v0-update/v0-update-page-kvio-bf16/16",
    "offload/dma-batch/offload-dma-batch-kvio/65536",
];

fn selected(f: &Filter) -> Vec<&'static str> {
    IDS.iter().copied().filter(|id| f.selects(id)).collect()
}

#[test]
fn no_filter_selects_every_row() {
    assert_eq!(selected(&args(&["--bench"])), IDS);
    assert_eq!(selected(&args(&[])), IDS);
}

#[test]
fn a_regex_selects_the_rows_it_matches_anywhere_in_the_full_id() {
    let f = args(&[
        "--bench",
        "ceiling|v0-update-T-kvio-(bf16|fp8-e4m3)/16384$|v0-update-batch-kvio-fp8-e4m3-(seq1024)/(8|16|32)$",
    ]);
    assert_eq!(
        selected(&f),
        [IDS[0], IDS[1], IDS[2], IDS[3]],
        "the page row and the DMA row are not selected"
    );
    // Matched anywhere (criterion's `Regex::is_match`), the group name included.
    assert_eq!(selected(&args(&["--bench", "dma-batch"])), [IDS[5]]);
    assert_eq!(selected(&args(&["--bench", "^v0-update/"])), &IDS[1..5]);
}

#[test]
fn valued_options_do_not_count_as_the_filter() {
    let f = args(&[
        "--bench",
        "--sample-size",
        "10",
        "--warm-up-time",
        "1",
        "-c",
        "never",
        "--measurement-time=2",
        "page-kvio-bf16",
        "--noplot",
    ]);
    assert_eq!(selected(&f), [IDS[4]]);
    // Only the first positional argument is the filter.
    assert_eq!(
        selected(&args(&["--bench", "ceiling", "offload"])),
        [IDS[0]]
    );
}

#[test]
fn exact_and_ignored() {
    let f = args(&["--bench", "--exact", IDS[3]]);
    assert_eq!(selected(&f), [IDS[3]]);
    // `--exact` with a part of an id selects nothing.
    assert!(selected(&args(&["--bench", "--exact", "ceiling"])).is_empty());
    assert!(selected(&args(&["--bench", "--ignored"])).is_empty());
    assert!(selected(&args(&["--bench", "--ignored", "ceiling"])).is_empty());
}
