//! Assembles the embedded PTX with NVIDIA's `ptxas` for its architecture, when `ptxas` can be
//! found (on `PATH`, or at `$KVIO_PTXAS`). `KVIO_REQUIRE_PTXAS=1` (set by `.ci/run`) turns a
//! missing `ptxas` into a failure, so CI really runs the check.

use std::path::PathBuf;
use std::process::Command;

fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVIO_PTXAS") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

#[test]
fn ptx_assembles_with_ptxas() {
    let Some(ptxas) = find_ptxas() else {
        assert!(
            !std::env::var("KVIO_REQUIRE_PTXAS").is_ok_and(|v| v == "1"),
            "KVIO_REQUIRE_PTXAS=1 but no ptxas on PATH or in KVIO_PTXAS"
        );
        kvio_suite::skipped(
            "ptx_assembles_with_ptxas",
            "no ptxas on PATH (set KVIO_PTXAS)",
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("kvio-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (arch, text) in [("sm_80", kvio::PTX_SM80), ("sm_90", kvio::PTX_SM90)] {
        assert!(
            text.contains(&format!(".target {arch}")),
            "{arch}: wrong .target"
        );
        for k in kvio::KERNELS {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{arch}: kernel {k} missing"
            );
        }
        let src = dir.join(format!("kvio_{arch}.ptx"));
        std::fs::write(&src, text).unwrap();
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("kvio_{arch}.cubin")))
            .output()
            .expect("run ptxas");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas -arch={arch} failed:\n{log}");
        eprintln!("ptxas -arch={arch}:\n{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
