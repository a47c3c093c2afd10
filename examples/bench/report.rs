//! The bench's output: the progress lines, the summary table, the JSON rows and the plot.

use std::path::Path;

use plotters::prelude::*;

/// Above this fraction of its roofline a row says more about the roofline's measurement
/// than about the step, and is flagged instead of printed as a fraction.
pub const SUSPECT_FRACTION: f64 = 1.05;

/// One measurement.
#[derive(Clone, Debug)]
pub struct Row {
    pub algo: String,
    pub dtype: String,
    /// How the state is stored: the parameter's dtype (`f32`, `f16`, `bf16`) or `q8`.
    pub state: String,
    /// The case's name: a size, `gpt2-small` or `200x4096`.
    pub case: String,
    pub elements: u64,
    pub tensors: usize,
    pub backend: String,
    pub ms_median: f64,
    /// The fastest repetition, which the fraction of the roofline is taken from.
    pub ms_fastest: f64,
    /// Bytes moved per second at the median.
    pub gbps: f64,
    pub roofline_gbps: f64,
    /// The CPU backend's time over this row's (1 for the CPU row itself); `None` without a
    /// CPU row to compare with.
    pub speedup: Option<f64>,
    /// Why the backend refused the case, which then has no times (NaN).
    pub refused: Option<String>,
    /// Muon: the Newton-Schulz products' GFLOP/s at the median, shown in place of the
    /// roofline fraction (its step is bound by the products, not by memory).
    pub gflops: Option<f64>,
}

impl Row {
    /// The fastest repetition's bandwidth over the fastest roofline pass's.
    pub fn fraction(&self) -> f64 {
        self.gbps * self.ms_median / self.ms_fastest / self.roofline_gbps
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "algo": self.algo, "dtype": self.dtype, "state": self.state, "case": self.case, "elements": self.elements,
            "tensors": self.tensors, "backend": self.backend, "ms_median": self.ms_median,
            "ms_fastest": self.ms_fastest,
            "gbps": self.gbps, "roofline_gbps": self.roofline_gbps, "fraction": self.fraction(),
            "suspect_roofline": self.fraction() > SUSPECT_FRACTION, "speedup": self.speedup,
            "refused": self.refused, "gflops": self.gflops,
        })
    }
}

/// `12 %`, or a flag where the fraction cannot be right, or a Muon row's `GFLOP/s`.
fn fraction_cell(row: Option<&Row>) -> String {
    match row {
        None => "-".into(),
        Some(r) if r.refused.is_some() => "-".into(),
        Some(Row { gflops: Some(gflops), .. }) => format!("{gflops:.1} GF/s"),
        Some(r) if r.fraction() > SUSPECT_FRACTION => format!("{:.0} % !", 100.0 * r.fraction()),
        Some(r) => format!("{:.0} %", 100.0 * r.fraction()),
    }
}

/// One progress line per measurement (stderr).
pub fn progress(row: &Row) -> String {
    if let Some(reason) = &row.refused {
        return format!(
            "  {:<9} {:<5} {:<5} {:<10} {:<9} refused: {reason}",
            row.algo, row.dtype, row.state, row.case, row.backend
        );
    }
    format!(
        "  {:<9} {:<5} {:<5} {:<10} {:<9} {:>10.3} ms {:>8.2} GB/s  roofline {:>7.2} GB/s",
        row.algo, row.dtype, row.state, row.case, row.backend, row.ms_median, row.gbps, row.roofline_gbps
    )
}

/// The summary: per algorithm, dtype and case, the GPU and CPU step, the GPU's speedup over
/// the CPU backend, and each backend's fraction of its roofline.
pub fn summary(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<9} {:<5} {:<5} {:<10} {:>11} {:>11} {:>9} {:>9} {:>9}\n",
        "algo", "dtype", "state", "case", "GPU ms", "CPU ms", "GPU/CPU", "GPU roof", "CPU roof"
    );
    let mut keys: Vec<(&str, &str, &str, &str)> = Vec::new();
    for r in rows {
        let key = (r.algo.as_str(), r.dtype.as_str(), r.state.as_str(), r.case.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let mut suspect = false;
    for (algo, dtype, state, case) in keys {
        let find = |backend: &str| {
            rows.iter().find(|r| {
                r.algo == algo
                    && r.dtype == dtype
                    && r.state == state
                    && r.case == case
                    && r.backend == backend
            })
        };
        let gpu = find("gpu").or_else(|| find("gpu-wall"));
        let cpu = find("cpu");
        let ms = |r: Option<&Row>| match r {
            None => "-".into(),
            Some(r) if r.refused.is_some() => "refused".into(),
            Some(r) => format!("{:.3}", r.ms_median),
        };
        let speedup = gpu.and_then(|g| g.speedup).map_or("-".into(), |s| format!("{s:.2}x"));
        suspect |= [gpu, cpu].iter().flatten().any(|r| r.gflops.is_none() && r.fraction() > SUSPECT_FRACTION);
        out.push_str(&format!(
            "{algo:<9} {dtype:<5} {state:<5} {case:<10} {:>11} {:>11} {speedup:>9} {:>9} {:>9}\n",
            ms(gpu),
            ms(cpu),
            fraction_cell(gpu),
            fraction_cell(cpu)
        ));
    }
    out.push_str(
        "GPU/CPU: the CPU backend's time over the GPU's (above 1: the GPU is faster); ms are medians.\n\
         roof: the fastest step's bandwidth as a fraction of the fastest pass of a kernel with the update's\n\
         reads and writes in place, timed between the repetitions; for Muon, whose step is bound by its\n\
         Newton-Schulz products, their GFLOP/s (GF/s) at the median step instead.\n",
    );
    for r in rows {
        if let Some(reason) = &r.refused {
            out.push_str(&format!(
                "refused: {} {} {} {} on the {} backend: {reason}\n",
                r.algo, r.dtype, r.state, r.case, r.backend
            ));
        }
    }
    if suspect {
        out.push_str(&format!(
            "! above {:.0} %: the roofline was measured too slow for this row (noise on a shared machine);\n  \
             rerun it alone (--algos, --dtypes, --sizes) before reading it.\n",
            100.0 * SUSPECT_FRACTION
        ));
    }
    out
}

pub fn write_json(path: &Path, adapter: &str, rows: &[Row]) -> std::io::Result<()> {
    let doc =
        serde_json::json!({ "adapter": adapter, "rows": rows.iter().map(Row::json).collect::<Vec<_>>() });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
}

/// `4 Ki`, `16 Mi`: element counts as the axis shows them.
fn size_label(log2: f64) -> String {
    let n = log2.round() as u32;
    match n {
        0..=9 => format!("{}", 1u64 << n),
        10..=19 => format!("{} Ki", 1u64 << (n - 10)),
        _ => format!("{} Mi", 1u64 << (n - 20)),
    }
}

/// The most series a panel draws, so that a reader can tell them apart.
const MAX_SERIES: usize = 8;

/// Fraction of roofline against tensor size, one panel per backend (single-tensor rows),
/// each with its legend beside the plot.
pub fn write_plot(path: &Path, adapter: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let singles: Vec<&Row> = rows.iter().filter(|r| r.tensors == 1 && r.refused.is_none()).collect();
    let (lo, hi) = singles.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
        let x = (r.elements as f64).log2();
        (lo.min(x), hi.max(x))
    });
    if singles.is_empty() {
        return Err("no single-tensor rows to plot".into());
    }
    let top = singles.iter().map(|r| r.fraction()).fold(1.1, f64::max).min(3.0) * 1.05;
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let root =
        root.titled(&format!("optimizer step, fraction of roofline, on {adapter}"), ("sans-serif", 20))?;
    let panels = [("gpu", "GPU (timestamps)"), ("cpu", "CPU backend")];
    for (area, (backend, title)) in root.split_evenly((1, 2)).iter().zip(panels) {
        let (plot_area, legend_area) = area.split_horizontally(area.dim_in_pixel().0 as i32 - 150);
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        let mut left_out: Vec<String> = Vec::new();
        for row in singles.iter().filter(|r| r.backend == backend) {
            let name = match row.state.as_str() {
                "q8" => format!("{} {} q8", row.algo, row.dtype),
                "q4" => format!("{} {} q4", row.algo, row.dtype),
                _ => format!("{} {}", row.algo, row.dtype),
            };
            let point = ((row.elements as f64).log2(), row.fraction());
            match series.iter().position(|(n, _)| *n == name) {
                Some(k) => series[k].1.push(point),
                None if series.len() < MAX_SERIES => series.push((name, vec![point])),
                None if !left_out.contains(&name) => left_out.push(name),
                None => {}
            }
        }
        if !left_out.is_empty() {
            eprintln!(
                "plot: the {backend} panel shows {MAX_SERIES} series at most; left out: {}",
                left_out.join(", ")
            );
        }
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d((lo - 0.5)..(hi + 0.5), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("elements per tensor")
            .y_desc("fraction of roofline")
            .x_labels(((hi - lo) / 2.0) as usize + 2)
            .x_label_formatter(&|x| size_label(*x))
            .y_label_formatter(&|y| format!("{:.0} %", 100.0 * y))
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            vec![(lo - 0.5, 1.0), (hi + 0.5, 1.0)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))?;
        for (k, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
            let y = 40 + 22 * k as i32;
            legend_area.draw(&PathElement::new(vec![(8, y), (30, y)], color.stroke_width(3)))?;
            legend_area.draw(&Text::new(name.clone(), (36, y - 7), ("sans-serif", 14)))?;
        }
    }
    root.present()?;
    Ok(())
}
