//! The gateway's Prometheus metrics: requests by endpoint and HTTP status, latency
//! histograms and errors by endpoint, served at `GET /metrics`.
//!
//! The recorder is the node's (`metrics-exporter-prometheus`), built as a recorder of the
//! gateway's own rather than installed process-wide, so a gateway started beside a node in one
//! process (`forkbox up --gateway`) keeps its series apart from the node's. Every series is
//! registered at zero when the gateway starts, so a first scrape lists them all.
//!
//! The handles a request records into are kept once registered: a request then bumps an atomic
//! instead of building a key (its labels, the status code as text) and looking it up in the
//! recorder's registry.

use std::collections::HashMap;
use std::sync::Mutex;

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub const REQUESTS: &str = "forkbox_gateway_requests_total";
pub const LATENCY: &str = "forkbox_gateway_request_duration_seconds";
pub const ERRORS: &str = "forkbox_gateway_errors_total";
pub const JOBS: &str = "forkbox_gateway_jobs_total";

/// Request latency: 100 µs to 10 min (a request waits for its job).
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// Why a request counts as an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A 4xx: the request was refused.
    Client,
    /// A 5xx: the gateway or Redis failed.
    Server,
    /// The sandbox failed the job (some APIs answer such a job with 200).
    Sandbox,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Client => "client",
            ErrorKind::Server => "server",
            ErrorKind::Sandbox => "sandbox",
        }
    }
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Each endpoint's latency histogram, registered at start.
    latency: HashMap<&'static str, Histogram>,
    /// The request counters registered so far, by endpoint and status code.
    requests: Mutex<HashMap<(&'static str, u16), Counter>>,
    jobs: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

static META: Metadata<'static> =
    Metadata::new("forkbox::gateway", Level::INFO, Some(module_path!()));

impl Metrics {
    /// A recorder with every endpoint's series at zero.
    pub fn new(endpoints: &[&'static str]) -> Metrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(LATENCY.into()), LATENCY_BUCKETS)
            .expect("the bucket list is not empty")
            .build_recorder();
        let handle = recorder.handle();
        let jobs = recorder.register_counter(&Self::key(JOBS, Vec::new()), &META);
        let mut m = Metrics {
            recorder,
            handle,
            latency: HashMap::new(),
            requests: Mutex::new(HashMap::new()),
            jobs,
        };
        m.describe();
        for &e in endpoints {
            let h = m.register_latency(e);
            m.latency.insert(e, h);
            let _ = m.requests(e, 200);
            for kind in [ErrorKind::Client, ErrorKind::Server, ErrorKind::Sandbox] {
                let _ = m.errors(e, kind);
            }
        }
        m
    }

    fn describe(&self) {
        use metrics::Unit;
        self.recorder.describe_counter(
            REQUESTS.into(),
            Some(Unit::Count),
            "HTTP requests answered, by endpoint and status code".into(),
        );
        self.recorder.describe_histogram(
            LATENCY.into(),
            Some(Unit::Seconds),
            "Time from a request's arrival to its answer, by endpoint (a request that runs a job waits for it)".into(),
        );
        self.recorder.describe_counter(
            ERRORS.into(),
            Some(Unit::Count),
            "Requests that failed, by endpoint and kind: client (4xx), server (5xx), sandbox (the job's sandbox failed)".into(),
        );
        self.recorder.describe_counter(
            JOBS.into(),
            Some(Unit::Count),
            "Jobs the gateway put on the queue".into(),
        );
    }

    fn key(name: &'static str, labels: Vec<Label>) -> Key {
        Key::from_parts(name, labels)
    }

    pub fn requests(&self, endpoint: &'static str, code: u16) -> Counter {
        let mut known = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        known
            .entry((endpoint, code))
            .or_insert_with(|| self.register_requests(endpoint, code))
            .clone()
    }

    fn register_requests(&self, endpoint: &'static str, code: u16) -> Counter {
        self.recorder.register_counter(
            &Self::key(
                REQUESTS,
                vec![
                    Label::new("endpoint", endpoint),
                    Label::new("code", code.to_string()),
                ],
            ),
            &META,
        )
    }

    pub fn latency(&self, endpoint: &'static str) -> Histogram {
        match self.latency.get(endpoint) {
            Some(h) => h.clone(),
            None => self.register_latency(endpoint),
        }
    }

    fn register_latency(&self, endpoint: &'static str) -> Histogram {
        self.recorder.register_histogram(
            &Self::key(LATENCY, vec![Label::new("endpoint", endpoint)]),
            &META,
        )
    }

    pub fn errors(&self, endpoint: &'static str, kind: ErrorKind) -> Counter {
        self.recorder.register_counter(
            &Self::key(
                ERRORS,
                vec![
                    Label::new("endpoint", endpoint),
                    Label::new("kind", kind.as_str()),
                ],
            ),
            &META,
        )
    }

    pub fn jobs(&self) -> Counter {
        self.jobs.clone()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_listed_at_zero_then_counted() {
        let m = Metrics::new(&["/run_code"]);
        let text = m.render();
        assert!(
            text.contains(r#"forkbox_gateway_requests_total{endpoint="/run_code",code="200"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"forkbox_gateway_errors_total{endpoint="/run_code",kind="sandbox"} 0"#),
            "{text}"
        );
        m.requests("/run_code", 422).increment(1);
        // A second request with the same code counts in the same series (the kept handle).
        m.requests("/run_code", 200).increment(1);
        m.requests("/run_code", 200).increment(1);
        m.jobs().increment(1);
        m.errors("/run_code", ErrorKind::Client).increment(1);
        m.latency("/run_code").record(0.002);
        let text = m.render();
        assert!(
            text.contains(r#"forkbox_gateway_requests_total{endpoint="/run_code",code="422"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"forkbox_gateway_errors_total{endpoint="/run_code",kind="client"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"forkbox_gateway_requests_total{endpoint="/run_code",code="200"} 2"#),
            "{text}"
        );
        assert!(text.contains("forkbox_gateway_jobs_total 1"), "{text}");
        assert!(text.contains(r#"forkbox_gateway_request_duration_seconds_bucket{endpoint="/run_code",le="0.0025"} 1"#), "{text}");
    }
}
