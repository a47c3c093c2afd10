//! The bench's output: the table, the JSON rows and the SVG plot.

use std::path::Path;

use plotters::prelude::*;

/// One measurement.
#[derive(Clone, Debug)]
pub struct Row {
    pub algo: String,
    pub dtype: String,
    pub elements: u64,
    pub tensors: usize,
    pub backend: String,
    pub ms_median: f64,
    pub gbps: f64,
    pub roofline_gbps: f64,
}

impl Row {
    pub fn fraction(&self) -> f64 {
        self.gbps / self.roofline_gbps
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "algo": self.algo, "dtype": self.dtype, "elements": self.elements, "tensors": self.tensors,
            "backend": self.backend, "ms_median": self.ms_median, "gbps": self.gbps,
            "roofline_gbps": self.roofline_gbps, "fraction": self.fraction(),
        })
    }
}

pub fn header() -> String {
    format!(
        "{:<9} {:<5} {:>11} {:>7} {:<9} {:>11} {:>9} {:>9} {:>8}",
        "algo", "dtype", "elements", "tensors", "backend", "ms median", "GB/s", "roofline", "fraction"
    )
}

pub fn line(row: &Row) -> String {
    format!(
        "{:<9} {:<5} {:>11} {:>7} {:<9} {:>11.3} {:>9.2} {:>9.2} {:>7.0}%",
        row.algo,
        row.dtype,
        row.elements,
        row.tensors,
        row.backend,
        row.ms_median,
        row.gbps,
        row.roofline_gbps,
        100.0 * row.fraction()
    )
}

pub fn write_json(path: &Path, adapter: &str, rows: &[Row]) -> std::io::Result<()> {
    let doc =
        serde_json::json!({ "adapter": adapter, "rows": rows.iter().map(Row::json).collect::<Vec<_>>() });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)
}

/// Bandwidth against size, one line per backend (and algorithm/dtype), single-tensor rows.
pub fn write_plot(path: &Path, adapter: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let singles: Vec<&Row> = rows.iter().filter(|r| r.tensors == 1).collect();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for row in &singles {
        let name = format!("{} {} {}", row.backend, row.algo, row.dtype);
        let point = ((row.elements as f64).log2(), row.gbps);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, points)) => points.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let max_gbps = singles.iter().map(|r| r.gbps.max(r.roofline_gbps)).fold(1.0, f64::max) * 1.1;
    let (lo, hi) = singles.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
        let x = (r.elements as f64).log2();
        (lo.min(x), hi.max(x))
    });
    let root = SVGBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("optimizer step bandwidth on {adapter}"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo - 0.5)..(hi + 0.5), 0f64..max_gbps)?;
    chart
        .configure_mesh()
        .x_desc("elements (log2)")
        .y_desc("GB/s (bytes read + written per step / time)")
        .draw()?;
    for (k, (name, points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
