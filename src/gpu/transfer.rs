//! Moving tensors between host and device: what a trainer needs to fill a tensor from the
//! host and read it back, and what the tests, examples and checkpoints use.
//!
//! The whole set, on [`GpuContext`]: [`upload`](GpuContext::upload) (any dtype, from f64
//! values rounded once), [`upload_f32`](GpuContext::upload_f32) (f32 data as it is, the
//! common case), [`upload_bytes`](GpuContext::upload_bytes) and
//! [`zeros`](GpuContext::zeros) make tensors; [`write`](GpuContext::write) and
//! [`write_bytes`](GpuContext::write_bytes) overwrite one; [`read`](GpuContext::read)
//! (widened exactly to f64), [`read_f32`](GpuContext::read_f32) and
//! [`read_bytes`](GpuContext::read_bytes) read one back; the `_async` forms never block (a
//! browser's main thread). [`submit`](GpuContext::submit) records and submits with wgpu's
//! errors caught.

use wgpu::util::DeviceExt;

use crate::gpu::plan::{check_extent, Arg};
use crate::gpu::GpuContext;
use crate::{DType, Error, ReadbackFailure, Result, Tensor};

/// The usages of buffers the crate creates: bindable, and copyable both ways.
pub const TENSOR_USAGES: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

impl GpuContext {
    /// Records with `record` into a fresh command encoder and submits it; wgpu validation
    /// and out-of-memory errors come back as [`Error::Gpu`]. Nothing is submitted if
    /// `record` fails.
    pub fn submit(
        &self,
        label: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<()>,
    ) -> Result<wgpu::SubmissionIndex> {
        let mut encoder =
            self.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        record(&mut encoder)?;
        self.catch(&format!("submitting {label}"), || self.queue().submit([encoder.finish()]))
    }

    /// A new buffer holding `bytes` with [`TENSOR_USAGES`], as one tensor of `dtype`: for
    /// data already in its dtype's bytes (f16 or bf16 weights from a model file).
    pub fn upload_bytes(&self, label: &str, bytes: &[u8], dtype: DType) -> Tensor {
        let buffer = self.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytes,
            usage: TENSOR_USAGES,
        });
        Tensor::new(&buffer, 0, bytes.len() as u64 / dtype.size(), dtype)
    }

    /// A new tensor of `dtype` holding `values`, each rounded once to `dtype`.
    pub fn upload(&self, label: &str, values: &[f64], dtype: DType) -> Tensor {
        self.upload_bytes(label, &dtype.encode(values), dtype)
    }

    /// Overwrites a tensor with `values`, each rounded once to its dtype (see
    /// [`Self::write_bytes`]).
    pub fn write(&self, tensor: &Tensor, values: &[f64]) -> Result<()> {
        self.write_bytes(tensor, &tensor.dtype.encode(values))
    }

    /// Reads a tensor of any dtype back to the host, widened exactly to f64.
    pub fn read(&self, tensor: &Tensor) -> Result<Vec<f64>> {
        Ok(tensor.dtype.decode(&self.read_bytes(tensor)?))
    }

    /// [`Self::read`] as a future, for callers that must not block (a browser's main thread).
    pub async fn read_async(&self, tensor: &Tensor) -> Result<Vec<f64>> {
        Ok(tensor.dtype.decode(&self.read_bytes_async(tensor).await?))
    }

    /// A new f32 tensor holding `values` as they are: a trainer's data is usually f32, and
    /// this skips [`Self::upload`]'s f64 round trip.
    pub fn upload_f32(&self, label: &str, values: &[f32]) -> Tensor {
        self.upload_bytes(label, bytemuck::cast_slice(values), DType::F32)
    }

    /// A new zero-filled tensor of `len` elements (wgpu zero-initializes new buffers).
    pub fn zeros(&self, label: &str, len: u64, dtype: DType) -> Tensor {
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len * dtype.size()).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT),
            usage: TENSOR_USAGES,
            mapped_at_creation: false,
        });
        Tensor::new(&buffer, 0, len, dtype)
    }

    /// Overwrites a tensor's elements from the host (`queue.write_buffer`, landing at the next
    /// submit). A 16-bit tensor that starts or ends inside a 4-byte word has that word's
    /// other half read back first (which needs `COPY_SRC`), since queue writes are whole words.
    /// Refused before anything is written if `bytes` is not the tensor's size or the tensor
    /// cannot be written ([`Error::BadRange`], [`Error::MissingUsage`]). That readback blocks:
    /// in wasm32 builds such a write returns [`Error::Readback`] (nothing written); use
    /// [`Self::write_bytes_async`].
    pub fn write_bytes(&self, tensor: &Tensor, bytes: &[u8]) -> Result<()> {
        let Some(words) = self.begin_write(tensor, bytes)? else { return Ok(()) };
        let patched = self.read_bytes(&words)?;
        self.finish_write(tensor, bytes, &words, patched);
        Ok(())
    }

    /// [`Self::write_bytes`] for callers that must not block: a 16-bit tensor that starts or
    /// ends inside a 4-byte word has that word read back with [`Self::read_bytes_async`]
    /// (the blocking form cannot read back in a browser).
    pub async fn write_bytes_async(&self, tensor: &Tensor, bytes: &[u8]) -> Result<()> {
        let Some(words) = self.begin_write(tensor, bytes)? else { return Ok(()) };
        let patched = self.read_bytes_async(&words).await?;
        self.finish_write(tensor, bytes, &words, patched);
        Ok(())
    }

    /// [`Self::write`] for callers that must not block (see [`Self::write_bytes_async`]).
    pub async fn write_async(&self, tensor: &Tensor, values: &[f64]) -> Result<()> {
        self.write_bytes_async(tensor, &tensor.dtype.encode(values)).await
    }

    /// Checks a write of `bytes` into `tensor`; writes it at once when it covers whole words
    /// (`None`), else returns the words it touches, to be read back and patched.
    fn begin_write(&self, tensor: &Tensor, bytes: &[u8]) -> Result<Option<Tensor>> {
        if bytes.len() as u64 != tensor.byte_len() {
            return Err(Error::BadRange {
                argument: "bytes".into(),
                problem: format!("{} bytes given for a tensor of {} bytes", bytes.len(), tensor.byte_len()),
            });
        }
        check_writable(&Arg::new("tensor", tensor))?;
        let range = tensor.byte_range();
        let start = range.start - range.start % 4;
        let end = range.end.next_multiple_of(4);
        if start == range.start && end == range.end {
            self.queue().write_buffer(&tensor.buffer, tensor.offset, bytes);
            return Ok(None);
        }
        Ok(Some(Tensor::new(&tensor.buffer, start, (end - start) / 2, crate::DType::F16)))
    }

    /// Writes `bytes` into `words` (read back as `patched`) at `tensor`'s place.
    fn finish_write(&self, tensor: &Tensor, bytes: &[u8], words: &Tensor, mut patched: Vec<u8>) {
        let at = (tensor.byte_range().start - words.offset) as usize;
        patched[at..at + bytes.len()].copy_from_slice(bytes);
        self.queue().write_buffer(&tensor.buffer, words.offset, &patched);
    }

    /// Copies a tensor's bytes back to the host, waiting for all submitted work first.
    /// Refused before any GPU work if the tensor cannot be read back ([`Error::BadRange`],
    /// [`Error::MissingUsage`]): copies cover whole 4-byte words, so the word holding its last
    /// byte must exist.
    ///
    /// This blocks the thread until the GPU is done, which a browser's main thread cannot
    /// do: in wasm32 builds it returns [`Error::Readback`]; use [`Self::read_bytes_async`].
    pub fn read_bytes(&self, tensor: &Tensor) -> Result<Vec<u8>> {
        let Some(readback) = self.begin_readback(tensor)? else { return Ok(Vec::new()) };
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Readback {
                cause: ReadbackFailure::WouldBlock { call: "read_bytes".into(), instead: "read_bytes_async" },
            });
        }
        self.device()
            .poll(wgpu::PollType::Wait { submission_index: Some(readback.submission.clone()), timeout: None })
            .map_err(|e| Error::Readback { cause: ReadbackFailure::Poll { message: e.to_string() } })?;
        let mapped = pollster::block_on(readback.mapped.receive());
        readback.finish(mapped).map(|all| all.into_iter().next().unwrap_or_default())
    }

    /// [`Self::read_bytes`] as a future, for callers that must not block (a browser's event
    /// loop maps the buffer; natively the device is polled until the copy is done first).
    pub async fn read_bytes_async(&self, tensor: &Tensor) -> Result<Vec<u8>> {
        let Some(readback) = self.begin_readback(tensor)? else { return Ok(Vec::new()) };
        if !cfg!(target_arch = "wasm32") {
            self.device()
                .poll(wgpu::PollType::Wait {
                    submission_index: Some(readback.submission.clone()),
                    timeout: None,
                })
                .map_err(|e| Error::Readback { cause: ReadbackFailure::Poll { message: e.to_string() } })?;
        }
        let mapped = readback.mapped.receive().await;
        readback.finish(mapped).map(|all| all.into_iter().next().unwrap_or_default())
    }

    /// Copies several tensors' bytes back to the host in one submission and one map (one
    /// wait where [`Self::read_bytes`] per tensor waits once each), waiting for all
    /// submitted work first. Refused before any GPU work, naming the tensor, if one cannot
    /// be read back (as [`Self::read_bytes`]). Blocks as `read_bytes` does; in wasm32 builds
    /// it returns [`Error::Readback`].
    pub fn read_bytes_many(&self, tensors: &[Tensor]) -> Result<Vec<Vec<u8>>> {
        let Some(readback) = self.begin_readback_many(tensors)? else {
            return Ok(vec![Vec::new(); tensors.len()]);
        };
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Readback {
                cause: ReadbackFailure::WouldBlock {
                    call: "read_bytes_many".into(),
                    instead: "read_bytes_async",
                },
            });
        }
        self.device()
            .poll(wgpu::PollType::Wait { submission_index: Some(readback.submission.clone()), timeout: None })
            .map_err(|e| Error::Readback { cause: ReadbackFailure::Poll { message: e.to_string() } })?;
        let mapped = pollster::block_on(readback.mapped.receive());
        readback.finish(mapped)
    }

    /// Checks `tensor`, then submits its copy into a mappable buffer and asks for the map;
    /// `None` for an empty tensor.
    fn begin_readback(&self, tensor: &Tensor) -> Result<Option<Readback>> {
        self.begin_readback_many(std::slice::from_ref(tensor))
    }

    /// Checks every tensor, then submits their copies into one mappable buffer (each from
    /// the 4-byte word holding its first byte) and asks for the map; `None` when every
    /// tensor is empty.
    fn begin_readback_many(&self, tensors: &[Tensor]) -> Result<Option<Readback>> {
        for (i, tensor) in tensors.iter().enumerate() {
            let name = if tensors.len() == 1 { "tensor".to_string() } else { format!("tensors[{i}]") };
            check_readable(&Arg::new(name, tensor))?;
        }
        let mut copies = Vec::with_capacity(tensors.len());
        let mut spans = Vec::with_capacity(tensors.len());
        let mut size = 0;
        for tensor in tensors {
            let range = tensor.byte_range();
            let start = range.start - range.start % wgpu::COPY_BUFFER_ALIGNMENT;
            let end = range.end.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
            spans.push(((size + range.start - start) as usize, tensor.byte_len() as usize));
            if tensor.len > 0 {
                copies.push((tensor, start, size, end - start));
                size += end - start;
            }
        }
        if size == 0 {
            return Ok(None);
        }
        let device = self.device();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("wgpu-optim readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let submission = self.catch("copying a tensor for readback", || {
            let mut encoder = device.create_command_encoder(&Default::default());
            for (tensor, start, at, len) in &copies {
                encoder.copy_buffer_to_buffer(&tensor.buffer, *start, &staging, *at, *len);
            }
            self.queue().submit([encoder.finish()])
        })?;
        let (sender, mapped) = futures_intrusive::channel::shared::oneshot_channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |result| {
            // The receiver lives in the `Readback` until the map is awaited, so the send
            // cannot be lost.
            let _ = sender.send(result);
        });
        Ok(Some(Readback { staging, submission, mapped, spans }))
    }

    /// Reads an f32 tensor back to the host as f32, without [`Self::read`]'s widening.
    pub fn read_f32(&self, tensor: &Tensor) -> Result<Vec<f32>> {
        self.expect_dtype(tensor, DType::F32)?;
        Ok(bytemuck::pod_collect_to_vec(&self.read_bytes(tensor)?))
    }

    fn expect_dtype(&self, tensor: &Tensor, dtype: DType) -> Result<()> {
        if tensor.dtype == dtype {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                argument: "tensor".into(),
                got: tensor.dtype,
                expected: format!("{dtype:?}"),
            })
        }
    }
}

/// Checks that `arg` can be copied to the host: [`check_extent`] and `COPY_SRC`.
pub(crate) fn check_readable(arg: &Arg) -> Result<()> {
    check_extent(arg)?;
    require_usage(arg, wgpu::BufferUsages::COPY_SRC, "COPY_SRC")
}

/// Checks that `write_bytes` can write `arg`: [`check_extent`], `COPY_DST`, and `COPY_SRC`
/// where it starts or ends inside a word (the word's other half is read back first).
pub(crate) fn check_writable(arg: &Arg) -> Result<()> {
    check_extent(arg)?;
    require_usage(arg, wgpu::BufferUsages::COPY_DST, "COPY_DST")?;
    let range = arg.tensor.byte_range();
    if !range.start.is_multiple_of(4) || !range.end.is_multiple_of(4) {
        require_usage(arg, wgpu::BufferUsages::COPY_SRC, "COPY_SRC")?;
    }
    Ok(())
}

fn require_usage(arg: &Arg, usage: wgpu::BufferUsages, name: &'static str) -> Result<()> {
    if arg.tensor.buffer.usage().contains(usage) {
        return Ok(());
    }
    Err(Error::MissingUsage {
        argument: arg.name.clone(),
        needed: name,
        has: format!("{:?}", arg.tensor.buffer.usage()),
    })
}

/// A copy on its way back to the host.
struct Readback {
    staging: wgpu::Buffer,
    submission: wgpu::SubmissionIndex,
    /// The map's outcome, once the device has finished the copy.
    mapped:
        futures_intrusive::channel::shared::OneshotReceiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    /// Each tensor's first byte in `staging`, and its length.
    spans: Vec<(usize, usize)>,
}

impl Readback {
    /// Each tensor's bytes, given the map's outcome.
    fn finish(self, mapped: Option<std::result::Result<(), wgpu::BufferAsyncError>>) -> Result<Vec<Vec<u8>>> {
        match mapped {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                return Err(Error::Readback { cause: ReadbackFailure::Map { message: e.to_string() } })
            }
            None => return Err(Error::Readback { cause: ReadbackFailure::CallbackNeverRan }),
        }
        let view = self
            .staging
            .get_mapped_range(..)
            .map_err(|e| Error::Readback { cause: ReadbackFailure::Map { message: e.to_string() } })?;
        let bytes = self.spans.iter().map(|&(skip, len)| view[skip..skip + len].to_vec()).collect();
        drop(view);
        self.staging.unmap();
        Ok(bytes)
    }
}
