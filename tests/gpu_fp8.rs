//! The sm_90 hardware fp8 conversion (`fp8::hw`, reached through the `kvio_fp8_probe` device
//! function in kvio's sm_90 PTX) against the software path (`fp8::soft`, what sm_80 and the
//! CPU run) for all 2^16 bf16 inputs, both formats, both byte positions, several scales.
//! No kernel converts yet: a small entry appended to the PTX here calls the probe.

use cust::launch;
use cust::memory::{CopyDestination, DeviceBuffer};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use kvio_kernels::fp8::{self, soft};

/// An entry point appended to the sm_90 PTX at run time: thread i writes
/// kvio_fp8_probe(bf16(i), bf16(i + 1), scale) to out[i].
const CHECK_ENTRY: &str = r#"
.visible .entry kvio_fp8_check(.param .u64 out_p, .param .f32 scale_p)
{
    .reg .b32 %cr<12>;
    .reg .b64 %crd<5>;
    mov.u32 %cr1, %ctaid.x;
    mov.u32 %cr2, %ntid.x;
    mov.u32 %cr3, %tid.x;
    mad.lo.u32 %cr4, %cr1, %cr2, %cr3;
    shl.b32 %cr5, %cr4, 16;
    add.u32 %cr6, %cr4, 1;
    shl.b32 %cr6, %cr6, 16;
    ld.param.b32 %cr7, [scale_p];
    {
        .param .b32 a0;
        .param .b32 a1;
        .param .b32 a2;
        .param .b32 rv;
        st.param.b32 [a0], %cr5;
        st.param.b32 [a1], %cr6;
        st.param.b32 [a2], %cr7;
        call.uni (rv), kvio_fp8_probe, (a0, a1, a2);
        ld.param.b32 %cr8, [rv];
    }
    ld.param.u64 %crd1, [out_p];
    cvta.to.global.u64 %crd2, %crd1;
    mul.wide.u32 %crd3, %cr4, 4;
    add.s64 %crd4, %crd2, %crd3;
    st.global.u32 [%crd4], %cr8;
    ret;
}
"#;

#[test]
fn hw_fp8_equals_soft_for_all_bf16() {
    let Some(_gpu) = kvio_suite::gpu("hw_fp8_equals_soft_for_all_bf16") else {
        return;
    };
    let ptx = format!("{}\n{}", kvio::PTX_SM90, CHECK_ENTRY);
    let module = Module::from_ptx(&ptx, &[]).expect("load sm_90 PTX + check entry");
    let check = module.get_function("kvio_fp8_check").unwrap();
    let stream = Stream::new(StreamFlags::NON_BLOCKING, None).unwrap();
    let out = DeviceBuffer::<u32>::zeroed(1 << 16).unwrap();
    let mut bad = 0usize;
    for scale in [1.0f32, 0.0213, 3.7, 1e-30, 1e30, -1.5] {
        unsafe {
            launch!(check<<<256, 256, 0, stream>>>(out.as_device_ptr(), scale)).unwrap();
        }
        stream.synchronize().unwrap();
        let mut got = vec![0u32; 1 << 16];
        out.copy_to(&mut got[..]).unwrap();
        for i in 0..=u16::MAX {
            let (a, b) = (fp8::bf16_to_f32(i), fp8::bf16_to_f32(i.wrapping_add(1)));
            let want = soft::f32x2_to_e4m3x2(a / scale, b / scale) as u32
                | (soft::f32x2_to_e5m2x2(a / scale, b / scale) as u32) << 16;
            let g = got[i as usize];
            if g != want {
                if bad < 20 {
                    eprintln!(
                        "scale {scale:e} bf16 {i:#06x} ({a:e}), next ({b:e}): hw {g:#010x} soft {want:#010x} \
                         (bytes: e4m3 lo/hi, e5m2 lo/hi)"
                    );
                }
                bad += 1;
            }
        }
    }
    // What the instruction does with NaNs of either sign (bf16 0x7fc0 / 0xffc0), for the record.
    let mut got = vec![0u32; 1 << 16];
    unsafe {
        launch!(check<<<256, 256, 0, stream>>>(out.as_device_ptr(), 1.0f32)).unwrap();
    }
    stream.synchronize().unwrap();
    out.copy_to(&mut got[..]).unwrap();
    eprintln!(
        "hw NaN codes: +NaN {:#010x}, -NaN {:#010x} (e4m3 in bits 0..8, e5m2 in bits 16..24)",
        got[0x7fc0], got[0xffc0]
    );
    assert_eq!(bad, 0, "{bad} mismatches between hw and soft");
}
