//! The 8-bit kernels themselves: every variant compiles within WebGPU's default limits,
//! validates and lays out its segment as the host writes it, the registry compiles each once,
//! and the kernels find the nearest codes.

use crate::gpu::kernel::tests::{members, resource_bindings};
use crate::gpu::q8::shader::Requantize;
use crate::gpu::q8::{compile, Variant};
use crate::q8::Q8States;
use crate::{Adam, Algorithm, DType, GpuContext, Optimizer, Sgd, StateStorage, Tensor};

/// Every 8-bit kernel variant, clipped or not, is created on a device with exactly
/// WebGPU's default limits: its storage bindings (parameters, gradients, the state arena,
/// the code tables and the clip buffer) stay within the 8 a stage may bind.
#[test]
fn every_8bit_kernel_variant_compiles_within_webgpus_default_limits() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let descriptor =
        wgpu::DeviceDescriptor { required_limits: wgpu::Limits::default(), ..Default::default() };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&descriptor)).unwrap_or_else(|e| panic!("{e}"));
    let ctx = GpuContext::from_device(device, queue);
    assert_eq!(ctx.device().limits().max_storage_buffers_per_shader_stage, 8);
    let algorithms: [Algorithm; 4] = [
        Adam::adamw().into(),
        Sgd { momentum: 0.9, nesterov: true, ..Sgd::default() }.into(),
        crate::AdEMAMix::default().into(),
        crate::Adan::default().into(),
    ];
    for algorithm in algorithms {
        for (quantized, serial, requantize) in STORED {
            for (grad_in_params, clip) in [(false, false), (false, true), (true, true)] {
                let switches = crate::q8::kernel_step(&algorithm, 1).switches();
                let variant = Variant {
                    switches,
                    kinds: algorithm.state_kinds().to_vec(),
                    quantized,
                    grad_in_params,
                    serial,
                    clip,
                    block_size: crate::q8::BLOCK_SIZE as u32,
                    requantize,
                    restart_non_finite: quantized && crate::q8::restarts_non_finite(&switches),
                };
                compile(&ctx, &variant).unwrap_or_else(|e| panic!("{variant:?}: {e}"));
            }
        }
    }
}

/// The ways a state is stored and stepped: 8-bit with a workgroup or an invocation per
/// block, each finding codes by a table or by arithmetic, and f32.
const STORED: [(bool, bool, Requantize); 5] = [
    (true, false, Requantize::Table),
    (true, false, Requantize::Arithmetic),
    (true, true, Requantize::Table),
    (true, true, Requantize::Arithmetic),
    (false, false, Requantize::Table),
];

/// Every variant's `(switches, kinds)` the options allow: Adan (four states), AdEMAMix
/// (three), Adam and AdamW (two), SGD with momentum, Nesterov or not (one), plain SGD (none).
fn algorithms_of_every_state_count() -> [Algorithm; 7] {
    [
        crate::Adan::default().into(),
        crate::AdEMAMix::default().into(),
        Adam::default().into(),
        Adam::adamw().into(),
        Sgd { momentum: 0.9, ..Sgd::default() }.into(),
        Sgd { momentum: 0.9, nesterov: true, ..Sgd::default() }.into(),
        Sgd::default().into(),
    ]
}

/// Every 8-bit variant's source parses and validates, binds every resource at the number
/// `gpu::kernel::binding` gives it, and the table's structs lay out in
/// WGSL as `layout::Segment` and `TableHead` do in Rust: each field at the offset
/// `#[repr(C)]` gives it, and the table's rows right after its head.
#[test]
fn every_8bit_variant_validates_and_its_segment_lays_out_as_the_rust_one() {
    use crate::gpu::blockwise::layout::Segment;
    use crate::gpu::kernel::TableHead;
    use crate::gpu::kernel::{binding, TABLE_BYTES};
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let rust_members = |fields: &[&str], offsets: &[usize]| -> Vec<(String, u32)> {
        fields.iter().zip(offsets).map(|(f, o)| (f.to_string(), *o as u32)).collect()
    };
    let rust = rust_members(Segment::FIELDS, Segment::OFFSETS);
    let head = rust_members(TableHead::FIELDS, TableHead::OFFSETS);
    let mut checked = 0;
    for algorithm in algorithms_of_every_state_count() {
        let kinds = algorithm.state_kinds().to_vec();
        let stored: &[(bool, bool, Requantize)] = if kinds.is_empty() { &STORED[4..] } else { &STORED };
        for &(quantized, serial, requantize) in stored {
            for grad_in_params in [false, true] {
                for clip in [false, true] {
                    let switches = crate::q8::kernel_step(&algorithm, 1).switches();
                    let variant = Variant {
                        switches,
                        kinds: kinds.clone(),
                        quantized,
                        grad_in_params,
                        serial,
                        clip,
                        block_size: crate::q8::BLOCK_SIZE as u32,
                        requantize,
                        restart_non_finite: quantized && crate::q8::restarts_non_finite(&switches),
                    };
                    let source = crate::gpu::q8::shader::compose(&variant);
                    let module = naga::front::wgsl::parse_str(&source)
                        .unwrap_or_else(|e| panic!("{variant:?}: {}\n{source}", e.emit_to_string(&source)));
                    validator.validate(&module).unwrap_or_else(|e| panic!("{variant:?}: {e:?}\n{source}"));
                    assert_eq!(members(&module, "Segment"), rust, "{variant:?}");
                    assert_eq!(members(&module, "TableHead"), head, "{variant:?}");
                    let mut expected = vec![
                        ("hp_base", (binding::GROUP_SCALARS, binding::HYPER)),
                        ("params", (binding::GROUP_TABLE, binding::Q8_PARAMS)),
                        ("state", (binding::GROUP_TABLE, binding::Q8_STATE)),
                        ("table", (binding::GROUP_TABLE, binding::TABLE)),
                    ];
                    if !grad_in_params {
                        expected.push(("grads", (binding::GROUP_TABLE, binding::Q8_GRADS)));
                    }
                    if quantized {
                        expected.push(("tables", (binding::GROUP_TABLE, binding::Q8_CODE_TABLES)));
                    }
                    if clip {
                        expected.push(("clip_state", (binding::GROUP_SCALARS, binding::CLIP)));
                    }
                    expected.sort();
                    let expected: Vec<(String, (u32, u32))> =
                        expected.into_iter().map(|(name, at)| (name.to_string(), at)).collect();
                    assert_eq!(resource_bindings(&module), expected, "{variant:?}");
                    let table = [("head".to_string(), 0), ("rows".to_string(), 16)];
                    assert_eq!(members(&module, "Table"), table, "{variant:?}");
                    let size = |name: &str| {
                        let found = module.types.iter().find(|(_, ty)| ty.name.as_deref() == Some(name));
                        found.map(|(_, ty)| ty.inner.size(module.to_ctx())).unwrap_or_default()
                    };
                    assert_eq!(size("Segment") as usize, std::mem::size_of::<Segment>(), "{variant:?}");
                    assert_eq!(size("Table") as u64, TABLE_BYTES, "{variant:?}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 6 * 5 * 4 + 4, "variants checked");
}

/// The WGSL reader of a segment takes each field from the lanes where `#[repr(C)]` puts it
/// in the words the host writes: the vec2 and vec4 fields from pairs and rows of lanes.
#[test]
fn a_segment_is_read_from_the_rows_its_words_fill() {
    use crate::gpu::blockwise::layout::{Segment, ENTRY_ROWS};
    let segment = Segment {
        n: 1,
        blocks: 2,
        first_group: 3,
        groups: 4,
        param: 5,
        grad: 6,
        reserved: [0; 2],
        values: [7, 8, 9, 0],
        scale: [10, 11, 12, 0],
    };
    assert_eq!(segment.words(), [1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 0, 10, 11, 12, 0]);
    assert_eq!(ENTRY_ROWS, 4);
    assert_eq!(
        Segment::reader_wgsl("segment_at"),
        "fn segment_at(r: u32) -> Segment {\n    \
         let r0 = table.rows[r];\n    let r1 = table.rows[r + 1u];\n    let r2 = table.rows[r + 2u];\n    \
         let r3 = table.rows[r + 3u];\n    \
         return Segment(r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.zw, r2.xyzw, r3.xyzw);\n}\n"
    );
}

/// Two 8-bit optimizers on one context share its registry: the second compiles nothing,
/// and the context's count includes the 8-bit pipelines.
#[test]
fn two_8bit_optimizers_on_one_context_compile_their_pipelines_once() {
    // A context of its own: its registry starts empty.
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ctx.compiled_pipelines(), 0);
    let n = 5000u64;
    let initial: Vec<f64> = (0..n).map(|i| (i % 100) as f64 * 1e-2 - 0.5).collect();
    let options = Optimizer::builder().state_storage(StateStorage::Q8(Q8States::default()));
    let mut compiled = Vec::new();
    for _ in 0..2 {
        let p = ctx.upload("param", &initial, DType::F32);
        let g = ctx.upload("grad", &initial, DType::F32);
        let mut opt = options
            .clone()
            .build(&ctx, Adam::adamw(), std::slice::from_ref(&p))
            .unwrap_or_else(|e| panic!("{e}"));
        opt.step(std::slice::from_ref(&g)).unwrap_or_else(|e| panic!("{e}"));
        compiled.push(ctx.compiled_pipelines());
    }
    // One tensor of 8-bit AdamW state: one variant, compiled by the first optimizer only.
    assert_eq!(compiled, [1, 1], "pipelines after the first optimizer's step and the second's");
}

/// The nearest codes of `values` (a multiple of four) in the signed or the unsigned map as
/// the kernels find them `requantize`'s way (`shaders/q8_nearest.wgsl`'s `code` or
/// `codes_arith`), on the default adapter.
fn kernel_codes(ctx: &GpuContext, signed: bool, requantize: Requantize, values: &[f32]) -> Vec<u8> {
    assert_eq!(values.len() % 4, 0);
    let words = values.len() / 4;
    let tables = ctx.upload_bytes(
        "code tables",
        bytemuck::cast_slice(&crate::gpu::q8::shader::tables_words()),
        DType::F32,
    );
    let input = ctx.upload_f32("values", values);
    let output = ctx.zeros("codes", words as u64, DType::F32);
    let device = ctx.device();
    let pipeline = ctx
        .catch("compiling the probe", || {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("nearest-code probe"),
                source: wgpu::ShaderSource::Wgsl(
                    crate::gpu::q8::shader::nearest_probe(signed, requantize).into(),
                ),
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("nearest-code probe"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let whole = |binding: u32, t: &Tensor| (binding, t.offset, t.offset + 4 * t.len);
    let entries = [whole(0, &tables), whole(1, &input), whole(2, &output)];
    let buffers = [&tables.buffer, &input.buffer, &output.buffer];
    let entries: Vec<wgpu::BindGroupEntry<'_>> = entries
        .iter()
        .zip(buffers)
        .map(|(&(binding, lo, hi), b)| crate::gpu::blockwise::buffer(binding, b, (lo, hi)))
        .collect();
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("nearest-code probe"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        // Workgroups of 64 words, rows of 65535 of them (the probe's indexing).
        let groups = words.div_ceil(64) as u32;
        pass.dispatch_workgroups(groups.min(65_535), groups.div_ceil(65_535), 1);
    }
    ctx.queue().submit([encoder.finish()]);
    ctx.read_bytes(&output).unwrap_or_else(|e| panic!("{e}"))
}

/// The kernels' arithmetic (with its fallback to the table near a switch), and their table,
/// give `nearest_code`'s code, computed on the host, for every 31st f32 bit pattern of
/// [2^-26, 1] and their negatives (a prime stride, as `q8::arith`'s own test walks the
/// range), for each code and each midpoint between codes with its neighbours (ties, and the
/// sign rule's threshold below the code of 0), across each decade's start, and for the
/// special values (-0.0 and tiny negative values among them), in both maps.
#[test]
fn the_kernels_arithmetic_and_table_find_the_nearest_code_of_values_across_the_whole_range() {
    use crate::q8::{nearest_code, signed_map, unsigned_map};
    let ctx = GpuContext::headless_blocking().unwrap_or_else(|e| panic!("{e}"));
    for (signed, map) in [(true, signed_map()), (false, unsigned_map())] {
        let mut values: Vec<f32> = Vec::new();
        for bits in (0x3280_0000u32..=0x3f80_0000).step_by(31) {
            values.extend([f32::from_bits(bits), -f32::from_bits(bits)]);
        }
        for c in map {
            for delta in -3i32..=3 {
                let x = f32::from_bits(c.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        // Every midpoint of neighbouring codes (an exact tie takes the even code) and the
        // sign rule's threshold, each with the values two ulps either side.
        for pair in map.windows(2) {
            let midpoint = (pair[0] + pair[1]) * 0.5;
            for delta in -2i32..=2 {
                let x = f32::from_bits(midpoint.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        for power in -8..=0 {
            let p = 10f32.powi(power);
            for delta in -3000i32..=3000 {
                let x = f32::from_bits(p.to_bits().wrapping_add_signed(delta));
                values.extend([x, -x]);
            }
        }
        values.extend([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 1e-30, -1e-30, f32::MIN_POSITIVE, 1e-45, -1e-45]);
        values.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN]);
        values.resize(values.len().next_multiple_of(4), 0.5);
        let want: Vec<u8> = values.iter().map(|&x| nearest_code(&map, x)).collect();
        for requantize in [Requantize::Arithmetic, Requantize::Table] {
            let codes = kernel_codes(&ctx, signed, requantize, &values);
            assert_eq!(codes.len(), values.len());
            let wrong: Vec<String> = (0..values.len())
                .filter(|&i| codes[i] != want[i])
                .take(10)
                .map(|i| {
                    format!("{:e} ({:#010x}): {}, not {}", values[i], values[i].to_bits(), codes[i], want[i])
                })
                .collect();
            assert!(wrong.is_empty(), "signed {signed}, {requantize:?}: {wrong:#?}");
        }
    }
}
