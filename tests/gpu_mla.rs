//! MLA cache writes (vLLM `concat_and_cache_mla`): each token's latent `kv_c` and rope part
//! `k_pe` side by side in one cache row, bf16 copied or quantized to fp8 with one scale;
//! emulated on the CPU and run on the GPU, compared bit for bit with `kvio::reference`.

use kvio::{
    reference, DeviceBytes, DeviceBytesMut, DeviceErrors, ErrorCounts, Fp8, MlaUpdate, PagedLayout,
    Quantize, Scale, SlotMapping, SrcType, StreamRef, TokenLayout,
};
use kvio_suite::{assert_same, download, random_bytes, upload, Rng};

const LORA: usize = 512;
const ROPE: usize = 64;

/// One MLA write: shapes, format and host data.
struct Case {
    name: String,
    /// `None`: bf16 copied; else bf16 quantized to this format.
    fp8: Option<Fp8>,
    t: usize,
    /// kv_c and k_pe are views of one `[T, LORA + ROPE + pad]` input (vLLM splits one tensor).
    fused_input: bool,
    input: Vec<u8>,
    k_pe_separate: Vec<u8>,
    scale: f32,
    layout: PagedLayout,
    slots: Vec<i64>,
    poison: Vec<u8>,
    bad_slots: u32,
}

/// bf16 values spread like activations, with a few specials (NaN, inf, huge, tiny).
fn bf16s(n: usize, rng: &mut Rng) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let r = rng.next_u64();
            let bits = if i % 37 == 0 {
                r as u16 // any bit pattern: NaN, inf, subnormals, huge
            } else {
                let x = (r % 4096) as f32 / 512.0 - 4.0;
                (x.to_bits() >> 16) as u16
            };
            bits.to_le_bytes()
        })
        .collect()
}

fn case(fp8: Option<Fp8>, bs: usize, t: usize, fused_input: bool, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let e = if fp8.is_some() { 1 } else { 2 };
    let nb = (2 * t).max(64).div_ceil(bs);
    let layout = PagedLayout::nhd(nb, bs, 1, LORA + ROPE, e);
    let num_slots = (nb * bs) as i64;
    let mut free: Vec<i64> = (0..num_slots).collect();
    rng.shuffle(&mut free);
    let mut bad_slots = 0;
    let slots = (0..t)
        .map(|i| match i % 11 {
            3 => -1,
            8 => {
                bad_slots += 1;
                num_slots + rng.below(100) as i64
            }
            _ => free[i],
        })
        .collect();
    let row = LORA + ROPE + 8; // fused input rows carry 8 padding elements
    let ext = layout.extent("cache").unwrap() as usize;
    Case {
        name: format!(
            "{} bs={bs} T={t}{}",
            fp8.map_or("bf16".to_string(), |f| format!("bf16->{f:?}")),
            if fused_input { " fused input" } else { "" }
        ),
        fp8,
        t,
        fused_input,
        input: bf16s(t * row, &mut rng),
        k_pe_separate: bf16s(t * ROPE, &mut rng),
        scale: 0.05 + rng.below(1000) as f32 / 100.0,
        layout,
        slots,
        poison: random_bytes(ext, seed ^ 0x3A),
        bad_slots,
    }
}

impl Case {
    /// `(kv_c, k_pe)` token layouts and the byte offset of `k_pe` in its buffer.
    fn layouts(&self) -> (TokenLayout, TokenLayout, usize) {
        let mut lk = TokenLayout::contiguous(self.t, 1, LORA, 2);
        let mut lp = TokenLayout::contiguous(self.t, 1, ROPE, 2);
        if self.fused_input {
            lk.token_stride = LORA + ROPE + 8;
            lp.token_stride = LORA + ROPE + 8;
            (lk, lp, LORA * 2)
        } else {
            lk.token_stride = LORA + ROPE + 8; // kv_c still a view of the padded rows
            (lk, lp, 0)
        }
    }

    /// The cache as the reference writes it: latent columns, then rope columns.
    fn expected(&self) -> Vec<u8> {
        let (lk, lp, at) = self.layouts();
        let pe_src: &[u8] = if self.fused_input {
            &self.input[at..]
        } else {
            &self.k_pe_separate
        };
        let part = |src: &[u8], l: &TokenLayout, width: usize, col: usize, want: &mut Vec<u8>| {
            let (rows, input) = match self.fp8 {
                Some(f) => {
                    let q = reference::quantize_rows(src, l, SrcType::Bf16, f, &[self.scale]);
                    (q, TokenLayout::contiguous(self.t, 1, width, 1))
                }
                None => (src.to_vec(), *l),
            };
            let mut c = self.layout;
            c.head_dim = width;
            let e = c.elem_bytes;
            let counts =
                reference::update_slots(&rows, None, &input, want, col * e, None, &c, &self.slots);
            assert_eq!(
                counts.bad_slots, self.bad_slots,
                "{}: reference count",
                self.name
            );
        };
        let mut want = self.poison.clone();
        part(&self.input, &lk, LORA, 0, &mut want);
        part(pe_src, &lp, ROPE, LORA, &mut want);
        want
    }

    fn op<'a>(
        &self,
        input: DeviceBytes<'a>,
        k_pe_separate: DeviceBytes<'a>,
        cache: DeviceBytesMut<'a>,
        slots: DeviceBytes<'a>,
        scale: DeviceBytes<'a>,
    ) -> MlaUpdate<'a> {
        let (lk, lp, at) = self.layouts();
        let k_pe = if self.fused_input {
            input.slice(at, input.len() - at).unwrap()
        } else {
            k_pe_separate
        };
        let op = MlaUpdate::new(
            input,
            lk,
            k_pe,
            lp,
            cache,
            self.layout,
            SlotMapping::I64(slots),
        );
        match self.fp8 {
            Some(f) => op.quantize(Quantize::new(SrcType::Bf16, f, Scale::PerTensor(scale))),
            None => op,
        }
    }
}

fn cases(full: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 7;
    for fp8 in [None, Some(Fp8::E4m3), Some(Fp8::E5m2)] {
        for bs in [1, 16, 64, 128] {
            for fused in [false, true] {
                v.push(case(fp8, bs, 29, fused, seed));
                seed += 1;
            }
        }
        if full {
            v.push(case(fp8, 64, 3000, true, seed));
            seed += 1;
        }
    }
    v
}

fn host<T>(v: &[T]) -> DeviceBytes<'_> {
    // SAFETY: the vector outlives the (synchronous) emulated call.
    unsafe { DeviceBytes::from_raw(v.as_ptr() as u64, std::mem::size_of_val(v)) }
}

/// The planned launches executed on the CPU, every format, page size and input form.
#[test]
fn emulated_mla_writes_match_reference() {
    for c in cases(false) {
        let mut cache = c.poison.clone();
        let scale = [c.scale];
        // SAFETY: host memory, ours for the call.
        let dst = unsafe { DeviceBytesMut::from_raw(cache.as_mut_ptr() as u64, cache.len()) };
        let op = c.op(
            host(&c.input),
            host(&c.k_pe_separate),
            dst,
            host(&c.slots),
            host(&scale),
        );
        // SAFETY: every view is live host memory of its length.
        unsafe { kvio::emulate::update_mla(&op) }.unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_same(&c.name, &cache, &c.expected());
    }
}

/// The same on the GPU, with the error word, plus a prefill-size case per format.
#[test]
fn gpu_mla_writes_match_reference() {
    let Some(g) = kvio_suite::gpu("MLA writes") else {
        return;
    };
    let stream = g.stream();
    let errors = DeviceErrors::new().unwrap();
    let all = cases(true);
    for c in &all {
        let (input, pe, slots) = (upload(&c.input), upload(&c.k_pe_separate), upload(&c.slots));
        let scale = upload(&[c.scale]);
        let mut cache = upload(&c.poison);
        errors.reset(StreamRef::from(&stream)).unwrap();
        let op = c
            .op(
                DeviceBytes::of(&input),
                DeviceBytes::of(&pe),
                DeviceBytesMut::of(&mut cache),
                DeviceBytes::of(&slots),
                DeviceBytes::of(&scale),
            )
            .errors(&errors);
        g.kv.update_mla(&op, stream.sref())
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_same(&c.name, &download(&cache, &stream), &c.expected());
        let want = ErrorCounts {
            bad_slots: c.bad_slots,
            ..Default::default()
        };
        assert_eq!(errors.read(stream.sref()).unwrap(), want, "{}", c.name);
    }
    println!("{} MLA writes bit-exact", all.len());
}

/// Widths that do not add up, several heads, a V scale: typed errors before launch.
#[test]
fn mla_arguments_are_checked() {
    let c = case(Some(Fp8::E4m3), 16, 5, false, 1);
    let mut cache = c.poison.clone();
    let scale = [1.0f32, 2.0];
    // SAFETY: host memory; every op below is refused before touching it.
    let dst = unsafe { DeviceBytesMut::from_raw(cache.as_mut_ptr() as u64, cache.len()) };
    let sc = host(&scale).slice(0, 4).unwrap();
    let good = c.op(
        host(&c.input),
        host(&c.k_pe_separate),
        dst,
        host(&c.slots),
        sc,
    );
    let refused = |op: MlaUpdate<'_>, name: &str| {
        // SAFETY: as above.
        match unsafe { kvio::emulate::update_mla(&op) } {
            Err(kvio::Error::InvalidArgument { name: n, .. }) if n == name => {}
            other => panic!("{name}: expected InvalidArgument naming it, got {other:?}"),
        }
    };
    let mut narrow = good;
    narrow.k_pe_layout.head_dim = ROPE - 1;
    refused(narrow, "k_pe_layout");
    let mut heads = good;
    heads.layout.num_heads = 2;
    refused(heads, "layout");
    let q = good.quantize.unwrap();
    let two = Quantize {
        v_scale: Some(Scale::PerTensor(sc)),
        ..q
    };
    refused(
        MlaUpdate {
            quantize: Some(two),
            ..good
        },
        "quantize",
    );
    let per_head = Quantize {
        k_scale: Scale::PerHead(host(&scale)),
        ..q
    };
    refused(
        MlaUpdate {
            quantize: Some(per_head),
            ..good
        },
        "quantize",
    );
    // SAFETY: as above (writes `cache`, which is ours).
    unsafe { kvio::emulate::update_mla(&good) }.unwrap();
}
