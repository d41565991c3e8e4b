//! The machine code kvio embeds with the `sass` feature (`kvio::sass`, assembled from the PTX
//! by ptxas at build time): per architecture a CUDA ELF for that SM whose symbol table defines
//! every kernel entry point; without the feature, none. No GPU needed:
//! `cargo test --features sass --test sass` (with `KVIO_PTXAS` set, as `.ci/run` does).

use kvio::{Arch, KERNELS};

/// `e_machine` of NVIDIA's CUDA ELF files.
const EM_CUDA: u16 = 190;
/// `st_info` type of a function symbol.
const STT_FUNC: u8 = 2;
/// `sh_type` of a symbol table.
const SHT_SYMTAB: u32 = 2;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// The NUL-terminated string at `at` of `b`.
fn c_str(b: &[u8], at: usize) -> &str {
    let end = at
        + b[at..]
            .iter()
            .position(|&c| c == 0)
            .expect("NUL-terminated");
    std::str::from_utf8(&b[at..end]).expect("UTF-8 name")
}

/// The names of the function symbols of a 64-bit little-endian ELF file (its `.symtab`,
/// whose names live in the section its `sh_link` names).
fn function_symbols(elf: &[u8]) -> Vec<String> {
    let (shoff, shentsize, shnum) = (
        u64_at(elf, 0x28),
        u16_at(elf, 0x3a) as usize,
        u16_at(elf, 0x3c) as usize,
    );
    assert_eq!(shentsize, 64, "ELF64 section headers");
    let section = |i: usize| shoff + i * shentsize;
    let mut names = Vec::new();
    for i in 0..shnum {
        let sh = section(i);
        if u32_at(elf, sh + 4) != SHT_SYMTAB {
            continue;
        }
        let (off, size, link, entsize) = (
            u64_at(elf, sh + 0x18),
            u64_at(elf, sh + 0x20),
            u32_at(elf, sh + 0x28) as usize,
            u64_at(elf, sh + 0x38),
        );
        assert_eq!(entsize, 24, "ELF64 symbols");
        let strtab = u64_at(elf, section(link) + 0x18);
        for s in (off..off + size).step_by(entsize) {
            if elf[s + 4] & 0xf == STT_FUNC {
                names.push(c_str(elf, strtab + u32_at(elf, s) as usize).to_string());
            }
        }
    }
    names
}

#[test]
fn machine_code_defines_every_kernel_for_its_sm() {
    if !cfg!(feature = "sass") {
        kvio_suite::skipped(
            "machine_code_defines_every_kernel_for_its_sm",
            "built without the sass feature (cargo test --features sass --test sass)",
        );
        return;
    }
    for (arch, sm) in [(Arch::Sm80, 80u32), (Arch::Sm90, 90)] {
        let elf = kvio::sass(arch).expect("feature sass: machine code embedded");
        assert_eq!(&elf[..4], b"\x7fELF", "{arch:?}: an ELF file");
        assert_eq!(
            elf.as_ptr() as usize % 8,
            0,
            "{arch:?}: 8-byte aligned for the driver"
        );
        assert_eq!(elf[4], 2, "{arch:?}: 64-bit");
        assert_eq!(elf[5], 1, "{arch:?}: little-endian");
        assert_eq!(u16_at(elf, 18), EM_CUDA, "{arch:?}: a CUDA ELF");
        // ptxas 12's CUDA ELF (ABI version 7) keeps the SM in e_flags' low byte; other
        // versions lay the flags out differently.
        if elf[8] == 7 {
            assert_eq!(
                u32_at(elf, 48) & 0xff,
                sm,
                "{arch:?}: machine code for sm_{sm}"
            );
        }
        let functions = function_symbols(elf);
        for k in KERNELS {
            assert!(
                functions.iter().any(|f| f == k),
                "{arch:?}: no function symbol {k} in the machine code ({} functions)",
                functions.len()
            );
        }
    }
}

#[test]
fn machine_code_is_embedded_exactly_with_the_feature() {
    for arch in [Arch::Sm80, Arch::Sm90] {
        assert_eq!(
            kvio::sass(arch).is_some(),
            cfg!(feature = "sass"),
            "{arch:?}"
        );
    }
}

/// On a GPU: the kernels are loaded as machine code exactly where the feature embeds it and the
/// device runs it (for the architecture `KVIO_TEST_ARCH` picks), else as PTX; whichever it is,
/// a launch of the module's empty kernel completes. With the feature, the bundle's other GPU
/// tests then run the machine code.
#[test]
fn gpu_loads_machine_code_where_the_device_runs_it() {
    use cust::sys as cu;
    let test = "gpu_loads_machine_code_where_the_device_runs_it";
    let Some(g) = kvio_suite::gpu(test) else {
        return;
    };
    // The device of the context kvio_suite::gpu made current, through kvio's own queries.
    let dev = kvio::current_device().expect("cuCtxGetDevice");
    let cc = |attribute| kvio::device_attribute(dev, attribute).expect("cuDeviceGetAttribute");
    let major = cc(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    let minor = cc(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    let arch = g.kv.arch();
    let want = if kvio::sass(arch).is_some() && arch.runs_sass_on(major, minor) {
        kvio::Code::Sass
    } else {
        kvio::Code::Ptx
    };
    assert_eq!(
        g.kv.code(),
        want,
        "{arch:?} on compute capability {major}.{minor}"
    );
    let stream = g.stream();
    g.kv.bench_noop(kvio::StreamRef::from(&stream))
        .expect("launch of kvio_noop");
    stream.synchronize().expect("kvio_noop completes");
    eprintln!(
        "{test}: {arch:?} loaded as {:?} on {major}.{minor}",
        g.kv.code()
    );
}
