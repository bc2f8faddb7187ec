//! `forkbox-bench fork`'s node half: the same fork(1), fork(N), checkpoint and restore as the
//! engine half, driven as a client drives them (forkbox-queue's session calls on Redis,
//! docs/protocol.md "Sessions") through an in-process node on the engine the engine half
//! uses and a private redis-server, so the node's and Redis's share is the difference of two
//! figures of one run.
//!
//! Each figure is timed by the client, from before its call is sent to the call's result read
//! back (a first result: to the last branch's `run_code` result, each branch asked in turn,
//! as the engine half does).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use forkbox::node::config::SessionSettings;
use forkbox::node::{Node, NodeConfig, NodeError, NodeReport, StopHandle, StopLevel};
use forkbox::sandbox::Engine;
use forkbox_private_redis::RedisServer;
use forkbox_queue::session::{Call, CallOp, Event, SessionSpec};
use forkbox_queue::{Job, Limits, Queue, QueueConfig, Runtime};
use serde_json::{Map, Value};

use crate::fork_figures::{middle, Timed, CHECK, TRIPS};

/// The queue the node serves and the client creates its sessions on.
const QUEUE: &str = "bench-fork";

/// How long any one call may take past its own timeout.
const SLACK: Duration = Duration::from_secs(300);

/// An in-process node on a private redis-server, and a client of its queue.
pub struct NodeBench {
    _server: RedisServer,
    q: Queue,
    stop: StopHandle,
    task: tokio::task::JoinHandle<Result<NodeReport, NodeError>>,
}

impl NodeBench {
    /// Starts a node on `engine` with room for `sessions` sessions of `memory_mb` each and no
    /// session pool (the engine half opens its sessions fresh too).
    pub async fn start(engine: Engine, sessions: usize, memory_mb: u64) -> anyhow::Result<Self> {
        let server = RedisServer::start().context("starting a private redis-server")?;
        let mut config = NodeConfig::new(server.url());
        config.queues = vec![QUEUE.into()];
        config.slots = 2;
        config.name = "bench-fork-node".into();
        config.sessions = SessionSettings {
            max_sessions: sessions,
            memory_mb: memory_mb * sessions as u64,
            pool: 0,
            ..SessionSettings::default()
        };
        let node = Node::new(config, engine);
        let stop = StopHandle::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(node.run(stop.clone(), move |_| {
            let _ = ready_tx.send(());
        }));
        ready_rx
            .await
            .context("the node stopped before it was ready")?;
        let q = Queue::connect(&server.url(), QUEUE, QueueConfig::default()).await?;
        Ok(NodeBench {
            _server: server,
            q,
            stop,
            task,
        })
    }

    /// One run through the node: a parent created and its state built, then fork(1),
    /// fork(`wide`), and a checkpoint restored, each to its first result.
    pub async fn one_run(
        &self,
        limits: &Limits,
        build: &str,
        wide: usize,
    ) -> anyhow::Result<Timed> {
        let q = &self.q;
        let job = Job {
            session: Some(SessionSpec {
                ttl_s: Some(600),
                idle_s: Some(600),
            }),
            runtime: Some(Runtime::Python),
            limits: *limits,
            ..Job::default()
        };
        let started = Instant::now();
        let parent = q
            .open_session(&job, Duration::from_secs(120))
            .await
            .context("opening the parent session through the node")?
            .id;
        let want = self.text(&parent, build).await?;
        let mut out = Timed {
            rebuild: ms(started),
            ..Timed::default()
        };
        let mut trips = Vec::new();
        for _ in 0..TRIPS {
            let started = Instant::now();
            self.text(&parent, "1 + 1").await?;
            trips.push(ms(started));
        }
        out.trip = middle(trips);
        for (i, n) in [1, wide].into_iter().enumerate() {
            let started = Instant::now();
            let r = self
                .call(Call {
                    n: Some(n as u32),
                    ..Call::new(&parent, CallOp::Fork)
                })
                .await
                .with_context(|| format!("fork({n})"))?;
            out.fork[i] = ms(started);
            out.pause[i] = r["parent_pause_us"].as_f64().unwrap_or(0.0) / 1e3;
            let kids: Vec<String> = r["children"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            if kids.len() != n {
                bail!("fork({n}) made {} branches: {r:?}", kids.len());
            }
            for kid in &kids {
                let got = self.text(kid, CHECK).await?;
                if got != want {
                    bail!("a branch's state is {got}, the parent's {want}");
                }
            }
            out.first[i] = ms(started);
            for kid in &kids {
                self.kill(kid).await?;
            }
        }
        let started = Instant::now();
        let r = self
            .call(Call::new(&parent, CallOp::Checkpoint))
            .await
            .context("the checkpoint")?;
        out.checkpoint = ms(started);
        let cp = r["checkpoint"]["id"]
            .as_str()
            .with_context(|| format!("no checkpoint's id: {r:?}"))?
            .to_owned();
        let restoring = Instant::now();
        let r = self
            .call(Call {
                checkpoint: Some(cp.clone()),
                ..Call::new(&parent, CallOp::Restore)
            })
            .await
            .context("the restore")?;
        out.restore = ms(restoring);
        let back = r["id"]
            .as_str()
            .with_context(|| format!("no restored session's id: {r:?}"))?
            .to_owned();
        let got = self.text(&back, CHECK).await?;
        if got != want {
            bail!("the restored state is {got}, the parent's {want}");
        }
        out.restore_first = ms(restoring);
        out.checkpoint_to_first = ms(started);
        self.kill(&back).await?;
        self.call(Call {
            checkpoint: Some(cp),
            ..Call::new(&parent, CallOp::DropCheckpoint)
        })
        .await
        .context("dropping the checkpoint")?;
        self.kill(&parent).await?;
        Ok(out)
    }

    /// Stops the node (every session of the runs is killed by then).
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.raise(StopLevel::Drain);
        self.task.await??;
        Ok(())
    }

    /// Sends `call` and returns its result, which must be ok.
    async fn call(&self, call: Call) -> anyhow::Result<Map<String, Value>> {
        let op = call.op;
        match self.q.call_session(&call, SLACK, &mut |_| {}).await? {
            Event::Result(r) if r["ok"] == true => Ok(r),
            other => bail!("call {op:?} answered {other:?}"),
        }
    }

    /// Runs a cell and returns its value's text.
    async fn text(&self, sid: &str, code: &str) -> anyhow::Result<String> {
        let r = self
            .call(Call {
                timeout_ms: Some(300_000),
                ..Call::run_code(sid, code)
            })
            .await?;
        Ok(r["text"].as_str().unwrap_or_default().to_owned())
    }

    /// Ends a session, and waits until its node has let it go (its room is free again).
    async fn kill(&self, sid: &str) -> anyhow::Result<()> {
        self.call(Call::new(sid, CallOp::Kill)).await?;
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let info = self.q.session_info(sid).await?;
            if info.is_none_or(|i| i.state == "ended") {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("session {sid} did not end within 30 s of its kill")
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
