//! Muon (`torch.optim.Muon`): its public vectors on every backend, the refusals, 16-bit
//! parameters and groups against the oracle, and the WGSL matrix product against an f64 one.

mod common;

use std::path::PathBuf;

use wgpu_optim_testkit::conformance::{run_case, Backend, Case, Outcome};

fn vector(name: &str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors").join(name);
    Case::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

const VECTORS: [&str; 2] = ["muon_bf16_rms.safetensors", "muon_f32_tall.safetensors"];

fn passes(case: &Case, backend: Backend) {
    let ctx = matches!(backend, Backend::GpuInPlace | Backend::GpuOutOfPlace).then(common::ctx);
    let report = run_case(case, backend, ctx.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    match report.outcome {
        Outcome::Pass => {}
        other => panic!("{} on {}: {other:?}", case.name, backend.name()),
    }
}

#[test]
fn the_public_vectors_pass_on_the_oracle() {
    for name in VECTORS {
        passes(&vector(name), Backend::Oracle);
    }
}

#[test]
fn the_public_vectors_pass_on_the_cpu_backend() {
    for name in VECTORS {
        passes(&vector(name), Backend::Cpu);
    }
}

#[test]
fn the_public_vectors_pass_on_the_gpu_in_place_and_out_of_place() {
    for name in VECTORS {
        passes(&vector(name), Backend::GpuInPlace);
        passes(&vector(name), Backend::GpuOutOfPlace);
    }
}

/// `a` (`n` x `k`) times `b` (`k` x `m`), row-major, in f64.
fn product_f64(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for p in 0..k {
            for j in 0..m {
                out[i * m + j] += a[i * k + p] * b[p * m + j];
            }
        }
    }
    out
}

#[test]
fn the_wgsl_matmul_matches_an_f64_product_at_odd_sizes_with_a_transposed_operand() {
    use wgpu_optim::matmul::{Matmul, MatrixView, Product};
    let ctx = common::ctx();
    let mut rng = common::Rng::new(31);
    // Sizes off the 64 x 64 x 16 tiles; a batch of 2; B given as its transpose (k x n
    // stored n x k), read through its strides; C = 0.5 A B + 2 D.
    let (m, n, k, batch) = (67usize, 45usize, 33usize, 2usize);
    let a = rng.vec(batch * m * k, 1.0);
    let bt = rng.vec(batch * n * k, 1.0);
    let d = rng.vec(batch * m * n, 1.0);
    let round = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| f64::from(*x as f32)).collect() };
    let (a, bt, d) = (round(&a), round(&bt), round(&d));
    let mut data = [a.clone(), bt.clone(), d.clone(), vec![0.0; batch * m * n]].concat();
    data.push(0.0);
    let tensor = ctx.upload("data", &data, wgpu_optim::DType::F32);
    let (a_at, b_at, d_at, c_at) =
        (0, batch * m * k, batch * (m * k + n * k), batch * (m * k + n * k + m * n));
    let product = Product {
        batch: batch as u32,
        add: Some((2.0, MatrixView::row_major(d_at as u32, m as u32, n as u32))),
        alpha: 0.5,
        ..Product::plain(
            m as u32,
            n as u32,
            k as u32,
            MatrixView::row_major(a_at as u32, m as u32, k as u32),
            MatrixView::row_major(b_at as u32, n as u32, k as u32).transposed(),
            MatrixView::row_major(c_at as u32, m as u32, n as u32),
        )
    };
    let matmul = Matmul::new(&ctx, &tensor, &[product]).unwrap();
    ctx.submit("matmul", |encoder| {
        matmul.record(encoder);
        Ok(())
    })
    .unwrap();
    let got = ctx.read(&tensor).unwrap();
    for z in 0..batch {
        let az = &a[z * m * k..(z + 1) * m * k];
        let btz = &bt[z * n * k..(z + 1) * n * k];
        let mut b = vec![0.0; k * n];
        for j in 0..n {
            for p in 0..k {
                b[p * n + j] = btz[j * k + p];
            }
        }
        let ab = product_f64(az, &b, m, k, n);
        for e in 0..m * n {
            let want = 0.5 * ab[e] + 2.0 * d[z * m * n + e];
            let got = got[c_at + z * m * n + e];
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "matrix {z} element {e}: {got} != {want}"
            );
        }
    }
    // Nothing past the output was written.
    assert_eq!(got[data.len() - 1], 0.0);
    assert_eq!(&got[..c_at], &data[..c_at]);
}
