//! `outcore plot`: a memory timeline (`--timeline`) drawn as a PNG.
//!
//! Top: the memory counted against the cap and the resident set over
//! time, the cap, the job's phases shaded and named, and ticks where
//! executors were loaded and evicted. Bottom: disk traffic (reads and
//! spill writes, MiB/s). Drawn by plotters into a buffer with an embedded
//! font, so no system library is needed.

use std::path::PathBuf;

use clap::Args;
use outcore::format_bytes;
use outcore_jobs::timeline::{self, Sample};
use outcore_jobs::{check_outputs, write_file, Error, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// DejaVu Sans, reduced to ASCII (see `jobs/assets/README.md`).
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// Flags of `outcore plot`.
#[derive(Args, Debug)]
pub(super) struct PlotArgs {
    /// A timeline written by `--timeline`.
    #[arg(value_name = "TIMELINE")]
    timeline: PathBuf,
    /// The PNG file to write.
    #[arg(long, value_name = "FILE", default_value = "memory.png")]
    output: PathBuf,
    /// Title. Default: the timeline's file name.
    #[arg(long)]
    title: Option<String>,
    /// Width in pixels.
    #[arg(long, default_value_t = 1200)]
    width: u32,
    /// Height in pixels.
    #[arg(long, default_value_t = 700)]
    height: u32,
}

/// Runs `outcore plot`.
pub(super) fn run(a: PlotArgs) -> Result<()> {
    check_outputs(
        &[("--output", a.output.as_path())],
        &[("timeline", a.timeline.as_path())],
    )?;
    for (flag, v, lo) in [("--width", a.width, 400), ("--height", a.height, 300)] {
        if !(lo..=8000).contains(&v) {
            return Err(Error::Input(format!(
                "{flag} must be between {lo} and 8000 pixels, not {v}"
            )));
        }
    }
    let samples = timeline::read(&a.timeline)?;
    let title = a.title.clone().unwrap_or_else(|| {
        format!(
            "Memory over time: {}",
            a.timeline
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        )
    });
    let mut rgb = vec![0u8; a.width as usize * a.height as usize * 3];
    draw(&samples, &title, &mut rgb, (a.width, a.height)).map_err(|e| Error::Output {
        path: a.output.clone(),
        reason: format!("cannot draw the plot: {e}"),
    })?;
    let png = encode(&rgb, a.width, a.height).map_err(|e| Error::Output {
        path: a.output.clone(),
        reason: format!("cannot encode the PNG: {e}"),
    })?;
    write_file(&a.output, &png)?;
    let last = &samples[samples.len() - 1];
    tell!(
        "wrote {}: {} samples over {:.1}s, peak accounted {}",
        a.output.display(),
        samples.len(),
        last.time_s,
        format_bytes(samples.iter().map(|s| s.accounted_bytes).max().unwrap_or(0))
    );
    Ok(())
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

const ACCOUNTED: RGBColor = RGBColor(31, 119, 180);
const RSS: RGBColor = RGBColor(120, 120, 120);
const CAP: RGBColor = RGBColor(214, 39, 40);
const LOADS: RGBColor = RGBColor(44, 160, 44);
const EVICTIONS: RGBColor = RGBColor(255, 127, 14);
const REMOTE: RGBColor = RGBColor(148, 103, 189);
const BANDS: [RGBColor; 2] = [RGBColor(238, 241, 246), RGBColor(250, 251, 253)];

/// Phases as (start, end, name), in time order.
fn phases(s: &[Sample]) -> Vec<(f64, f64, String)> {
    let mut out: Vec<(f64, f64, String)> = Vec::new();
    let mut at: Option<(&str, u64)> = None;
    for x in s {
        if at == Some((x.phase.as_str(), x.ranks)) {
            if let Some(last) = out.last_mut() {
                last.1 = x.time_s;
            }
            continue;
        }
        if let Some(last) = out.last_mut() {
            last.1 = x.time_s;
        }
        // On several ranks (after growth, say), the band says how many.
        let name = match x.ranks {
            0 | 1 => x.phase.clone(),
            n => format!("{} ({n} ranks)", x.phase),
        };
        out.push((x.time_s, x.time_s, name));
        at = Some((x.phase.as_str(), x.ranks));
    }
    out
}

/// A 0.25 s moving average of the rate of `f` in MiB/s, per sample.
fn rate(s: &[Sample], f: impl Fn(&Sample) -> u64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(s.len());
    let mut j = 0;
    for i in 0..s.len() {
        while s[i].time_s - s[j].time_s > 0.25 {
            j += 1;
        }
        let dt = s[i].time_s - s[j].time_s;
        let v = if dt > 0.0 {
            f(&s[i]).saturating_sub(f(&s[j])) as f64 / dt / f64::from(1 << 20)
        } else {
            0.0
        };
        out.push((s[i].time_s, v));
    }
    out
}

/// The chart areas plotters draws on.
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The memory (top, 2/3 of the height) and disk traffic (bottom) charts.
fn draw(s: &[Sample], title: &str, rgb: &mut [u8], size: (u32, u32)) -> DrawResult {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the embedded font is invalid")?;
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (top, bottom) = root.split_vertically((f64::from(size.1) * 0.66) as u32);
    let tmax = s.last().map_or(1.0, |x| x.time_s).max(0.05);
    let bands = phases(s);
    draw_memory(&top, s, &bands, tmax)?;
    draw_traffic(&bottom, s, &bands, tmax)?;
    root.present()?;
    Ok(())
}

/// The memory chart: phases, load and eviction ticks, accounted bytes,
/// the resident set and the cap, and the legend.
fn draw_memory(
    area: &Area<'_>,
    s: &[Sample],
    bands: &[(f64, f64, String)],
    tmax: f64,
) -> DrawResult {
    let cap = s.iter().find_map(|x| x.cap_bytes);
    let highest = s
        .iter()
        .map(|x| x.accounted_bytes.max(x.rss_bytes))
        .chain(cap)
        .max()
        .unwrap_or(1)
        .max(1);
    let (unit, unit_name) = if highest >= 4 << 30 {
        (f64::from(1 << 30), "GiB")
    } else {
        (f64::from(1 << 20), "MiB")
    };
    // Headroom above the data for the phase names and the legend.
    let ymax = highest as f64 / unit * 1.45;
    let decimals = usize::from(unit_name == "GiB");
    let mut chart = ChartBuilder::on(area)
        .margin(8)
        .margin_right(28)
        .x_label_area_size(28)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)?;
    chart
        .configure_mesh()
        .y_desc(format!("memory ({unit_name})"))
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .x_label_formatter(&|v| format!("{v}"))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    draw_phases(&mut chart, bands, tmax, ymax)?;
    draw_ticks(&mut chart, s, ymax)?;
    draw_memory_series(&mut chart, s, unit, cap.map(|c| (c, tmax)))?;
    // Below the phase names, at the right.
    let plot_w = i32::try_from(chart.plotting_area().dim_in_pixel().0).unwrap_or(800);
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::Coordinate((plot_w - 290).max(0), 24))
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .draw()?;
    Ok(())
}

/// Phases: shaded bands, named where the name fits.
fn draw_phases(
    chart: &mut Chart<'_, '_>,
    bands: &[(f64, f64, String)],
    tmax: f64,
    ymax: f64,
) -> DrawResult {
    let px_per_s = f64::from(chart.plotting_area().dim_in_pixel().0) / tmax;
    chart.draw_series(bands.iter().enumerate().map(|(i, (t0, t1, _))| {
        Rectangle::new([(*t0, 0.0), (*t1, ymax)], BANDS[i % 2].filled())
    }))?;
    let label = ("sans-serif", 13).into_font().color(&RGBColor(90, 90, 90));
    for (t0, t1, name) in bands {
        let width = (t1 - t0) * px_per_s;
        if width > 7.5 * name.len() as f64 + 8.0 {
            chart.draw_series(std::iter::once(Text::new(
                name.to_string(),
                (t0 + 4.0 / px_per_s, ymax * 0.985),
                label.clone(),
            )))?;
        }
    }
    Ok(())
}

/// Loads and evictions: ticks along the bottom, one per sample in which
/// some happened.
fn draw_ticks(chart: &mut Chart<'_, '_>, s: &[Sample], ymax: f64) -> DrawResult {
    let tick = ymax * 0.035;
    for (color, lo, f) in [
        (LOADS, 0.0, (|x: &Sample| x.loads) as fn(&Sample) -> u64),
        (EVICTIONS, tick, |x: &Sample| x.evictions),
    ] {
        chart.draw_series(s.windows(2).filter(|w| f(&w[1]) > f(&w[0])).map(|w| {
            PathElement::new(
                vec![(w[1].time_s, lo), (w[1].time_s, lo + tick)],
                color.stroke_width(1),
            )
        }))?;
    }
    Ok(())
}

/// The accounted bytes (an area), the resident set, the cap (`(bytes,
/// end of the time axis)`, when there is one) and the ticks' legend.
fn draw_memory_series(
    chart: &mut Chart<'_, '_>,
    s: &[Sample],
    unit: f64,
    cap: Option<(u64, f64)>,
) -> DrawResult {
    chart
        .draw_series(
            AreaSeries::new(
                s.iter()
                    .map(|x| (x.time_s, x.accounted_bytes as f64 / unit)),
                0.0,
                ACCOUNTED.mix(0.22),
            )
            .border_style(ACCOUNTED.stroke_width(2)),
        )?
        .label("accounted (counted against the cap)")
        .legend(|(x, y)| {
            Rectangle::new([(x, y - 5), (x + 18, y + 5)], ACCOUNTED.mix(0.5).filled())
        });
    chart
        .draw_series(LineSeries::new(
            s.iter().map(|x| (x.time_s, x.rss_bytes as f64 / unit)),
            RSS.stroke_width(1),
        ))?
        .label("resident set (RSS)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RSS.stroke_width(2)));
    if let Some((c, tmax)) = cap {
        let c = c as f64 / unit;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, c), (tmax, c)],
                10,
                6,
                CAP.stroke_width(2),
            ))?
            .label(format!("cap {}", format_bytes(c as u64 * unit as u64)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], CAP.stroke_width(2)));
    }
    for (color, name) in [
        (LOADS, "executor loads (ticks)"),
        (EVICTIONS, "evictions (ticks)"),
    ] {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x + 9, y - 6), (x + 9, y + 6)], color.stroke_width(2))
            });
    }
    Ok(())
}

/// Disk traffic: reads and spill writes in MiB/s, and loads from
/// lenders' memory when there were any, over the phases.
fn draw_traffic(
    area: &Area<'_>,
    s: &[Sample],
    bands: &[(f64, f64, String)],
    tmax: f64,
) -> DrawResult {
    let read = rate(s, |x| x.bytes_read);
    let written = rate(s, |x| x.bytes_written);
    // Lenders' memory, when the run had lenders.
    let lent = s.iter().any(|x| x.remote_bytes_sent > 0);
    let remote = rate(s, |x| x.remote_bytes_loaded);
    let rmax = read
        .iter()
        .chain(&written)
        .chain(remote.iter().filter(|_| lent))
        .map(|p| p.1)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.25;
    let mut io = ChartBuilder::on(area)
        .margin(8)
        .margin_right(28)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..tmax, 0f64..rmax)?;
    io.configure_mesh()
        .x_desc("time (s)")
        .y_desc(if lent {
            "disk, lenders (MiB/s)"
        } else {
            "disk (MiB/s)"
        })
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v}"))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    io.draw_series(
        bands.iter().enumerate().map(|(i, (t0, t1, _))| {
            Rectangle::new([(*t0, 0.0), (*t1, rmax)], BANDS[i % 2].filled())
        }),
    )?;
    io.draw_series(LineSeries::new(read, LOADS.stroke_width(2)))?
        .label("read (spill files and input read again)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], LOADS.stroke_width(2)));
    io.draw_series(LineSeries::new(written, EVICTIONS.stroke_width(2)))?
        .label("written (spill files)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], EVICTIONS.stroke_width(2)));
    if lent {
        io.draw_series(LineSeries::new(remote, REMOTE.stroke_width(2)))?
            .label("loaded from lenders' memory")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], REMOTE.stroke_width(2)));
    }
    io.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .margin(10)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .draw()?;
    Ok(())
}

/// `rgb` (8-bit RGB rows) as PNG bytes.
fn encode(rgb: &[u8], w: u32, h: u32) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}
