//! The benchmark filter of criterion 0.5's command line, for `benches/kvio.rs` (which skips
//! the rows criterion will not run) and its test (`tests/bench_filter.rs`).

/// The benchmark filter of criterion 0.5's command line, read the way criterion reads it: the
/// first positional argument (a regular expression, or the whole id with `--exact`; every
/// benchmark without one, none with `--ignored`).
#[derive(Debug)]
pub enum Filter {
    /// No filter: every benchmark.
    All,
    /// Ids the expression matches (anywhere in the id).
    Regex(regex::Regex),
    /// The one id equal to it (`--exact`).
    Exact(String),
    /// No benchmark (`--ignored`).
    Nothing,
}

impl Filter {
    /// The filter of `args` (the program name left out).
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Filter {
        // criterion 0.5's options that take a value (`--name value` or `-c value`).
        const VALUED: [&str; 19] = [
            "--color",
            "-c",
            "--save-baseline",
            "-s",
            "--baseline",
            "-b",
            "--baseline-lenient",
            "--format",
            "--profile-time",
            "--load-baseline",
            "--sample-size",
            "--warm-up-time",
            "--measurement-time",
            "--nresamples",
            "--noise-threshold",
            "--confidence-level",
            "--significance-level",
            "--plotting-backend",
            "--output-format",
        ];
        let (mut filter, mut exact, mut ignored) = (None, false, false);
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            if a == "--exact" {
                exact = true;
            } else if a == "--ignored" {
                ignored = true;
            } else if VALUED.contains(&a.as_str()) {
                args.next();
            } else if !a.starts_with('-') && filter.is_none() {
                filter = Some(a);
            }
        }
        match filter {
            _ if ignored => Filter::Nothing,
            None => Filter::All,
            Some(f) if exact => Filter::Exact(f),
            Some(f) => regex::Regex::new(&f).map_or(Filter::Nothing, Filter::Regex),
        }
    }
    /// Whether criterion runs the benchmark whose full id is `id`.
    pub fn selects(&self, id: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Regex(r) => r.is_match(id),
            Filter::Exact(e) => e == id,
            Filter::Nothing => false,
        }
    }
}
