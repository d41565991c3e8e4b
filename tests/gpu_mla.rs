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
    /// `None`: bf16 copied; else `src` quantized to this format.
    fp8: Option<Fp8>,
    /// Input element type (bf16 when copying).
    src: SrcType,
    /// Latent and rope widths (elements; `LORA` and `ROPE` but in the shape cases).
    lora: usize,
    rope: usize,
    t: usize,
    /// kv_c and k_pe are views of one `[T, lora + rope + pad]` input (vLLM splits one tensor).
    fused_input: bool,
    /// Padding elements after each input row: 8 keeps rows 16-byte aligned, an odd count
    /// leaves element-sized accesses only (a row then takes several rounds of its group's
    /// loads, or is converted element by element).
    pad: usize,
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
    padded_case(fp8, bs, t, fused_input, 8, seed)
}

/// Input elements of `ty`: `bf16s`, as f16 (the same values), or as f32 (the bf16 values with
/// random low mantissa bits; any bit pattern where `bf16s` has one).
fn elements(ty: SrcType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let b = bf16s(n, rng);
    b.chunks_exact(2)
        .flat_map(|h| {
            let hi = u16::from_le_bytes([h[0], h[1]]) as u32;
            let x = f32::from_bits(hi << 16 | (rng.next_u64() as u32 & 0xffff));
            match ty {
                SrcType::Bf16 => h.to_vec(),
                SrcType::F16 => half::f16::from_f32(x).to_bits().to_le_bytes().to_vec(),
                SrcType::F32 => x.to_bits().to_le_bytes().to_vec(),
            }
        })
        .collect()
}

fn padded_case(
    fp8: Option<Fp8>,
    bs: usize,
    t: usize,
    fused_input: bool,
    pad: usize,
    seed: u64,
) -> Case {
    let shape = (SrcType::Bf16, LORA, ROPE);
    shaped_case(fp8, shape, bs, t, fused_input, pad, seed)
}

/// A case of `src` elements, `lora + rope` wide.
fn shaped_case(
    fp8: Option<Fp8>,
    (src, lora, rope): (SrcType, usize, usize),
    bs: usize,
    t: usize,
    fused_input: bool,
    pad: usize,
    seed: u64,
) -> Case {
    let mut rng = Rng::new(seed);
    let e = if fp8.is_some() { 1 } else { 2 };
    let nb = (2 * t).max(64).div_ceil(bs);
    let layout = PagedLayout::nhd(nb, bs, 1, lora + rope, e);
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
    let row = lora + rope + pad; // input rows carry `pad` padding elements
    let ext = layout.extent("cache").unwrap() as usize;
    Case {
        name: format!(
            "{} {lora}+{rope} bs={bs} T={t}{} pad={pad}",
            fp8.map_or("bf16".to_string(), |f| format!("{src:?}->{f:?}")),
            if fused_input { " fused input" } else { "" }
        ),
        fp8,
        src,
        lora,
        rope,
        t,
        fused_input,
        pad,
        input: elements(src, t * row, &mut rng),
        k_pe_separate: elements(src, t * rope, &mut rng),
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
        let (e, row) = (self.src.bytes(), self.lora + self.rope + self.pad);
        let mut lk = TokenLayout::contiguous(self.t, 1, self.lora, e);
        let mut lp = TokenLayout::contiguous(self.t, 1, self.rope, e);
        if self.fused_input {
            lk.token_stride = row;
            lp.token_stride = row;
            (lk, lp, self.lora * e)
        } else {
            lk.token_stride = row; // kv_c still a view of the padded rows
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
                    let q = reference::quantize_rows(src, l, self.src, f, &[self.scale]);
                    (q, TokenLayout::contiguous(self.t, 1, width, 1))
                }
                None => (src.to_vec(), *l),
            };
            let mut c = self.layout;
            c.head_dim = width;
            c.piece_elems = width;
            c.piece_stride = width;
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
        part(&self.input, &lk, self.lora, 0, &mut want);
        part(pe_src, &lp, self.rope, self.lora, &mut want);
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
            Some(f) => op.quantize(Quantize::new(self.src, f, Scale::PerTensor(scale))),
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
        // Odd padding: 2-byte accesses, several rounds of loads per row.
        v.push(padded_case(fp8, 16, 29, true, 1, seed));
        seed += 1;
        if full {
            v.push(case(fp8, 64, 3000, true, seed));
            seed += 1;
        }
    }
    // Quantizing rows (`kvio_update_rows_convert`) from every source type: decode sizes (a
    // group of several warps per row), prefill sizes (a row in one round of loads), a wide
    // latent part (several rounds), unaligned rows (element by element).
    for src in [SrcType::Bf16, SrcType::F16, SrcType::F32] {
        for (fp8, t, lora, pad) in [
            (Fp8::E4m3, 3, LORA, 8),
            (Fp8::E5m2, 29, LORA, 8),
            (Fp8::E4m3, 29, 2048, 8),
            (Fp8::E5m2, 29, LORA, 3),
        ] {
            v.push(shaped_case(
                Some(fp8),
                (src, lora, ROPE),
                16,
                t,
                seed % 2 == 0,
                pad,
                seed,
            ));
            seed += 1;
        }
    }
    v
}

fn host<T>(v: &[T]) -> DeviceBytes<'_> {
    // SAFETY: the vector outlives the (synchronous) emulated call.
    unsafe { DeviceBytes::from_raw(v.as_ptr() as u64, std::mem::size_of_val(v)) }
}

/// Runs `c`'s planned launches on the CPU and compares the cache with the reference's.
fn emulate_case(c: &Case) {
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
    let counts = unsafe { kvio::emulate::update_mla_counted(&op) }
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_same(&c.name, &cache, &c.expected());
    let want = ErrorCounts {
        bad_slots: c.bad_slots,
        ..Default::default()
    };
    assert_eq!(counts, want, "{}", c.name);
}

/// The planned launches executed on the CPU, every format, page size and input form.
#[test]
fn emulated_mla_writes_match_reference() {
    for c in cases(false) {
        emulate_case(&c);
    }
}

proptest::proptest! {
    // `PROPTEST_CASES` cases (default 96); failures are kept in proptest-regressions/.
    #![proptest_config(proptest::test_runner::Config::with_cases(kvio_suite::proptest_cases(96)))]

    /// Random MLA writes in emulation: bf16 rows copied, or bf16/f16/f32 rows quantized to
    /// either fp8 format; latent parts of 1 to 600 and rope parts of 1 to 80 elements; input
    /// rows padded by 0 to 9 elements (aligned or not), fused or separate; any page size
    /// listed; 1 to 120 tokens with skipped and out-of-range slots; bit-exact against the
    /// reference.
    #[test]
    fn mla_writes_emulated_property(
        fp8 in proptest::sample::select(vec![None, Some(Fp8::E4m3), Some(Fp8::E5m2)]),
        src in proptest::sample::select(vec![SrcType::Bf16, SrcType::F16, SrcType::F32]),
        lora in 1usize..=600,
        rope in 1usize..=80,
        bs in proptest::sample::select(vec![1usize, 2, 3, 16, 64, 128]),
        t in 1usize..120,
        fused: bool,
        pad in 0usize..=9,
        seed: u64,
    ) {
        // Copies keep the bf16 element size; only quantizing writes take other sources.
        let src = if fp8.is_some() { src } else { SrcType::Bf16 };
        emulate_case(&shaped_case(fp8, (src, lora, rope), bs, t, fused, pad, seed));
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

// ---- MLA pools: one part per layer, moved between layouts -----------------------------------

use kvio::reference::PoolImage;
use kvio::{BlockCopy, BlockMap, BlockPool, PoolMemory};
use kvio_suite::{random_pairs, Mem};

const POOL_LAYERS: usize = 3;
const POOL_BS: usize = 16;

/// The one-part pools of these tests over `mem`: cross-layer `(NB, L, bs, 576)` or layer-first
/// `(L, NB, bs, 576)` (each layer's cache after the previous one), bf16.
fn mla_pool<'a, M: PoolMemory<'a>>(mem: M, nb: usize, cross: bool) -> BlockPool<'a, M::Access> {
    let row = LORA + ROPE;
    if cross {
        BlockPool::cross_layer_one_part(mem, nb, POOL_LAYERS, POOL_BS, 1, row, 2)
    } else {
        let layout = PagedLayout::nhd(nb, POOL_BS, 1, row, 2);
        let cache = layout.extent("layout").unwrap() as usize;
        BlockPool::strided(mem, cache, 0, POOL_LAYERS, 1, layout)
    }
}

fn pool_bytes(nb: usize) -> usize {
    nb * POOL_LAYERS * POOL_BS * (LORA + ROPE) * 2
}

/// Offload (device cross-layer → pinned cross-layer) then onload into a layer-first device
/// pool, on the GPU (default backend: kvio's scratch takes the host maps), each step compared
/// with the reference.
#[test]
fn gpu_mla_pools_offload_and_onload() {
    let Some(g) = kvio_suite::gpu("MLA pools") else {
        return;
    };
    let stream = g.stream();
    let (nb_dev, nb_host) = (24, 40);
    let mut rng = Rng::new(5);
    let mut dev = Mem::new(false, pool_bytes(nb_dev));
    let mut host = Mem::new(true, pool_bytes(nb_host));
    let mut back = Mem::new(false, pool_bytes(nb_dev));
    let (dev0, host0, back0) = (
        random_bytes(pool_bytes(nb_dev), 1),
        random_bytes(pool_bytes(nb_host), 2),
        random_bytes(pool_bytes(nb_dev), 3),
    );
    dev.fill(&dev0);
    host.fill(&host0);
    back.fill(&back0);
    let off = random_pairs(17, nb_dev, nb_host, 5, &mut rng);
    let on = random_pairs(13, nb_host, nb_dev, 5, &mut rng);
    let image = |nb, cross| {
        // SAFETY: a description only.
        PoolImage::of(&mla_pool(
            unsafe { DeviceBytes::from_raw(0, pool_bytes(nb)) },
            nb,
            cross,
        ))
        .unwrap()
    };

    let op = BlockCopy::new(
        mla_pool(dev.bytes(), nb_dev, true),
        mla_pool(host.bytes_mut(), nb_host, true),
        BlockMap::Host(&off),
    );
    g.kv.copy_blocks(&op, stream.sref()).unwrap();
    stream.synchronize().unwrap();
    let mut want_host = host0.clone();
    reference::copy_blocks(
        &image(nb_dev, true),
        &dev0,
        &image(nb_host, true),
        &mut want_host,
        &off,
    );
    assert_same("MLA offload", &host.read(), &want_host);

    let op = BlockCopy::new(
        mla_pool(host.bytes(), nb_host, true),
        mla_pool(back.bytes_mut(), nb_dev, false),
        BlockMap::Host(&on),
    );
    g.kv.copy_blocks(&op, stream.sref()).unwrap();
    stream.synchronize().unwrap();
    let mut want_back = back0.clone();
    reference::copy_blocks(
        &image(nb_host, true),
        &want_host,
        &image(nb_dev, false),
        &mut want_back,
        &on,
    );
    assert_same("MLA onload into layer-first", &back.read(), &want_back);
}

/// The same moves in the CPU emulation (cross-layer → cross-layer → layer-first).
#[test]
fn emulated_mla_pools_move_between_layouts() {
    let (nb_a, nb_b) = (12, 20);
    let mut rng = Rng::new(9);
    let a0 = random_bytes(pool_bytes(nb_a), 11);
    let mut b = random_bytes(pool_bytes(nb_b), 12);
    let mut c = random_bytes(pool_bytes(nb_a), 13);
    let (b0, c0) = (b.clone(), c.clone());
    let ab = random_pairs(9, nb_a, nb_b, 4, &mut rng);
    let bc = random_pairs(7, nb_b, nb_a, 4, &mut rng);
    let raw_mut = |v: &mut Vec<u8>| {
        // SAFETY: host memory, ours for the emulated call.
        unsafe { DeviceBytesMut::from_raw(v.as_mut_ptr() as u64, v.len()) }
    };
    let op = BlockCopy::new(
        mla_pool(host(&a0), nb_a, true),
        mla_pool(raw_mut(&mut b), nb_b, true),
        BlockMap::Host(&ab),
    );
    // SAFETY: every view is live host memory of its length.
    unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
    let image = |v: &[u8], nb, cross| PoolImage::of(&mla_pool(host(v), nb, cross)).unwrap();
    let mut want_b = b0.clone();
    reference::copy_blocks(
        &image(&a0, nb_a, true),
        &a0,
        &image(&b0, nb_b, true),
        &mut want_b,
        &ab,
    );
    assert_same("cross-layer to cross-layer", &b, &want_b);
    let op = BlockCopy::new(
        mla_pool(host(&b), nb_b, true),
        mla_pool(raw_mut(&mut c), nb_a, false),
        BlockMap::Host(&bc),
    );
    // SAFETY: as above.
    unsafe { kvio::emulate::copy_blocks(&op) }.unwrap();
    let mut want_c = c0.clone();
    reference::copy_blocks(
        &image(&b, nb_b, true),
        &b,
        &image(&c0, nb_a, false),
        &mut want_c,
        &bc,
    );
    assert_same("cross-layer to layer-first", &c, &want_c);
}
