//! The parameter lists the host packs (`kvio_kernels::args::*Args::SIZES`, generated from the
//! same definition as the entry points) match the `.param` lists in the shipped PTX, for every
//! kernel and architecture; the `sm_90` entry points wait for their programmatic prerequisites
//! before touching memory, and the `sm_80` PTX holds no `griddepcontrol`; the v0 streams'
//! row loads keep their L2 prefetch size on `sm_90`.

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
        let mut all: Vec<(&str, Vec<usize>)> = vec![
            ("kvio_noop", vec![]),
            ("kvio_wait", vec![]),
            // dst, n, iters, seed, early
            ("kvio_produce", vec![8, 8, 4, 4, 4]),
        ];
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

/// The body of entry `name` in `ptx` (from its `.entry` line to its closing brace).
fn entry_body<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} missing"));
    let body = &ptx[start..];
    &body[..body.find("\n}\n").expect("end of entry")]
}

/// Whether a PTX instruction (predicate removed) touches memory other than the kernel's
/// parameters, or calls a function that might.
fn touches_memory(op: &str) -> bool {
    (op.starts_with("ld.") && !op.starts_with("ld.param"))
        || op.starts_with("st.")
        || op.starts_with("atom.")
        || op.starts_with("red.")
        || op.starts_with("cp.")
        || op.starts_with("call")
}

/// One PTX instruction of an entry's body, as the control-flow check needs it.
struct Inst<'a> {
    /// The instruction without its predicate (`@%p1 bra $L__BB0_2;` -> `bra $L__BB0_2;`).
    op: &'a str,
    /// Whether it runs under a predicate.
    predicated: bool,
}

/// The instructions of `body` (one per `;`-terminated line; directives, braces and comments
/// dropped) and the index each label names.
fn instructions(body: &str) -> (Vec<Inst<'_>>, std::collections::HashMap<&str, usize>) {
    let (mut insts, mut labels) = (Vec::new(), std::collections::HashMap::new());
    // Skip the parameter list and declarations: the body starts after the opening brace.
    let body = &body[body.find("\n{").expect("entry body")..];
    for l in body.lines().map(str::trim) {
        if let Some(label) = l.strip_suffix(':') {
            labels.insert(label, insts.len());
        } else if l.ends_with(';') && !l.starts_with('.') && !l.starts_with("//") {
            let (op, predicated) = match l.strip_prefix('@') {
                Some(rest) => (rest.split_once(' ').map_or(rest, |(_, op)| op.trim()), true),
                None => (l, false),
            };
            insts.push(Inst { op, predicated });
        }
    }
    (insts, labels)
}

/// Walks every path from the entry of `body` until it passes an unpredicated
/// `griddepcontrol.wait`, and returns the first instruction found on such a path that
/// touches memory or signals dependents (`griddepcontrol.launch_dependents`), if any.
fn before_wait<'a>(name: &str, body: &'a str) -> Option<&'a str> {
    let (insts, labels) = instructions(body);
    let mut seen = vec![false; insts.len() + 1];
    let mut todo = vec![0usize];
    while let Some(i) = todo.pop() {
        if i >= insts.len() || std::mem::replace(&mut seen[i], true) {
            continue;
        }
        let Inst { op, predicated } = insts[i];
        if op.starts_with("griddepcontrol.wait") && !predicated {
            continue;
        }
        if touches_memory(op) || op.starts_with("griddepcontrol.launch_dependents") {
            return Some(op);
        }
        let jump = op.starts_with("bra");
        if jump {
            let target = op
                .split_whitespace()
                .last()
                .map(|t| t.trim_end_matches(';'))
                .unwrap_or_else(|| panic!("{name}: branch without target: {op}"));
            let at = *labels
                .get(target)
                .unwrap_or_else(|| panic!("{name}: unknown label {target}"));
            todo.push(at);
        }
        let ends =
            (jump || op.starts_with("ret") || op.starts_with("exit") || op.starts_with("trap"))
                && !predicated;
        if !ends {
            todo.push(i + 1);
        }
    }
    None
}

#[test]
fn sm90_entry_points_wait_before_touching_memory() {
    let entries = [
        SlotArgs::ENTRIES,
        TileArgs::ENTRIES,
        SliceArgs::ENTRIES,
        CopyArgs::ENTRIES,
        NaiveArgs::ENTRIES,
    ]
    .concat();
    for name in entries {
        let body = entry_body(kvio::PTX_SM90, name);
        assert!(
            body.contains("griddepcontrol.wait;"),
            "sm_90 {name}: no griddepcontrol.wait"
        );
        let signals = body.contains("griddepcontrol.launch_dependents;");
        // Block copies and the v0 prefill entries never signal (their dependents are
        // scheduled as their CTAs exit); the rest of the write path signals once it has
        // waited (the quantizing MLA update at each thread's last row).
        let never = [
            "kvio_update_pages",
            "kvio_update_pages_fp8",
            "kvio_update_pages_fp8_32",
            "kvio_update_tiles_staged",
            "kvio_update_stream",
            "kvio_update_stream_rot",
            "kvio_update_stream_fp8",
        ];
        if CopyArgs::ENTRIES.contains(&name) || never.contains(&name) {
            assert!(!signals, "sm_90 {name}: signals early");
        } else {
            assert!(signals, "sm_90 {name}: no griddepcontrol.launch_dependents");
        }
        // On every path from the entry: no memory access and no signal before the wait
        // (bodies may do argument-only arithmetic first: `pdl::Signal::BODY_WAITS`).
        if let Some(op) = before_wait(name, body) {
            panic!("sm_90 {name}: `{op}` can run before griddepcontrol.wait");
        }
    }
    // The producer signals (it is launched plainly, so it has nothing to wait for).
    let produce = entry_body(kvio::PTX_SM90, "kvio_produce");
    assert!(produce.contains("griddepcontrol.launch_dependents;"));
    assert!(!produce.contains("griddepcontrol.wait"));
}

#[test]
fn sm80_ptx_has_no_griddepcontrol() {
    // PTX ISA: griddepcontrol requires sm_90.
    assert!(!kvio::PTX_SM80.contains("griddepcontrol"));
    assert!(kvio::PTX_SM90.contains("griddepcontrol.wait;"));
}

/// The bulk-copy transfer: the `sm_90` module is PTX ISA 8.0 and declares the stages and
/// barriers `kvio_kernels::bulk` addresses, at the sizes of its constants; the `sm_80` module
/// keeps rustc's version and holds no bulk copy (its `kvio_transfer_blocks_tma` copies with
/// plain accesses and is never launched).
#[test]
fn tma_shared_memory_matches_the_kernels() {
    use kvio_kernels::bulk::{BARRIERS, SMEM_STAGE_BYTES};
    let ptx = kvio::PTX_SM90;
    assert!(ptx.contains("\n.version 8.0\n"), "sm_90 PTX is ISA 8.0");
    assert!(ptx.contains(&format!(
        ".shared .align 128 .b8 kvio_tma_stage[{SMEM_STAGE_BYTES}];"
    )));
    assert!(ptx.contains(&format!(".shared .align 8 .b64 kvio_tma_bar[{BARRIERS}];")));
    let body = entry_body(ptx, "kvio_transfer_blocks_tma");
    for op in [
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.global.shared::cta.bulk_group",
        "cp.async.bulk.wait_group 0;",
    ] {
        assert!(
            body.contains(op),
            "sm_90 kvio_transfer_blocks_tma: no `{op}`"
        );
    }
    assert!(!kvio::PTX_SM80.contains("cp.async.bulk"));
    assert!(!kvio::PTX_SM80.contains("kvio_tma_stage"));
}

/// The staged tiled update: both modules declare the staging area `kvio_kernels::stage`
/// addresses, at its size, and its entry copies with `cp.async` and waits for the copies.
#[test]
fn stage_shared_memory_matches_the_kernels() {
    use kvio_kernels::stage::BYTES;
    for ptx in [kvio::PTX_SM80, kvio::PTX_SM90] {
        assert!(ptx.contains(&format!(".shared .align 16 .b8 kvio_tile_stage[{BYTES}];")));
        let body = entry_body(ptx, "kvio_update_tiles_staged");
        for op in [
            "cp.async.ca.shared.global",
            "cp.async.commit_group;",
            "cp.async.wait_group 1;",
            "ld.shared.v4.u32",
        ] {
            assert!(body.contains(op), "kvio_update_tiles_staged: no `{op}`");
        }
    }
}

/// The CTA-phase entries: both modules declare the tile `kvio_kernels::cta` addresses, at its
/// size, and each entry separates its phases with the voting barrier and the plain one and
/// moves the tile through shared memory.
#[test]
fn page_tile_matches_the_kernels() {
    use kvio_kernels::cta::{BYTES, NOTE};
    for ptx in [kvio::PTX_SM80, kvio::PTX_SM90] {
        let size = BYTES + NOTE;
        assert!(ptx.contains(&format!(".shared .align 16 .b8 kvio_page_tile[{size}];")));
        for entry in [
            "kvio_update_pages",
            "kvio_update_pages_fp8",
            "kvio_update_pages_fp8_32",
            "kvio_convert_pages",
        ] {
            let body = entry_body(ptx, entry);
            for op in [
                "bar.red.and.pred",
                "bar.sync 0;",
                "st.shared.u32",
                "ld.shared.v4.u32",
                "kvio_page_tile",
            ] {
                assert!(body.contains(op), "{entry}: no `{op}`");
            }
        }
    }
}

/// The v0 streams' source-row loads carry the 256-byte L2 prefetch size on `sm_90` (the
/// qualifier is a hint the rest of the code never needs, so a refactor could drop it without
/// any other test noticing; BENCHMARKS.md, session 30: 4.7–5.3 points of the bf16 v0 prefill on
/// the H100), and the `sm_80` PTX, where it was not measured, holds none.
#[test]
fn v0_streams_load_rows_with_the_l2_prefetch_size() {
    for name in [
        "kvio_update_stream",
        "kvio_update_stream_rot",
        "kvio_update_stream_fp8",
    ] {
        let sm90 = entry_body(kvio::PTX_SM90, name);
        let hinted = sm90.matches("ld.global.L2::256B.v4.b32").count();
        // Every stream entry loads at least one quad of K and of V through `stream_group`.
        assert!(hinted >= 8, "sm_90 {name}: {hinted} hinted loads");
        assert!(
            !entry_body(kvio::PTX_SM80, name).contains("L2::256B"),
            "sm_80 {name}"
        );
    }
}
