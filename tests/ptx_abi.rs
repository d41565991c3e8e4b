//! The parameter lists the host packs (`kvio_kernels::args::*Args::SIZES`, generated from the
//! same definition as the entry points) match the `.param` lists in the shipped PTX, for every
//! kernel and architecture.

use kvio_kernels::args::{CopyArgs, NaiveArgs, SliceArgs, SlotArgs, SpinArgs, TileArgs};

/// Byte sizes of the `.param`s of entry `name` in `ptx`.
fn param_sizes(ptx: &str, name: &str) -> Vec<usize> {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} missing"));
    let body = &ptx[start..];
    let end = body.find(')').expect("param list end");
    body[..end]
        .lines()
        .filter(|l| l.contains(".param"))
        .map(|l| {
            if l.contains(".u64") || l.contains(".b64") || l.contains(".s64") {
                8
            } else if l.contains(".u32") || l.contains(".b32") || l.contains(".s32") {
                4
            } else {
                panic!("{name}: unexpected parameter `{l}`")
            }
        })
        .collect()
}

#[test]
fn host_parameter_lists_match_the_ptx() {
    for (arch, ptx) in [("sm_80", kvio::PTX_SM80), ("sm_90", kvio::PTX_SM90)] {
        let mut all: Vec<(&str, Vec<usize>)> = vec![("kvio_noop", vec![])];
        for (entries, sizes) in [
            (SlotArgs::ENTRIES, SlotArgs::SIZES.to_vec()),
            (TileArgs::ENTRIES, TileArgs::SIZES.to_vec()),
            (SliceArgs::ENTRIES, SliceArgs::SIZES.to_vec()),
            (CopyArgs::ENTRIES, CopyArgs::SIZES.to_vec()),
            (NaiveArgs::ENTRIES, NaiveArgs::SIZES.to_vec()),
            (SpinArgs::ENTRIES, SpinArgs::SIZES.to_vec()),
        ] {
            all.extend(entries.iter().map(|e| (*e, sizes.clone())));
        }
        assert_eq!(
            all.len(),
            kvio::KERNELS.len(),
            "KERNELS lists every entry point"
        );
        for (name, sizes) in all {
            assert_eq!(param_sizes(ptx, name), sizes, "{arch} {name}");
            assert!(
                kvio::KERNELS.contains(&name),
                "{name} not listed in KERNELS"
            );
        }
    }
}
