//! Build script of kvio.
//!
//! 1. Compiles `kernels/` to PTX with rustc's own NVPTX backend (`-Zbuild-std=core`, target
//!    `nvptx64-nvidia-cuda`), once per architecture in [`ARCHS`], in a nested `cargo rustc`
//!    with its own target directory under `OUT_DIR`. The PTX is embedded by `src/ptx.rs`.
//! 2. Makes sure `-lcuda` (asked for by `cust_raw`) resolves. A real `libcuda.so` is used when
//!    one is found. Otherwise a link stub is built into `OUT_DIR/cuda-stub`: every driver entry
//!    point `cust_raw` declares, each returning `CUDA_ERROR_STUB_LIBRARY` (34). The stub is
//!    never built when a real driver library exists, and binaries carry no RUNPATH to it, so
//!    on a machine with a driver the loader always picks the real `libcuda.so.1`.
//!
//! `KVIO_PTX_DIR=<dir>` skips step 1 and embeds `<dir>/kvio_sm80.ptx` and `kvio_sm90.ptx`
//! (for toolchains that cannot build the kernels themselves).
//!
//! With the `sass` feature, each PTX file is also assembled by NVIDIA's `ptxas` (`KVIO_PTXAS`,
//! else `ptxas` on `PATH`; PyPI's `nvidia-cuda-nvcc-cu12` carries one) into
//! `OUT_DIR/kvio_<tag>.cubin` for its own architecture, which `src/ptx.rs` embeds too: a
//! device that can run that machine code loads it instead of compiling the PTX at load time.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Architectures the kernels are compiled for: (file tag, `-Ctarget-cpu`).
const ARCHS: [(&str, &str); 2] = [("sm80", "sm_80"), ("sm90", "sm_90")];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let kernels = manifest.join("..").join("kernels");
    println!("cargo:rerun-if-env-changed=KVIO_PTX_DIR");
    println!("cargo:rerun-if-changed={}", kernels.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        kernels.join("Cargo.toml").display()
    );
    println!("cargo:rerun-if-changed=cuda-stub/symbols.txt");

    match env::var_os("KVIO_PTX_DIR") {
        Some(dir) => {
            for (tag, _) in ARCHS {
                let from = Path::new(&dir).join(format!("kvio_{tag}.ptx"));
                fs::copy(&from, out.join(format!("kvio_{tag}.ptx"))).unwrap_or_else(|e| {
                    panic!("KVIO_PTX_DIR: cannot copy {}: {e}", from.display())
                });
            }
        }
        None => build_ptx(&kernels, &out),
    }
    for (tag, _) in ARCHS {
        let path = out.join(format!("kvio_{tag}.ptx"));
        if tag == "sm90" {
            add_tma_shared(&path);
        }
        add_stage_shared(&path);
        add_directives(&path, tag);
        check_ptx(&path);
    }
    if env::var_os("CARGO_FEATURE_SASS").is_some() {
        println!("cargo:rerun-if-env-changed=KVIO_PTXAS");
        assemble_sass(&out);
    }
    link_libcuda(&manifest, &out);
}

/// Feature `sass`: assembles every `OUT_DIR/kvio_<tag>.ptx` into `kvio_<tag>.cubin` for its
/// own architecture, the two `ptxas` runs in parallel (20–35 s each for kvio's PTX on this
/// project's development machine).
fn assemble_sass(out: &Path) {
    let ptxas = env::var_os("KVIO_PTXAS").unwrap_or_else(|| "ptxas".into());
    let children: Vec<_> = ARCHS
        .iter()
        .map(|(tag, cpu)| {
            let child = Command::new(&ptxas)
                .arg(format!("-arch={cpu}"))
                .arg(out.join(format!("kvio_{tag}.ptx")))
                .arg("-o")
                .arg(out.join(format!("kvio_{tag}.cubin")))
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "feature `sass` runs ptxas ({ptxas:?}) and could not start it: {e}. \
                         Set KVIO_PTXAS to a ptxas (PyPI: nvidia-cuda-nvcc-cu12) or build \
                         without the feature"
                    )
                });
            (tag, child)
        })
        .collect();
    for (tag, child) in children {
        let output = child.wait_with_output().expect("ptxas");
        assert!(
            output.status.success(),
            "feature `sass`: ptxas failed on kvio_{tag}.ptx ({})",
            output.status
        );
    }
}

/// Runs the nested nvptx builds (in parallel) and copies each `.s` to `OUT_DIR/kvio_<tag>.ptx`.
fn build_ptx(kernels: &Path, out: &Path) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let children: Vec<_> = ARCHS
        .iter()
        .map(|(tag, cpu)| {
            let target_dir = out.join(format!("nvptx-{tag}"));
            let mut cmd = Command::new(&cargo);
            cmd.current_dir(kernels)
                .args(["rustc", "--lib", "--release", "-Zbuild-std=core"])
                .args(["--target", "nvptx64-nvidia-cuda"])
                .arg("--manifest-path")
                .arg(kernels.join("Cargo.toml"))
                .arg("--target-dir")
                .arg(&target_dir)
                .args(["--", "--emit=asm"]);
            // The outer build's flags and wrappers are for the host target, not for nvptx.
            for var in [
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_BUILD_RUSTFLAGS",
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET",
                "CARGO_BUILD_TARGET_DIR",
                "RUSTC_WRAPPER",
                "RUSTC_WORKSPACE_WRAPPER",
                "CARGO_PRIMARY_PACKAGE",
            ] {
                cmd.env_remove(var);
            }
            // panic=immediate-abort reaches core too (bounds checks become traps, no
            // `.extern` panic functions); one codegen unit gives one .s file.
            cmd.env(
                "RUSTFLAGS",
                format!(
                    "-Zunstable-options -Cpanic=immediate-abort -Ctarget-cpu={cpu} \
                     -Ccodegen-units=1 -Copt-level=3 -Cdebuginfo=0"
                ),
            );
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {cargo:?} for the nvptx build: {e}"));
            (tag, target_dir, child)
        })
        .collect();
    for (tag, target_dir, child) in children {
        let status = child.wait_with_output().expect("nvptx build").status;
        assert!(
            status.success(),
            "building kernels/ for nvptx64 ({tag}) failed: it needs the nightly toolchain of \
             rust-toolchain.toml with the rust-src component (`rustup toolchain install`), or \
             KVIO_PTX_DIR pointing at prebuilt PTX"
        );
        let deps = target_dir
            .join("nvptx64-nvidia-cuda")
            .join("release")
            .join("deps");
        let newest = fs::read_dir(&deps)
            .expect("nvptx deps dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| x == "s")
                    && p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("kvio_kernels-")
            })
            .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
            .unwrap_or_else(|| panic!("no kvio_kernels-*.s in {}", deps.display()));
        fs::copy(&newest, out.join(format!("kvio_{tag}.ptx"))).expect("copy ptx");
    }
}

/// PTX performance directives rustc cannot express, per entry point:
/// - `kvio_transfer_blocks` runs in 512-thread CTAs (few CTAs, many bytes in flight over
///   PCIe): ptxas may use up to 128 registers, which its batch of three items' loads per
///   group needs without spilling (see `TRANSFER_THREADS` in `src/launch.rs`);
/// - `kvio_update_tiles` holds eight tokens' rows per thread: at least two 256-thread CTAs
///   per multiprocessor (≤ 128 registers) keep enough loads in flight;
/// - `kvio_update_slots_convert` keeps four 16-byte loads in flight per lane and is
///   latency-bound: four 256-thread CTAs per multiprocessor (≤ 64 registers) give it the
///   warps to hide that latency. Since MLA rows left it for `kvio_update_rows_convert` it
///   takes 59 registers on sm_90 (62 on sm_80), no spills (uncapped: 62, 72 on sm_80); with
///   their path it took 88 uncapped and spilled 28 B / 64 B at 64 (sm_90).
/// - `kvio_update_rows_convert` holds two rounds of an MLA row per lane (the one it converts
///   and the next, loading: five 16-byte units each): two 256-thread CTAs per multiprocessor
///   (≤ 128 registers). It takes 94 on sm_90 (108 on sm_80), no spills; 106 uncapped; at
///   three CTAs, 80 with 36 B / 104 B of spills (sm_90). On the H100 (BENCHMARKS.md, session
///   21) two CTAs wrote e4m3 rows at 16,384 tokens 6% faster than three, and both were faster
///   than the entry without the next round's loads (three CTAs, 76 registers).
/// - `kvio_transfer_blocks_tma` runs one-warp CTAs (`kvio_kernels::bulk::THREADS`).
/// - `kvio_update_tiles_staged` runs CTAs of `kvio_kernels::stage::THREADS` (128) threads, each
///   with 48 KiB of staging (four fit a multiprocessor's shared memory), at least three per
///   multiprocessor (≤ 168 registers). Compiled once per conversion it takes 222 uncapped (two
///   CTAs; sm_90); at three, 168 with 36 B of spills; at four, 128 with 676 B. On the H100
///   (BENCHMARKS.md, session 15) three beat two by 10 points and four lost to three.
/// - `kvio_update_pages` and `kvio_update_pages_fp8` run CTAs of `kvio_kernels::cta::THREADS`
///   (128) threads. `kvio_update_pages_fp8` (two units a thread) at least five per
///   multiprocessor (≤ 102 registers): 96 with 8 B of spills on sm_90 (40 B since the run
///   search of session 18), against 128 (four CTAs) uncapped. On the H100 (BENCHMARKS.md, session 17) five took e4m3 v0 prefill from
///   68.6–69.4% to 77.7–77.9% of the copy ceiling at 16,384 tokens and from 76.5–77.0% to
///   83.8–84.4% at 65,536 (71.4–72.2% against 75.8–76.0% at 4,096); four units a thread
///   (168 registers, three CTAs) and one (five CTAs) lost. `kvio_update_pages_fp8_32` (items
///   of 32 tokens) the same: 96 registers, 24 B of spills (64 B since session 18).
///   `kvio_update_pages` takes 96 registers uncapped since session 18 (five CTAs; 112, four,
///   before). `sm_80`: see [`SM80_DIRECTIVES`].
/// - `kvio_update_stream` runs 256-thread CTAs (`BLOCK_THREADS`); with `.maxntid 256` ptxas may
///   give it up to 255 registers, and it takes 80 on sm_90 (three CTAs a multiprocessor) and 92
///   on sm_80, no spills. Capped at three CTAs an earlier build (94 registers uncapped) spilled
///   112 B and lost 11–24 points on the H200 (BENCHMARKS.md, session 20).
/// - `kvio_update_stream_rot` (the same with shifted windows, pages of 8 and 16 slots) runs
///   128-thread CTAs (`ROT_THREADS`): 90 registers on sm_90 (five CTAs, 20 warps, a
///   multiprocessor), no spills. At 256 threads it took 92 (two CTAs, 16 warps): 1.1–2.3
///   points less for one sequence and up to 4.2 less for batches on the H100 (BENCHMARKS.md,
///   session 29); capped at three 256-thread CTAs (80 registers) it spilled 48 B / 88 B and
///   lost 8 points of one sequence and 5–10 of batches (session 28). `sm_80`: see
///   [`SM80_DIRECTIVES`].
/// - `kvio_update_stream_fp8` runs 256-thread CTAs, at least three per multiprocessor (≤ 80
///   registers; it takes 80 on sm_90, no spills, 81 uncapped: two CTAs). On the H100
///   (BENCHMARKS.md, session 23) builds at 101–112 registers (two CTAs) lost 3–4 points of
///   e4m3 prefill against three. The `sm_80` PTX keeps `.maxntid 256` alone (126 registers, no
///   spills; capped at three it spilled 32 B / 60 B): [`SM80_DIRECTIVES`].
/// - `kvio_convert_blocks` runs 256-thread CTAs (`BLOCK_THREADS`), a head page per group;
///   `kvio_convert_pages` CTAs of `kvio_kernels::cta::THREADS` (128), a page's heads per CTA
///   item, at least five per multiprocessor (≤ 102 registers; it takes 90 on sm_90, 96 on
///   sm_80, no spills; uncapped 108 and 94, four CTAs): 4–6 points more inside the GPU on the
///   H100 (BENCHMARKS.md, session 12), the same over PCIe.
const DIRECTIVES: [(&str, &str); 14] = [
    ("kvio_transfer_blocks", ".maxntid 512, 1, 1\n"),
    ("kvio_transfer_blocks_tma", ".maxntid 32, 1, 1\n"),
    ("kvio_convert_blocks", ".maxntid 256, 1, 1\n"),
    (
        "kvio_convert_pages",
        ".maxntid 128, 1, 1\n.minnctapersm 5\n",
    ),
    ("kvio_update_tiles", ".maxntid 256, 1, 1\n.minnctapersm 2\n"),
    ("kvio_update_stream", ".maxntid 256, 1, 1\n"),
    ("kvio_update_stream_rot", ".maxntid 128, 1, 1\n"),
    (
        "kvio_update_stream_fp8",
        ".maxntid 256, 1, 1\n.minnctapersm 3\n",
    ),
    (
        "kvio_update_tiles_staged",
        ".maxntid 128, 1, 1\n.minnctapersm 3\n",
    ),
    ("kvio_update_pages", ".maxntid 128, 1, 1\n"),
    (
        "kvio_update_pages_fp8",
        ".maxntid 128, 1, 1\n.minnctapersm 5\n",
    ),
    (
        "kvio_update_pages_fp8_32",
        ".maxntid 128, 1, 1\n.minnctapersm 5\n",
    ),
    (
        "kvio_update_slots_convert",
        ".maxntid 256, 1, 1\n.minnctapersm 4\n",
    ),
    (
        "kvio_update_rows_convert",
        ".maxntid 256, 1, 1\n.minnctapersm 2\n",
    ),
];

/// The bulk-copy transfer's static shared memory in the `sm_90` PTX (rustc cannot declare
/// `.shared` variables; the kernel takes their addresses with inline PTX, see
/// `kvio_kernels::bulk`): `STAGES * STAGE_BYTES` bytes of stages and `STAGES * THREADS`
/// mbarriers. `tests/ptx_abi.rs` checks the sizes against the kernels' constants.
const TMA_SHARED: &str = ".shared .align 128 .b8 kvio_tma_stage[40960];\n\
                          .shared .align 8 .b64 kvio_tma_bar[160];\n";

/// Declares [`TMA_SHARED`] after the PTX header and raises the module's PTX ISA version to 8.0
/// (`cp.async.bulk`, `mbarrier.arrive.expect_tx` and `fence.proxy.async` need it; rustc emits
/// 7.8 for `sm_90`). Only the `sm_90` module: the `sm_80` PTX is left as rustc wrote it.
fn add_tma_shared(path: &Path) {
    let mut text = fs::read_to_string(path).expect("read ptx");
    if text.contains(TMA_SHARED) {
        return;
    }
    let version = text
        .lines()
        .find(|l| l.starts_with(".version "))
        .expect("PTX .version line")
        .to_string();
    let (major, minor) = version[".version ".len()..]
        .trim()
        .split_once('.')
        .expect("PTX version x.y");
    let v = (
        major.parse::<u32>().expect("major"),
        minor.parse::<u32>().expect("minor"),
    );
    if v < (8, 0) {
        text = text.replacen(&version, ".version 8.0", 1);
    }
    fs::write(path, declare(&text, TMA_SHARED)).expect("write ptx");
}

/// The staged tiled update's static shared memory, in both modules: `kvio_kernels::stage`'s
/// `BYTES` (checked by `tests/ptx_abi.rs`), cells of 16 bytes; and the tile of the CTA-phase
/// entries (`kvio_update_pages`, ...): `kvio_kernels::cta::BYTES` and the `NOTE` past them.
/// A kernel is given only the shared variables it references.
const STAGE_SHARED: &str = ".shared .align 16 .b8 kvio_tile_stage[49152];\n\
                            .shared .align 16 .b8 kvio_page_tile[17936];\n";

/// Declares [`STAGE_SHARED`] after the PTX header (`cp.async` is PTX ISA 7.0, what rustc emits
/// for `sm_80`).
fn add_stage_shared(path: &Path) {
    let text = fs::read_to_string(path).expect("read ptx");
    if !text.contains(STAGE_SHARED) {
        fs::write(path, declare(&text, STAGE_SHARED)).expect("write ptx");
    }
}

/// `text` with module-scope declarations `decl` after its header.
fn declare(text: &str, decl: &str) -> String {
    let line = text.find(".address_size 64").expect("PTX header");
    let after = line + text[line..].find('\n').expect("end of header line") + 1;
    format!("{}\n{decl}{}", &text[..after], &text[after..])
}

/// Entries whose `sm_80` directives differ from [`DIRECTIVES`]' (applied first in that module).
/// - `kvio_update_pages_fp8` and `kvio_update_pages_fp8_32` convert in software before
///   `sm_89` (more registers): at five CTAs per multiprocessor the first one's `sm_80` code
///   spills 248 B / 384 B (8 B / 8 B uncapped), so both go uncapped there (no `sm_80` GPU
///   measured either way).
/// - `kvio_update_stream_rot` at four 128-thread CTAs (≤ 128 registers): it takes 110, no
///   spills (16 warps, as two 256-thread CTAs at 102 before session 29); with `.maxntid` alone
///   ptxas gave it 96 with 4 B / 40 B of spills.
const SM80_DIRECTIVES: [(&str, &str); 4] = [
    ("kvio_update_pages_fp8", ".maxntid 128, 1, 1\n"),
    ("kvio_update_pages_fp8_32", ".maxntid 128, 1, 1\n"),
    ("kvio_update_stream_fp8", ".maxntid 256, 1, 1\n"),
    (
        "kvio_update_stream_rot",
        ".maxntid 128, 1, 1\n.minnctapersm 4\n",
    ),
];

fn add_directives(path: &Path, tag: &str) {
    let mut text = fs::read_to_string(path).expect("read ptx");
    let first: &[(&str, &str)] = if tag == "sm80" { &SM80_DIRECTIVES } else { &[] };
    for (name, directives) in first.iter().chain(DIRECTIVES.iter()) {
        let entry = format!(".entry {name}(");
        let start = text
            .find(&entry)
            .unwrap_or_else(|| panic!("{}: no {entry}", path.display()));
        let close = start + text[start..].find("\n)\n").expect("end of parameter list") + 3;
        if text[close..].starts_with(".maxntid") {
            continue;
        }
        text = format!("{}{directives}{}", &text[..close], &text[close..]);
    }
    fs::write(path, text).expect("write ptx");
}

/// A PTX module with unresolved `.extern` functions (a panic path, a libcall) cannot load.
fn check_ptx(path: &Path) {
    let text = fs::read_to_string(path).expect("read ptx");
    assert!(
        text.contains(".entry kvio_update_slots"),
        "{}: kernels missing",
        path.display()
    );
    if let Some(line) = text.lines().find(|l| l.contains(".extern .func")) {
        panic!(
            "{} declares an external function the driver cannot resolve: `{line}`",
            path.display()
        );
    }
}

/// Directories where a real `libcuda.so` (or only the driver's `libcuda.so.1`) may live.
fn driver_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_LIBRARY_PATH", "LIBRARY_PATH", "LD_LIBRARY_PATH"] {
        if let Some(v) = env::var_os(var) {
            for d in env::split_paths(&v) {
                dirs.push(d.join("lib64"));
                dirs.push(d.join("lib64").join("stubs"));
                dirs.push(d);
            }
        }
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/lib64/stubs",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn link_libcuda(manifest: &Path, out: &Path) {
    println!("cargo:rerun-if-env-changed=CUDA_LIBRARY_PATH");
    println!("cargo:rerun-if-env-changed=KVIO_FORCE_CUDA_STUB");
    let force_stub = env::var_os("KVIO_FORCE_CUDA_STUB").is_some();
    if !force_stub {
        let dirs = driver_dirs();
        // A linkable libcuda.so (real driver or the toolkit's own link stub): nothing to do,
        // just make sure its directory is searched.
        if let Some(d) = dirs.iter().find(|d| d.join("libcuda.so").is_file()) {
            println!("cargo:rustc-link-search=native={}", d.display());
            println!(
                "cargo:warning=kvio: linking the CUDA driver found in {}",
                d.display()
            );
            return;
        }
        // Only the runtime name exists (driver without the dev symlink): link against it
        // through a `libcuda.so` symlink; at run time the loader resolves `libcuda.so.1` itself.
        if let Some(d) = dirs.iter().find(|d| d.join("libcuda.so.1").is_file()) {
            let link_dir = out.join("cuda-link");
            fs::create_dir_all(&link_dir).expect("mkdir");
            let link = link_dir.join("libcuda.so");
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(d.join("libcuda.so.1"), &link).expect("symlink");
            println!("cargo:rustc-link-search=native={}", link_dir.display());
            return;
        }
    }
    build_stub(manifest, out);
}

/// Builds `OUT_DIR/cuda-stub/libcuda.so` (soname `libcuda.so.1`, plus a `libcuda.so.1` link so
/// test binaries start on a machine without a driver; cuInit then fails with code 34).
fn build_stub(manifest: &Path, out: &Path) {
    let names = fs::read_to_string(manifest.join("cuda-stub").join("symbols.txt"))
        .expect("cuda-stub/symbols.txt");
    let dir = out.join("cuda-stub");
    fs::create_dir_all(&dir).expect("mkdir");
    let mut c = String::from("/* generated by kvio's build.rs: CUDA driver link stub */\n");
    for name in names.lines().map(str::trim).filter(|n| !n.is_empty()) {
        c.push_str(&format!(
            "int {name}(void) {{ return 34; /* CUDA_ERROR_STUB_LIBRARY */ }}\n"
        ));
    }
    let src = dir.join("stub.c");
    fs::write(&src, c).expect("write stub.c");
    let lib = dir.join("libcuda.so");
    let compiler = cc::Build::new().get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run the C compiler for the libcuda stub");
    assert!(status.success(), "building the libcuda link stub failed");
    let so1 = dir.join("libcuda.so.1");
    let _ = fs::remove_file(&so1);
    std::os::unix::fs::symlink("libcuda.so", &so1).expect("symlink libcuda.so.1");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!(
        "cargo:warning=kvio: no CUDA driver library found at build time; linked against a stub \
         (GPU calls fail with CUDA_ERROR_STUB_LIBRARY unless a real libcuda.so.1 is present at run time)"
    );
}
