//! `forkbox worker`: the node's settings resolved (see [`super::settings`]), then an engine
//! and a [`Node`] serving until a signal stops it.

use std::process::ExitCode;

use forkbox::node::{Node, StopHandle};

use super::settings::WorkerSettings;

pub fn main(args: WorkerSettings) -> anyhow::Result<ExitCode> {
    super::init_logging();
    let settings = args.with_file()?;
    let config = settings.node_config()?;
    let mut engine = settings.sandbox.engine_config(config.slots);
    engine.ceilings = config.ceilings;
    engine.collect_max_bytes = config.collect_max_bytes;
    let engine =
        forkbox::sandbox::Engine::start(engine).map_err(|e| settings.sandbox.start_failed(e))?;
    super::log_python_runtime(&engine);
    let grace = config.grace;
    let node = Node::new(config, engine);
    super::runtime()?.block_on(async move {
        let stop = StopHandle::default();
        stop.on_signals(grace)?;
        let report = node.run(stop, |_| {}).await?;
        if report.abandoned > 0 {
            tracing::warn!(
                "{} job(s) were killed at the end of the grace period and left pending",
                report.abandoned
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}
