//! What the session fork bench measures at the engine and through the node alike: the
//! figures of one run, and the cells both run.

/// A branch's first cell: its value is the state's size.
pub(crate) const CHECK: &str = r#"(len(state["d"]), len(state["blobs"]))"#;

/// One run's figures, in ms, at the engine or through the node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timed {
    /// The parent opened, its state and files built: the baseline.
    pub rebuild: f64,
    /// A `run_code` of `1 + 1` in the parent, to its result: what any call costs (the median
    /// of [`TRIPS`]).
    pub trip: f64,
    /// The parent's pause in fork(1) and fork(N), as its kernel measured it.
    pub pause: [f64; 2],
    /// fork(1) and fork(N), to the fork's answer.
    pub fork: [f64; 2],
    /// fork(1) and fork(N), to every branch's first result.
    pub first: [f64; 2],
    /// The checkpoint, to its answer.
    pub checkpoint: f64,
    /// Its restore, to its answer.
    pub restore: f64,
    /// Its restore, to the restored session's first result.
    pub restore_first: f64,
    /// The checkpoint's call to the restored session's first result.
    pub checkpoint_to_first: f64,
}

/// The round trips of a trivial call timed per run.
pub(crate) const TRIPS: usize = 5;

/// The middle of `v`.
pub(crate) fn middle(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
