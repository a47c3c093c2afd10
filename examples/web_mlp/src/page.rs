//! The page's elements: a status line, the numbers, and a canvas plot of the loss and the
//! accuracy against the step. When training ends (or fails) `<body>` gets `data-state`
//! `done` (or `error`) and the results as `data-*` attributes, for the headless check.

use wasm_bindgen::JsCast;
use web_sys::{CanvasRenderingContext2d, Document, Element, HtmlCanvasElement};

use crate::model::Metrics;
use crate::{PageError, Progress};

const LOSS_COLOR: &str = "#1f77b4";
const ACCURACY_COLOR: &str = "#d62728";

/// The elements `index.html` provides.
pub struct Page {
    document: Document,
    body: Element,
    status: Element,
    numbers: Element,
    canvas: HtmlCanvasElement,
    context: CanvasRenderingContext2d,
}

impl Page {
    pub fn find() -> Result<Self, PageError> {
        let missing = |what: &str| PageError::Page(format!("no {what}"));
        let document = web_sys::window().and_then(|w| w.document()).ok_or_else(|| missing("document"))?;
        let by_id = |id: &str| document.get_element_by_id(id).ok_or_else(|| missing(&format!("#{id}")));
        let canvas: HtmlCanvasElement = by_id("plot")?.dyn_into().map_err(|_| missing("canvas #plot"))?;
        let context = canvas
            .get_context("2d")
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into::<CanvasRenderingContext2d>().ok())
            .ok_or_else(|| missing("2d canvas context"))?;
        Ok(Page {
            body: document.body().map(Element::from).ok_or_else(|| missing("body"))?,
            status: by_id("status")?,
            numbers: by_id("numbers")?,
            canvas,
            context,
            document,
        })
    }

    /// A panic shows on the page (wasm panics abort, and the promise of `start` rejects).
    pub fn install_panic_hook(&self) {
        std::panic::set_hook(Box::new(|info| {
            let document = web_sys::window().and_then(|w| w.document());
            if let Some(document) = document {
                if let Some(status) = document.get_element_by_id("status") {
                    status.set_text_content(Some(&format!("error (Panic): {info}")));
                }
                if let Some(body) = document.body() {
                    let _ = body.set_attribute("data-state", "error");
                    let _ = body.set_attribute("data-error", "Panic");
                }
            }
            web_sys::console::error_1(&info.to_string().into());
        }));
    }

    pub fn set_status(&self, text: &str) {
        self.status.set_text_content(Some(text));
    }

    pub fn show_error(&self, error: &PageError) {
        self.set_status(&format!("error ({}): {error}", error.kind()));
        let _ = self.body.set_attribute("data-error", error.kind());
        let _ = self.body.set_attribute("data-state", "error");
        self.document.set_title("web_mlp: error");
    }

    /// Redraws the plot and the numbers.
    pub fn draw(&self, progress: &Progress) {
        if let Some((step, metrics)) = progress.points.last() {
            self.set_status(&format!(
                "training: step {step} of {}, loss {:.4}, accuracy {:.1} %",
                progress.steps,
                metrics.loss,
                100.0 * metrics.accuracy()
            ));
        }
        self.numbers.set_inner_html(&numbers_html(progress, None));
        self.plot(progress);
    }

    /// The final numbers (`last`: the forward pass after the last update), and the results
    /// as attributes of `<body>`.
    pub fn finish(&self, progress: &Progress, last: Metrics) {
        self.set_status(&format!(
            "done: {} steps, training accuracy {:.2} % ({}/{}), loss {:.4}",
            progress.steps,
            100.0 * last.accuracy(),
            last.correct,
            last.samples,
            last.loss
        ));
        self.numbers.set_inner_html(&numbers_html(progress, Some(last)));
        self.plot(progress);
        let attributes = [
            ("data-accuracy", format!("{:.4}", 100.0 * last.accuracy())),
            ("data-loss", format!("{:.6}", last.loss)),
            ("data-steps", progress.steps.to_string()),
            ("data-time-source", if progress.timestamps { "timestamps" } else { "wall" }.to_string()),
            ("data-optimizer-us", per_step_us(progress.optimizer_ns / 1e3, progress.timed)),
            ("data-wall-s", format!("{:.3}", progress.wall_ms / 1e3)),
            ("data-adapter", progress.adapter.clone()),
            ("data-state", "done".to_string()),
        ];
        for (name, value) in attributes {
            let _ = self.body.set_attribute(name, &value);
        }
        self.document.set_title("web_mlp: done");
    }

    fn plot(&self, progress: &Progress) {
        let c = &self.context;
        let (w, h) = (f64::from(self.canvas.width()), f64::from(self.canvas.height()));
        let (left, right, top, bottom) = (64.0, w - 64.0, 36.0, h - 44.0);
        c.set_fill_style_str("#ffffff");
        c.fill_rect(0.0, 0.0, w, h);
        let max_step = f64::from(progress.steps.max(1));
        let max_loss = progress.points.iter().map(|(_, m)| m.loss).fold(0.5_f64, f64::max);
        let max_loss = (max_loss * 2.0).ceil() / 2.0;
        let x = |step: f64| left + (right - left) * step / max_step;
        let y = |fraction: f64| bottom - (bottom - top) * fraction;

        // Grid and axes: accuracy every 20 % (right), loss at the same heights (left).
        c.set_font("12px sans-serif");
        c.set_line_width(1.0);
        c.set_text_baseline("middle");
        for i in 0..=5 {
            let fraction = f64::from(i) / 5.0;
            c.set_stroke_style_str(if i == 0 { "#444444" } else { "#e0e0e0" });
            line(c, (left, y(fraction)), (right, y(fraction)));
            c.set_fill_style_str(LOSS_COLOR);
            c.set_text_align("right");
            let _ = c.fill_text(&format!("{:.2}", max_loss * fraction), left - 6.0, y(fraction));
            c.set_fill_style_str(ACCURACY_COLOR);
            c.set_text_align("left");
            let _ = c.fill_text(&format!("{} %", 20 * i), right + 6.0, y(fraction));
        }
        c.set_stroke_style_str("#444444");
        line(c, (left, top), (left, bottom));
        line(c, (right, top), (right, bottom));
        c.set_fill_style_str("#222222");
        c.set_text_align("center");
        c.set_text_baseline("top");
        let tick = nice_tick(max_step / 5.0);
        let mut step = 0.0;
        while step <= max_step + 0.5 {
            line(c, (x(step), bottom), (x(step), bottom + 4.0));
            let _ = c.fill_text(&format!("{step}"), x(step), bottom + 6.0);
            step += tick;
        }
        let _ = c.fill_text("step", (left + right) / 2.0, bottom + 24.0);
        c.set_font("bold 14px sans-serif");
        c.set_text_baseline("alphabetic");
        let _ = c.fill_text(
            "spirals MLP 2-64-64-3, fused AdamW on WebGPU (wgpu-optim)",
            (left + right) / 2.0,
            top - 14.0,
        );

        // The two curves.
        c.set_line_width(2.0);
        let curve = |color: &str, value: &dyn Fn(&Metrics) -> f64| {
            c.set_stroke_style_str(color);
            c.begin_path();
            for (i, (step, metrics)) in progress.points.iter().enumerate() {
                let (px, py) = (x(f64::from(*step)), y(value(metrics)));
                if i == 0 {
                    c.move_to(px, py);
                } else {
                    c.line_to(px, py);
                }
            }
            c.stroke();
        };
        curve(LOSS_COLOR, &|m| m.loss / max_loss);
        curve(ACCURACY_COLOR, &|m| m.accuracy());

        // Legend, right of the middle: by then the accuracy runs near the top and the loss
        // near the bottom.
        c.set_font("13px sans-serif");
        c.set_text_align("left");
        c.set_text_baseline("middle");
        let legend = [(LOSS_COLOR, "loss (left axis)"), (ACCURACY_COLOR, "training accuracy (right axis)")];
        let (lx, top_y) = (right - 250.0, y(0.6));
        c.set_fill_style_str("#ffffff");
        c.fill_rect(lx - 10.0, top_y - 14.0, 244.0, 48.0);
        c.set_line_width(1.0);
        c.set_stroke_style_str("#cccccc");
        c.stroke_rect(lx - 10.0, top_y - 14.0, 244.0, 48.0);
        c.set_line_width(2.0);
        for (i, (color, label)) in legend.iter().enumerate() {
            let ly = top_y + 20.0 * i as f64;
            c.set_stroke_style_str(color);
            line(c, (lx, ly), (lx + 24.0, ly));
            c.set_fill_style_str("#222222");
            let _ = c.fill_text(label, lx + 32.0, ly);
        }
    }
}

fn line(c: &CanvasRenderingContext2d, from: (f64, f64), to: (f64, f64)) {
    c.begin_path();
    c.move_to(from.0, from.1);
    c.line_to(to.0, to.1);
    c.stroke();
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_tick(raw: f64) -> f64 {
    let power = 10f64.powf(raw.max(1.0).log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|t| *t >= raw).unwrap_or(10.0 * power)
}

/// A time per step for people: microseconds below a millisecond, milliseconds above.
fn per_step(total_us: f64, steps: u32) -> String {
    match steps {
        0 => "n/a".into(),
        _ => match total_us / f64::from(steps) {
            us if us < 1e3 => format!("{us:.0} µs"),
            us => format!("{:.1} ms", us / 1e3),
        },
    }
}

/// Microseconds per step, or "n/a" before any step was timed.
fn per_step_us(total_us: f64, steps: u32) -> String {
    if steps == 0 {
        "n/a".into()
    } else {
        format!("{:.1}", total_us / f64::from(steps))
    }
}

/// The numbers beside the plot, as a definition list's items.
fn numbers_html(progress: &Progress, last: Option<Metrics>) -> String {
    let mut rows: Vec<(String, String)> = vec![("adapter".into(), escape(&progress.adapter))];
    if let Some((step, metrics)) = progress.points.last() {
        rows.push((
            format!("step {step} of {}", progress.steps),
            format!("loss {:.4}, accuracy {:.1} %", metrics.loss, 100.0 * metrics.accuracy()),
        ));
    }
    if progress.timestamps {
        rows.push((
            "optimizer step".into(),
            format!(
                "{}/step (GPU time, WebGPU timestamp queries, {} steps)",
                per_step(progress.optimizer_ns / 1e3, progress.timed),
                progress.timed
            ),
        ));
        rows.push((
            "forward + backward".into(),
            format!("{}/step (GPU time, timestamps)", per_step(progress.model_ns / 1e3, progress.timed)),
        ));
    } else {
        rows.push((
            "optimizer step".into(),
            "not timed: this adapter has no timestamp-query; wall time of whole steps below".into(),
        ));
    }
    if progress.wall_steps > 0 {
        rows.push((
            "wall time".into(),
            format!(
                "{:.2} s for {} steps ({:.2} ms/step: forward, backward and optimizer, with readbacks)",
                progress.wall_ms / 1e3,
                progress.wall_steps,
                progress.wall_ms / f64::from(progress.wall_steps)
            ),
        ));
    }
    if let Some(last) = last {
        rows.push((
            "final".into(),
            format!(
                "training accuracy {:.2} % ({}/{}), loss {:.4} after {} steps",
                100.0 * last.accuracy(),
                last.correct,
                last.samples,
                last.loss,
                progress.steps
            ),
        ));
    }
    rows.iter().map(|(term, value)| format!("<dt>{term}</dt><dd>{value}</dd>")).collect()
}

/// The adapter's name is the only text from outside; keep it text.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
