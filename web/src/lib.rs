//! wgpu-optim in a browser, on the page's WebGPU adapter.
//!
//! - [`run_conformance`]: the conformance runner (the testkit's reader and runner, awaited
//!   rather than blocking) over a directory of `optim-vectors/1` files that a page fetches;
//!   `tools/web-conformance.sh DIR` serves the page and runs it in headless Chromium.
//! - `tests/browser.rs`: the crate's GPU tests that make sense in a browser, run by
//!   `wasm-bindgen-test-runner` (`tools/web-test.sh`).
//!
//! Natively this crate compiles (so the workspace's tools see it) but does nothing useful.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wgpu_optim::{DType, Error, GpuContext};
use wgpu_optim_testkit::conformance::{run_case_async, Backend, Case, Outcome, Tally, ValueType, Verdict};

/// Whether `case` optimizes tensors stored in f64. Scalars do not count: Schedule-Free's
/// expected group values (`weight_sum`, `lr_max`) are f64 scalars of f32 cases, and an f64
/// ONNX case's tensors are f64 too, not only its `R`.
fn has_f64(case: &Case) -> bool {
    case.tensors.values().any(|t| t.dtype == ValueType::Float(DType::F64) && !t.shape.is_empty())
}

/// Runs one parsed case on every backend that tells something about it (the CPU backend
/// aside: in a browser it has no threads), printing one line per backend through `print`.
/// A GPU backend of an f64 case on a device without `SHADER_F64` must be refused with
/// [`Error::MissingFeature`]; it counts as refused, and anything else it does as a failure.
/// Returns the case's verdict: its worst backend's.
pub async fn run_parsed(case: &Case, ctx: &GpuContext, print: &mut dyn FnMut(String)) -> Verdict {
    let name = format!("{} ({})", case.name, case.op);
    if let Err(reason) = case.check_supported() {
        print(format!("{name:<52} {:<18} refused  {reason}", "-"));
        return Verdict::Refused;
    }
    let mut verdict = Verdict::Pass;
    let no_f64 = has_f64(case) && !ctx.has_feature(wgpu::Features::SHADER_F64);
    for backend in Backend::all_for(case).into_iter().filter(|b| *b != Backend::Cpu) {
        let result = run_case_async(case, backend, Some(ctx)).await;
        if no_f64 && backend != Backend::Oracle {
            match result {
                Err(e @ Error::MissingFeature { .. }) => {
                    verdict = verdict.max(Verdict::Refused);
                    print(format!("{name:<52} {:<18} refused  f64: {e}", backend.name()));
                }
                other => {
                    verdict = verdict.max(Verdict::Fail);
                    print(format!(
                        "{name:<52} {:<18} FAIL  an f64 case on a device without SHADER_F64 was not \
                         refused with MissingFeature: {other:?}",
                        backend.name()
                    ));
                }
            }
            continue;
        }
        match result {
            Ok(report) => match report.outcome {
                Outcome::Pass => {
                    print(format!(
                        "{name:<52} {:<18} pass  worst {:.3} of tolerance",
                        backend.name(),
                        report.worst
                    ));
                }
                Outcome::Fail(detail) => {
                    verdict = verdict.max(Verdict::Fail);
                    print(format!(
                        "{name:<52} {:<18} FAIL  worst {:.3e} of tolerance: {detail}",
                        backend.name(),
                        report.worst
                    ));
                }
                Outcome::Refused(reason) => {
                    verdict = verdict.max(Verdict::Refused);
                    print(format!("{name:<52} {:<18} refused  {reason}", backend.name()));
                }
            },
            Err(e) => {
                verdict = verdict.max(Verdict::Fail);
                print(format!("{name:<52} {:<18} FAIL  {e}", backend.name()));
            }
        }
    }
    if case.oracle_only() {
        print(format!(
            "{name:<52} {:<18} oracle-checked only: the crate has no implementation of it yet",
            "-"
        ));
    }
    verdict
}

/// The bytes at `url`, fetched by the page.
async fn fetch_bytes(url: &str) -> Result<Vec<u8>, String> {
    let window = web_sys::window().ok_or("no window")?;
    let response =
        JsFuture::from(window.fetch_with_str(url)).await.map_err(|e| format!("fetch {url}: {e:?}"))?;
    let response: web_sys::Response =
        response.dyn_into().map_err(|_| format!("fetch {url}: not a Response"))?;
    if !response.ok() {
        return Err(format!("fetch {url}: HTTP {}", response.status()));
    }
    let buffer = response.array_buffer().map_err(|e| format!("fetch {url}: {e:?}"))?;
    let buffer = JsFuture::from(buffer).await.map_err(|e| format!("fetch {url}: {e:?}"))?;
    Ok(js_sys::Uint8Array::new(&buffer).to_vec())
}

/// Appends `line` to the page's `#log` element and the console.
fn print_line(line: &str) {
    web_sys::console::log_1(&line.into());
    let Some(log) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.get_element_by_id("log"))
    else {
        return;
    };
    let text = log.text_content().unwrap_or_default();
    log.set_text_content(Some(&format!("{text}{line}\n")));
}

/// The conformance page's entry point: reads `index` (a JSON array of file names), fetches
/// each file from `dir` (a URL prefix ending in `/`), runs it on the page's WebGPU adapter
/// and prints one line per case and backend into `#log`, then the native runner's closing
/// line. Resolves to the number of failures; rejects, with the reason printed, when there is
/// no WebGPU adapter, or the index cannot be read or lists no file (nothing hangs, and a run
/// that checks nothing never reads as a pass).
#[wasm_bindgen]
pub async fn run_conformance(index: String, dir: String) -> Result<u32, JsValue> {
    let fail = |message: String| {
        print_line(&format!("FAIL  {message}"));
        JsValue::from_str(&message)
    };
    let listing = fetch_bytes(&index).await.map_err(fail)?;
    let names: Vec<String> = serde_json::from_slice(&listing)
        .map_err(|e| fail(format!("{index}: not a JSON array of file names: {e}")))?;
    if names.is_empty() {
        // A run that checks nothing must not read as a pass.
        return Err(fail(format!("{index} lists no vector file: a run would check nothing")));
    }
    let ctx = GpuContext::headless().await.map_err(|e| fail(format!("no WebGPU device: {e}")))?;
    print_line(&format!("adapter: {}", ctx.report()));
    let mut tally = Tally::default();
    for name in &names {
        let bytes = match fetch_bytes(&format!("{dir}{name}")).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tally.add(Verdict::Fail);
                print_line(&format!("{name:<52} {:<18} FAIL  {e}", "-"));
                continue;
            }
        };
        let stem = name.strip_suffix(".safetensors").unwrap_or(name);
        match Case::read_bytes(stem, &bytes) {
            Ok(case) => tally.add(run_parsed(&case, &ctx, &mut |line| print_line(&line)).await),
            Err(e) => {
                tally.add(Verdict::Fail);
                print_line(&format!("{name:<52} {:<18} FAIL  {e}", "-"));
            }
        }
        // A lost device fails every later case the same way: stop at the first.
        if let Err(e) = ctx.check_alive() {
            return Err(fail(e.to_string()));
        }
    }
    print_line(&tally.closing_line());
    Ok(tally.failed as u32)
}
