//! The online problem of Reddi, Kale and Kumar (2018) that Adam fails and AMSGrad solves,
//! run on the GPU: x in [-1, 1], f_t(x) = 1010 x when t mod 101 = 1 and -10 x otherwise.
//! Over each 101 steps the sum is 10 x, so the optimum is x = -1; Adam's short memory of
//! the large, rare gradient lets the many small ones push it to +1.

use wgpu_optim::{Adam, DType, GpuContext, Optimizer, Result, Tensor};

/// The gradient of f_t at step `t`.
pub fn gradient(t: u64) -> f64 {
    if t % 101 == 1 {
        1010.0
    } else {
        -10.0
    }
}

/// One run of the problem.
pub struct Problem {
    /// Adam or AMSGrad and their hyperparameters.
    pub adam: Adam,
    /// Steps to take.
    pub steps: u64,
    /// The step number of the first gradient (1 in the paper, 0 in PaddlePaddle's doc).
    pub first_t: u64,
    /// Project x back onto [-1, 1] after every step.
    pub projected: bool,
    /// Learning rate lr / sqrt(t), the paper's schedule (else constant).
    pub decaying_lr: bool,
}

/// x after every step.
pub fn run(ctx: &GpuContext, problem: &Problem) -> Result<Vec<f64>> {
    let x = ctx.upload("x", &[0.0], DType::F32);
    let grad = ctx.zeros("grad", 1, DType::F32);
    let history = ctx.zeros("history", problem.steps, DType::F32);
    let mut optimizer = Optimizer::builder().build(ctx, problem.adam, std::slice::from_ref(&x))?;
    let projection = Projection::new(ctx, &x);
    for k in 0..problem.steps {
        let t = problem.first_t + k;
        ctx.write(&grad, &[gradient(t)])?;
        if problem.decaying_lr {
            optimizer.set_lr(problem.adam.lr / ((k + 1) as f64).sqrt())?;
        }
        ctx.submit("counterexample step", |encoder| {
            optimizer.record_step(encoder, std::slice::from_ref(&grad))?;
            if problem.projected {
                projection.record(encoder);
            }
            encoder.copy_buffer_to_buffer(&x.buffer, 0, &history.buffer, 4 * k, 4);
            Ok(())
        })?;
    }
    ctx.read(&history)
}

/// The average regret of the points `xs` against the optimum x = -1.
pub fn average_regret(xs: &[f64], first_t: u64) -> f64 {
    // The regret at step t is f_t(x_t) - f_t(-1), with x_t the point before the step.
    let before = std::iter::once(0.0).chain(xs.iter().copied());
    let total: f64 = before.zip(0..xs.len() as u64).map(|(x, k)| gradient(first_t + k) * (x + 1.0)).sum();
    total / xs.len().max(1) as f64
}

/// Clamps x to [-1, 1] on the GPU, so no step needs a round trip to the host.
struct Projection {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
}

impl Projection {
    fn new(ctx: &GpuContext, x: &Tensor) -> Self {
        let device = ctx.device();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("projection onto [-1, 1]"),
            source: wgpu::ShaderSource::Wgsl(
                "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\
                 @compute @workgroup_size(1) fn main() { x[0] = clamp(x[0], -1.0, 1.0); }"
                    .into(),
            ),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("projection"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("projection"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry { binding: 0, resource: x.buffer.as_entire_binding() }],
        });
        Projection { pipeline, bind_group }
    }

    fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
}
