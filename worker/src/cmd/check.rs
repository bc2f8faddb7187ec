//! `forkbox check`: what this host supports, and a sandbox made to prove it.

use std::process::ExitCode;

use forkbox::sandbox::{self, check, Engine};
use forkbox_queue::schema::{Job, Network, Status};

use super::opts::{RedisTlsOpts, SandboxOpts};
use super::runtime;

/// Runs `/bin/true` with each network, proving a sandbox of either can be built, and says
/// what each gives; the reason of the first that fails.
fn network_check(engine: &Engine, opts: &SandboxOpts) -> anyhow::Result<Option<String>> {
    let default = opts.network_default.unwrap_or_default();
    let mut failed = None;
    for network in Network::ALL {
        let what = match network {
            Network::None => {
                "Unix sockets only (any other family fails with EAFNOSUPPORT); its namespace \
                 serves one sandbox at a time and the next once no socket is left in it"
            }
            Network::Loopback => "a new namespace per sandbox with lo up",
        };
        let what = if opts.shared_net {
            format!("{what}, but one namespace shared by every sandbox (--shared-net)")
        } else {
            what.to_owned()
        };
        let mark = if network == default { " (default)" } else { "" };
        let job = Job {
            network: Some(network),
            ..Job::argv(["/bin/true"])
        };
        let out = runtime()?.block_on(engine.run(&job));
        if out.status == Status::Ok {
            println!("ok    network {network}{mark}: {what}");
        } else {
            let reason = out.error.unwrap_or_else(|| out.status.to_string());
            println!("FAIL  network {network}{mark}: {reason}");
            failed.get_or_insert(reason);
        }
    }
    Ok(failed)
}

/// Options of `forkbox check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Also check this Redis: whether it keeps data across a restart (persistence) and
    /// whether its maxmemory-policy would evict jobs and results.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    #[command(flatten)]
    pub redis_tls: RedisTlsOpts,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

pub fn main(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let opts = args.sandbox;
    let report = check::probe_host();
    for line in &report.lines {
        println!("{line}");
    }
    if let Some(url) = &args.redis {
        for line in runtime()?.block_on(redis_lines(url, &args.redis_tls.tls()))? {
            println!("{line}");
        }
    }
    let engine = Engine::start(opts.engine_config(1));
    let mut fatal = report.fatal.clone();
    match &engine {
        Ok(e) => {
            let out = runtime()?.block_on(e.run(&Job::argv(["/bin/true"])));
            if out.status == Status::Ok {
                println!(
                    "ok    sandbox: /bin/true ran in a full sandbox (spawn {} us)",
                    out.spawn_us
                );
            } else {
                println!(
                    "FAIL  sandbox: {}",
                    out.error.clone().unwrap_or_else(|| out.status.to_string())
                );
                fatal.get_or_insert_with(|| out.error.unwrap_or_default());
            }
            if let Some(reason) = network_check(e, &opts)? {
                fatal.get_or_insert(reason);
            }
            let m = e.mechanisms();
            println!("info  identity: {}", m.identity);
            println!(
                "info  seccomp: allow list compiled to {} BPF instructions",
                m.seccomp_instructions
            );
            if let sandbox::Delegation::Unavailable(reason) = &m.cgroup {
                // Delegated by the probe, yet the engine could not use it.
                if !report.lines.iter().any(|l| l.starts_with("hint")) {
                    println!("warn  cgroup v2: not used: {reason}");
                    for hint in check::delegation_hints() {
                        println!("{hint}");
                    }
                }
            }
            for (limit, how) in check::limit_mechanisms(&m.cgroup) {
                println!("limit {limit:<12} {how}");
            }
            python_check(e)?;
        }
        Err(err) => {
            println!("FAIL  sandbox engine: {err}");
            fatal.get_or_insert_with(|| err.to_string());
        }
    }
    if let Some(reason) = fatal {
        eprintln!("forkbox: no sandbox can be made on this host: {reason}");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `forkbox check`'s lines on the warm Python runtime; never fatal (jobs then run cold).
fn python_check(engine: &Engine) -> anyhow::Result<()> {
    use sandbox::PythonRuntime;
    match &engine.mechanisms().python {
        PythonRuntime::Disabled => println!("info  python runtime: off (--python-preload none)"),
        PythonRuntime::Unavailable(why) => {
            println!("warn  python runtime: unusable, python jobs run cold: {why}")
        }
        PythonRuntime::Ready { interpreter, info } => {
            println!(
                "ok    python runtime: {} (Python {}), embedded from {}",
                interpreter.executable.display(),
                interpreter.version.split_whitespace().next().unwrap_or(""),
                interpreter.library.display()
            );
            println!(
                "info  python preload: {} ({} modules loaded in all); warm-up {:.1} ms, \
                 zygote RSS {} -> {} KiB",
                info.preloaded.join(","),
                info.modules.len(),
                info.warm_up_ms,
                info.rss_before_kb,
                info.rss_after_kb
            );
            for (module, error) in &info.failed {
                println!("warn  python preload: {module} not imported: {error}");
            }
            let mut job = Job::argv(["python3", "-c", "print(6*7)"]);
            job.runtime = Some(forkbox_queue::Runtime::Python);
            let out = runtime()?.block_on(engine.run(&job));
            let warm = out.runtime.as_ref().is_some_and(|r| r.warm);
            if out.status == Status::Ok && warm && out.stdout == "42\n" {
                println!(
                    "ok    python runtime: a warm job ran (spawn {} us)",
                    out.spawn_us
                );
            } else {
                println!(
                    "warn  python runtime: the warm test job did not run warm: {} {:?} {}",
                    out.status,
                    out.runtime.and_then(|r| r.note),
                    out.stderr.trim()
                );
            }
        }
    }
    Ok(())
}

/// `forkbox check --redis`'s lines: persistence and eviction, read with `CONFIG GET`.
async fn redis_lines(url: &str, tls: &forkbox_queue::RedisTls) -> anyhow::Result<Vec<String>> {
    use forkbox_queue::redis;
    let broker = super::client::connect(url, tls).await?;
    let mut conn = broker.connection();
    let get = |name: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        cmd
    };
    type Setting = std::collections::HashMap<String, String>;
    let config: redis::RedisResult<(Setting, Setting, Setting)> = redis::pipe()
        .add_command(get("appendonly"))
        .add_command(get("save"))
        .add_command(get("maxmemory-policy"))
        .query_async(&mut conn)
        .await;
    Ok(match config {
        Ok((aof, save, policy)) => redis_findings(
            aof.get("appendonly").map(String::as_str),
            save.get("save").map(String::as_str),
            policy.get("maxmemory-policy").map(String::as_str),
        ),
        Err(e) => vec![format!(
            "warn  redis: could not read its configuration ({e}); check by hand that \
             persistence is on and maxmemory-policy is noeviction"
        )],
    })
}

/// What `CONFIG GET appendonly`, `save` and `maxmemory-policy` mean for jobs and results.
fn redis_findings(
    appendonly: Option<&str>,
    save: Option<&str>,
    policy: Option<&str>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let aof = appendonly == Some("yes");
    let rdb = save.is_some_and(|s| !s.trim().is_empty());
    lines.push(match (aof, rdb) {
        (true, _) => "ok    redis persistence: append-only file on".to_owned(),
        (false, true) => format!(
            "warn  redis persistence: RDB snapshots only (save {}): a crash loses what was \
             written since the last snapshot, jobs and results included",
            save.unwrap_or_default()
        ),
        (false, false) => "warn  redis persistence: off (no append-only file, no snapshots): a \
                           Redis restart loses every queued job and stored result"
            .to_owned(),
    });
    lines.push(match policy {
        Some("noeviction") => "ok    redis maxmemory-policy: noeviction".to_owned(),
        Some(p) => format!(
            "warn  redis maxmemory-policy: {p} evicts keys at the memory limit, job streams and \
             results included (workers refuse it without --allow-eviction)"
        ),
        None => "warn  redis maxmemory-policy: not reported; make sure it is noeviction".to_owned(),
    });
    lines
}

#[cfg(test)]
mod tests {
    use super::redis_findings;

    #[test]
    fn persistence_and_eviction_findings() {
        let cases = [
            (
                Some("yes"),
                Some(""),
                Some("noeviction"),
                ["ok    redis persistence", "ok    redis maxmemory"],
            ),
            (
                Some("no"),
                Some("3600 1"),
                Some("noeviction"),
                ["warn  redis persistence: RDB", "ok    redis maxmemory"],
            ),
            (
                Some("no"),
                Some(""),
                Some("allkeys-lru"),
                [
                    "warn  redis persistence: off",
                    "warn  redis maxmemory-policy: allkeys-lru",
                ],
            ),
            (
                None,
                None,
                None,
                [
                    "warn  redis persistence: off",
                    "warn  redis maxmemory-policy: not reported",
                ],
            ),
        ];
        for (aof, save, policy, want) in cases {
            let got = redis_findings(aof, save, policy);
            for (line, prefix) in got.iter().zip(want) {
                assert!(
                    line.starts_with(prefix),
                    "{aof:?} {save:?} {policy:?}: {line}"
                );
            }
        }
    }
}
