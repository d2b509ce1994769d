//! The one results table (and the same rows as JSON with `--json`).

use serde::Serialize;

use crate::bloat::BloatRun;
use crate::cli::Args;
use crate::latency::LatencyStats;

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Workload name (`ceiling`, `drain`, `enqueue`, `latency`, `bloat`, `ordered`, `amqp`, `kafka`).
    pub workload: &'static str,
    /// What was measured: the variant and its settings.
    pub setting: String,
    /// The figure (median over the runs where there were several).
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The figure divided by the ceiling measured in this run (drain: the ceiling drain that
    /// deletes on completion; enqueue: the ceiling's minimal insert).
    pub vs_ceiling: Option<f64>,
    /// Enqueue: transactions/s divided by the baseline's (1 - overhead). Ordered: events/s
    /// divided by the unordered drain's of the same events. Broker drains: events/s divided by
    /// the no-op sink's drain with the same setting.
    pub vs_baseline: Option<f64>,
    /// Anything else worth knowing about the figure.
    pub notes: String,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// The benchmark's version.
    pub bench_version: &'static str,
    /// `server_version` of PostgreSQL.
    pub postgres: String,
    /// CPUs this process could use.
    pub cpus: usize,
    /// The parameters of this run.
    pub args: &'a Args,
    /// The table.
    pub rows: &'a [Row],
    /// The latency run, if any.
    pub latency: Option<&'a LatencyStats>,
    /// The sustained runs, if any (one per autovacuum setting).
    pub bloat: &'a [BloatRun],
}

/// Median of `values` (not empty) and half the min-max spread relative to it.
pub fn median_spread(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    let spread = (sorted[sorted.len() - 1] - sorted[0]) / 2.0 / median;
    (median, spread)
}

/// `n=3 ±4%`, or nothing for a single run.
pub fn runs_note(values: &[f64]) -> String {
    if values.len() < 2 {
        return String::new();
    }
    let (_, spread) = median_spread(values);
    format!("median of {} (±{:.0}%)", values.len(), spread * 100.0)
}

/// Two notes in one cell, separated by `; ` when both say something.
pub fn join_notes(first: &str, second: &str) -> String {
    match (first.is_empty(), second.is_empty()) {
        (_, true) => first.to_string(),
        (true, false) => second.to_string(),
        (false, false) => format!("{first}; {second}"),
    }
}

fn format_value(value: f64, unit: &str) -> String {
    if unit == "ms" {
        format!("{value:.2} {unit}")
    } else if unit == "bytes" || unit == "dead tuples" {
        format!("{value:.0}")
    } else {
        format!("{} {unit}", thousands(value))
    }
}

/// 12345.6 -> "12,346".
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if value < 0.0 { format!("-{out}") } else { out }
}

fn ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}"))
        .unwrap_or_else(|| "-".to_owned())
}

/// Print the table to stdout.
pub fn print_table(postgres: &str, cpus: usize, rows: &[Row]) {
    let header = [
        "workload",
        "setting",
        "value",
        "vs ceiling",
        "vs baseline",
        "notes",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.workload.to_owned(),
                r.setting.clone(),
                format_value(r.value, r.unit),
                ratio(r.vs_ceiling),
                ratio(r.vs_baseline),
                r.notes.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    println!(
        "outbox-bench {} on PostgreSQL {postgres}, {cpus} CPUs",
        env!("CARGO_PKG_VERSION")
    );
    let line = |cols: &[String]| {
        let mut s = String::from("|");
        for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
            // Numbers right-aligned, text left-aligned.
            if (2..=4).contains(&i) {
                s.push_str(&format!(" {c:>w$} |"));
            } else {
                s.push_str(&format!(" {c:<w$} |"));
            }
        }
        println!("{}", s.trim_end());
    };
    line(&header.map(str::to_owned));
    line(&widths.map(|w| "-".repeat(w)));
    for row in &cells {
        line(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(12_345.6), "12,346");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn median_and_spread() {
        let (m, s) = median_spread(&[90.0, 100.0, 110.0]);
        assert_eq!(m, 100.0);
        assert!((s - 0.1).abs() < 1e-9);
        assert_eq!(median_spread(&[1.0, 3.0]).0, 2.0);
    }
}
