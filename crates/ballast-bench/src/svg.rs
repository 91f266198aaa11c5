//! A small line-plot SVG writer for the scaling curves (no dependencies).

use std::fmt::Write as _;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"];

/// A 640×400 line chart with axes, ticks, labels and a legend.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, l, r, t, b) = (640.0, 400.0, 70.0, 20.0, 40.0, 50.0);
    let all = series.iter().flat_map(|s| s.points.iter());
    let x_max = all.clone().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    let y_max = all.map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let px = |x: f64| l + x / x_max * (w - l - r);
    let py = |y: f64| h - b - y / y_max * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n",
        w / 2.0
    );
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>",
        h - b,
        w - r,
        h - b
    );
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>",
        h - b
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let (xv, yv) = (x_max * f, y_max * f);
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            px(xv),
            h - b + 16.0,
            fmt(xv)
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            l - 6.0,
            py(yv) + 4.0,
            fmt(yv)
        );
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
            py(yv),
            w - r,
            py(yv)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>",
        (l + w - r) / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        s,
        "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{y_label}</text>",
        (t + h - b) / 2.0,
        (t + h - b) / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for &(x, y) in &se.points {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                px(x),
                py(y)
            );
        }
        let ly = t + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            l + 12.0,
            ly - 4.0,
            l + 30.0,
            ly,
            se.name
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn plot() {
        let s = super::line_chart(
            "t",
            "x",
            "y",
            &[super::Series {
                name: "a".into(),
                points: vec![(1.0, 2.0), (2.0, 3.0)],
            }],
        );
        assert!(s.starts_with("<svg") && s.contains("polyline") && s.ends_with("</svg>\n"));
    }
}
