//! Grouped bar charts as SVG text (no plotting dependency).

/// Escape text for XML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const COLOURS: [&str; 4] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"];

/// One group of bars per category (`values[i]` has one value per series).
pub fn grouped_bars(
    title: &str,
    categories: &[String],
    series: &[&str],
    values: &[Vec<f64>],
) -> String {
    let (width, height) = (760.0, 360.0);
    let (left, right, top, bottom) = (70.0, 20.0, 40.0, 90.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let max = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let scale_max = nice_ceiling(max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        width / 2.0,
        esc(title)
    );
    for i in 0..=5 {
        let v = scale_max * i as f64 / 5.0;
        let y = top + plot_h - plot_h * i as f64 / 5.0;
        s.push_str(&format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            left + plot_w,
            left - 6.0,
            y + 4.0,
            fmt_tick(v)
        ));
    }
    let n = categories.len().max(1) as f64;
    let group_w = plot_w / n;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (ci, cat) in categories.iter().enumerate() {
        let gx = left + group_w * ci as f64 + group_w * 0.1;
        for (si, v) in values
            .get(ci)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            let h = if v.is_finite() {
                plot_h * v / scale_max
            } else {
                0.0
            };
            let x = gx + bar_w * si as f64;
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{}: {v:.2}</title></rect>\n",
                top + plot_h - h,
                bar_w * 0.95,
                COLOURS[si % COLOURS.len()],
                esc(series.get(si).copied().unwrap_or(""))
            ));
        }
        let cx = left + group_w * (ci as f64 + 0.5);
        s.push_str(&format!(
            "<text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"end\" transform=\"rotate(-30 {cx:.1} {:.1})\">{}</text>\n",
            top + plot_h + 14.0,
            top + plot_h + 14.0,
            esc(cat)
        ));
    }
    if series.len() > 1 {
        for (si, name) in series.iter().enumerate() {
            let x = left + 10.0 + 80.0 * si as f64;
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
                height - 18.0,
                COLOURS[si % COLOURS.len()],
                x + 14.0,
                height - 9.0,
                esc(name)
            ));
        }
    }
    s.push_str(&format!(
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"black\"/>\n</svg>\n",
        top + plot_h
    ));
    s
}

fn nice_ceiling(v: f64) -> f64 {
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_tick(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_one_bar_per_value_and_escapes_text() {
        let svg = grouped_bars(
            "a <b>",
            &["x".into(), "y&z".into()],
            &["mean", "p99"],
            &[vec![1.0, 2.0], vec![3.0, f64::NAN]],
        );
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<rect x=").count(), 4 + 2);
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("y&amp;z"));
        assert_eq!(nice_ceiling(37.0), 50.0);
    }
}
