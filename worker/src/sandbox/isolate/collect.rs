//! Collecting the files a job asked for (`collect` globs), as the job itself could.
//!
//! The init that supervises a sandbox holds every capability in the sandbox's user namespace,
//! so it must never open a path the job chose: a symlink planted at any component (`p ->
//! /proc/1`, then `p/maps`) would make it read what the job may not. Two independent guards
//! keep collection inside the job's own files:
//!
//! - **Resolution.** The walk starts from a descriptor of the working directory opened before
//!   the job ran, and opens every name, one component at a time, with `openat2` and
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: no
//!   symlink at any depth, no `..`, no mount crossed (so no `/proc`, no host directory, only the
//!   job's disk). Globs are expanded over those descriptors, never over paths, so expansion
//!   itself does not follow a symlinked directory either. Only regular files are read.
//! - **Privilege.** The walk runs in a child of the init that has dropped every capability, set
//!   `no_new_privs` and installed the job's seccomp filter first ([`collect_as_job`]); it can
//!   read nothing the job could not. The init only relays what it writes, with a cap.
//!
//! What is read is bounded whatever size a file reports (`/proc` files report 0): at most the
//! node's collect cap in all, counting each file's bytes, its path and [`ENTRY_COST`]. A file
//! cut short, or matched once the cap was reached, is flagged in `truncated` and in `error`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufWriter, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use forkbox_queue::FileData;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, SFlag};
use nix::sys::wait::{waitpid, WaitStatus};
use serde::{Deserialize, Serialize};

use super::hardening::{harden, Hardening};
use crate::sandbox::kernel::sys::{self, Forked};

/// What each collected file costs against the cap besides its bytes and its path: the
/// result's bookkeeping for it. Charging it bounds the number of files too.
pub const ENTRY_COST: u64 = 16;
/// Directory entries the walk examines at most, in all patterns together: bounds the work of
/// patterns such as `**/a/**/b` over a deep tree.
const MAX_VISITS: usize = 1_000_000;
/// Directory levels the walk descends at most.
const MAX_DEPTH: usize = 256;
/// Per-file problems named in `error` (the rest are counted).
const MAX_NAMED_PROBLEMS: usize = 3;
/// How much of a path or pattern an error message quotes.
const QUOTE_BYTES: usize = 256;

/// The files collected for one job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Collected {
    pub files: BTreeMap<String, FileData>,
    /// Paths whose content in `files` is cut short by the cap.
    pub truncated: Vec<String>,
    /// What could not be collected, and why (the cap, unreadable files, bad patterns).
    pub error: Option<String>,
}

/// The largest JSON encoding of a [`Collected`] gathered under a cap of `max_bytes`: file
/// content costs at most 4/3 of its size (text is sent as text only when that is not longer
/// than base64), a path at most twice its length (names with control characters are skipped)
/// and twice more in `truncated`, and each entry's punctuation less than [`ENTRY_COST`]; the
/// rest is a fixed allowance for the error message.
pub fn encoded_bound(max_bytes: u64) -> u64 {
    max_bytes.saturating_mul(4).saturating_add(64 * 1024)
}

/// Collects `patterns` beneath `work` from a child process that holds no more privilege than
/// the job: no capabilities, `no_new_privs`, the job's seccomp filter. The caller (the init)
/// reads its answer with a cap and waits for it.
pub fn collect_as_job(
    one: &sys::SingleThreaded,
    work: &OwnedFd,
    patterns: &[String],
    max_bytes: u64,
    hardening: &Hardening,
) -> Collected {
    let failed = |e: String| Collected {
        error: Some(format!("collect: {e}")),
        ..Collected::default()
    };
    let (answer_r, answer_w) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return failed(format!("pipe: {e}")),
    };
    let pid = match one.fork() {
        Err(e) => return failed(format!("fork: {e}")),
        Ok(Forked::Child(_)) => {
            drop(answer_r);
            // Fail closed: without every step, nothing is read.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let collected = match harden(hardening) {
                Ok(()) => collect(work.as_fd(), patterns, max_bytes),
                Err(e) => failed(e.to_string()),
            };
            let mut out = BufWriter::new(std::fs::File::from(answer_w));
            let sent = serde_json::to_writer(&mut out, &collected).is_ok() && out.flush().is_ok();
            sys::exit_now(if sent { 0 } else { 1 })
        }
        Ok(Forked::Parent { pid, .. }) => pid,
    };
    drop(answer_w);
    let cap = encoded_bound(max_bytes);
    let mut answer = Vec::new();
    let read = std::fs::File::from(answer_r)
        .take(cap.saturating_add(1))
        .read_to_end(&mut answer);
    if read.is_err() || answer.len() as u64 > cap {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let status = loop {
        match waitpid(pid, None) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    };
    match (status, read) {
        (_, Err(e)) => failed(format!("reading the collector: {e}")),
        _ if answer.len() as u64 > cap => failed(format!("the collector wrote over {cap} bytes")),
        (Ok(WaitStatus::Exited(_, 0)), Ok(_)) => serde_json::from_slice(&answer)
            .unwrap_or_else(|e| failed(format!("the collector's answer: {e}"))),
        (status, _) => failed(format!("the collector failed: {status:?}")),
    }
}

/// The `openat2` resolution every collected path goes through, component by component.
fn open(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
    sys::open_beneath(dir, name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
}

fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    open(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
}

/// One component of a pattern.
#[derive(Debug)]
enum Step {
    /// A plain name, opened directly.
    Name(String),
    /// A wildcard matched against each entry of the directory.
    Match(glob::Pattern),
    /// `**`: this directory and every directory beneath it.
    AnyDepth,
}

fn parse(pattern: &str) -> Result<Vec<Step>, String> {
    if pattern.starts_with('/') || pattern.split('/').any(|c| c == "..") {
        return Err("must be relative, without '..'".into());
    }
    let mut steps = Vec::new();
    for part in pattern.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let step = if part == "**" {
            Step::AnyDepth
        } else if part.contains(['*', '?', '[']) {
            Step::Match(glob::Pattern::new(part).map_err(|e| e.to_string())?)
        } else {
            Step::Name(part.to_owned())
        };
        // `**/**` means what `**` means, at a much higher cost.
        if matches!(
            (steps.last(), &step),
            (Some(Step::AnyDepth), Step::AnyDepth)
        ) {
            continue;
        }
        steps.push(step);
    }
    if steps.is_empty() {
        return Err("names no file".into());
    }
    Ok(steps)
}

/// The walk's state across all patterns of a job.
struct Walk {
    left: u64,
    visits: usize,
    out: Collected,
    seen: BTreeSet<String>,
    left_out: usize,
    problems: Vec<String>,
    more_problems: usize,
    stopped: Option<String>,
}

/// Collects `patterns` beneath the directory `work` (see the module's rules), at most
/// `max_bytes` in all. Never fails as a whole: what could not be collected is said in `error`.
pub fn collect(work: BorrowedFd<'_>, patterns: &[String], max_bytes: u64) -> Collected {
    let mut walk = Walk {
        left: max_bytes,
        visits: 0,
        out: Collected::default(),
        seen: BTreeSet::new(),
        left_out: 0,
        problems: Vec::new(),
        more_problems: 0,
        stopped: None,
    };
    let device = fstat(work.as_raw_fd()).map(|s| s.st_dev);
    match device {
        Err(e) => walk.problem(format!("the working directory: {e}")),
        Ok(device) => {
            for pattern in patterns {
                match parse(pattern) {
                    Ok(steps) => walk.dir(work, device, "", &steps, 0),
                    Err(e) => walk.problem(format!("{:?}: {e}", quote(pattern))),
                }
                if walk.stopped.is_some() {
                    break;
                }
            }
        }
    }
    walk.finish(max_bytes)
}

impl Walk {
    fn problem(&mut self, what: String) {
        if self.problems.len() < MAX_NAMED_PROBLEMS {
            self.problems.push(what);
        } else {
            self.more_problems += 1;
        }
    }

    /// Matches `steps` against the directory `dir` (at `rel`, "" for the working directory).
    fn dir(&mut self, dir: BorrowedFd<'_>, device: u64, rel: &str, steps: &[Step], depth: usize) {
        let Some((step, rest)) = steps.split_first() else {
            return; // A directory: not collected.
        };
        if self.stopped.is_some() {
            return;
        }
        if depth >= MAX_DEPTH {
            self.stopped = Some(format!("stopped at {MAX_DEPTH} directory levels"));
            return;
        }
        match step {
            Step::Name(name) => self.entry(dir, device, rel, name, rest, depth),
            Step::Match(pattern) => {
                for name in self.list(dir, rel) {
                    if pattern.matches_with(&name, glob::MatchOptions::new()) {
                        self.entry(dir, device, rel, &name, rest, depth);
                    }
                }
            }
            Step::AnyDepth => {
                // No level at all, then one level more with `**` still to match.
                self.dir(dir, device, rel, rest, depth);
                for name in self.list(dir, rel) {
                    if rest.is_empty() {
                        self.entry(dir, device, rel, &name, &[], depth);
                    }
                    let path = join(rel, &name);
                    if let Ok(child) = open_dir(dir, OsStr::new(&name)) {
                        self.dir(child.as_fd(), device, &path, steps, depth + 1);
                    }
                }
            }
        }
    }

    /// The entry `name` of `dir`: a file to collect when no step is left, else a directory
    /// to go on in.
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        device: u64,
        rel: &str,
        name: &str,
        rest: &[Step],
        depth: usize,
    ) {
        let path = join(rel, name);
        if rest.is_empty() {
            self.file(dir, device, &path, name);
        } else if let Ok(child) = open_dir(dir, OsStr::new(name)) {
            self.dir(child.as_fd(), device, &path, rest, depth + 1);
        }
    }

    /// The names in `dir`, sorted, without `.` and `..`; names a result could not carry
    /// (not UTF-8, or with control characters) are skipped and said.
    fn list(&mut self, dir: BorrowedFd<'_>, rel: &str) -> Vec<String> {
        // The duplicate shares `dir`'s offset; the iteration rewinds it when it ends, so the
        // next listing of the same directory (another pattern) starts from the top again.
        let listing = dir
            .try_clone_to_owned()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
            .and_then(nix::dir::Dir::from);
        let mut d = match listing {
            Ok(d) => d,
            Err(e) => {
                self.problem(format!("{}: {e}", quote(display(rel))));
                return Vec::new();
            }
        };
        let mut names = Vec::new();
        for entry in d.iter() {
            let Ok(entry) = entry else { break };
            self.visits += 1;
            if self.visits > MAX_VISITS {
                self.stopped = Some(format!("stopped after {MAX_VISITS} directory entries"));
                break;
            }
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            match std::str::from_utf8(bytes) {
                Ok(name) if !name.chars().any(char::is_control) => names.push(name.to_owned()),
                _ => self.problem(format!(
                    "{}: a name that is not printable UTF-8 was skipped",
                    quote(display(rel))
                )),
            }
        }
        names.sort();
        names
    }

    /// Reads `name` of `dir` (the path `path`) if it is a regular file of the job's disk.
    fn file(&mut self, dir: BorrowedFd<'_>, device: u64, path: &str, name: &str) {
        if self.seen.contains(path) {
            return;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let fd = match open(dir, OsStr::new(name), flags) {
            Ok(fd) => fd,
            // Symlinks (ELOOP), mount points (EXDEV), sockets (ENXIO) and names that do not
            // exist are not the job's regular files: skipped, as a glob skips non-matches.
            Err(Errno::ELOOP | Errno::EXDEV | Errno::ENXIO | Errno::ENOENT | Errno::ENOTDIR) => {
                return
            }
            Err(e) => return self.problem(format!("{}: {e}", quote(path))),
        };
        match fstat(fd.as_raw_fd()) {
            Ok(st)
                if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
                    && st.st_dev == device => {}
            Ok(_) => return,
            Err(e) => return self.problem(format!("{}: {e}", quote(path))),
        }
        self.seen.insert(path.to_owned());
        let fixed = path.len() as u64 + ENTRY_COST;
        if self.left < fixed {
            self.left_out += 1;
            return;
        }
        self.left -= fixed;
        // One byte past what is left tells a file that fits exactly from one that does not,
        // whatever size the file claims.
        let mut bytes = Vec::new();
        let read = std::fs::File::from(fd)
            .take(self.left.saturating_add(1))
            .read_to_end(&mut bytes);
        if let Err(e) = read {
            self.left += fixed;
            return self.problem(format!("{}: {e}", quote(path)));
        }
        if bytes.len() as u64 > self.left {
            bytes.truncate(self.left as usize);
            self.out.truncated.push(path.to_owned());
        }
        self.left -= bytes.len() as u64;
        self.out.files.insert(path.to_owned(), encode(bytes));
    }

    fn finish(mut self, max_bytes: u64) -> Collected {
        let mut parts = Vec::new();
        if !self.out.truncated.is_empty() || self.left_out > 0 {
            parts.push(format!(
                "the collected files exceed the cap of {max_bytes} bytes: {} cut short \
                 (files_truncated), {} more left out",
                self.out.truncated.len(),
                self.left_out
            ));
        }
        parts.append(&mut self.problems);
        if self.more_problems > 0 {
            parts.push(format!("{} more problems", self.more_problems));
        }
        parts.extend(self.stopped);
        if !parts.is_empty() {
            self.out.error = Some(format!("collect: {}", parts.join("; ")));
        }
        self.out
    }
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

fn display(rel: &str) -> &str {
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

/// At most [`QUOTE_BYTES`] of `s`, on a character boundary.
fn quote(s: &str) -> &str {
    let mut end = s.len().min(QUOTE_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Text when the bytes are UTF-8 and their JSON string is not longer than base64 would be
/// (control characters escape to six bytes each), base64 otherwise.
fn encode(bytes: Vec<u8>) -> FileData {
    let base64_len = bytes.len().div_ceil(3) * 4 + r#"{"b64":""}"#.len();
    match String::from_utf8(bytes) {
        Ok(text) if json_len(&text) <= base64_len => FileData::Text(text),
        Ok(text) => {
            use base64::Engine;
            FileData::Base64(base64::engine::general_purpose::STANDARD.encode(text))
        }
        Err(e) => FileData::from_bytes(e.into_bytes()),
    }
}

/// The length of `s` as a JSON string, quotes included (as serde_json escapes it).
fn json_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn work_fd(dir: &Path) -> OwnedFd {
        fs::File::open(dir).unwrap().into()
    }

    fn run(dir: &Path, patterns: &[&str], max: u64) -> Collected {
        let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        collect(work_fd(dir).as_fd(), &patterns, max)
    }

    fn bytes(c: &Collected, path: &str) -> Vec<u8> {
        c.files[path].to_bytes().unwrap()
    }

    #[test]
    fn matching_regular_files_are_collected_text_or_base64() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("out/sub/deeper")).unwrap();
        fs::write(dir.path().join("out/a.txt"), "A").unwrap();
        fs::write(dir.path().join("out/b.bin"), [0xffu8]).unwrap();
        fs::write(dir.path().join("out/.hidden"), "h").unwrap();
        fs::write(dir.path().join("out/sub/deeper/c.txt"), "C").unwrap();
        let got = run(
            dir.path(),
            &["out/*.txt", "out/*", "./out//sub/**/*.txt"],
            1000,
        );
        assert_eq!(
            got.files.keys().collect::<Vec<_>>(),
            [
                "out/.hidden",
                "out/a.txt",
                "out/b.bin",
                "out/sub/deeper/c.txt"
            ]
        );
        assert_eq!(got.files["out/a.txt"], FileData::Text("A".into()));
        assert!(matches!(got.files["out/b.bin"], FileData::Base64(_)));
        assert_eq!((got.truncated.len(), got.error), (0, None));
        // Every pattern lists the working directory afresh.
        fs::write(dir.path().join("top.txt"), "t").unwrap();
        fs::write(dir.path().join("top.bin"), "b").unwrap();
        let top = run(dir.path(), &["*.txt", "*.bin", "*/a.txt"], 1000);
        assert_eq!(
            top.files.keys().collect::<Vec<_>>(),
            ["out/a.txt", "top.bin", "top.txt"]
        );
        let all = run(dir.path(), &["**"], 1000);
        assert_eq!(all.files.len(), 6, "{all:?}");
        assert_eq!(
            run(dir.path(), &["out/sub/deeper/c.txt"], 1000).files.len(),
            1
        );
    }

    #[test]
    fn no_symlink_is_followed_at_any_component() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), "host bytes").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path();
        fs::create_dir(w.join("real")).unwrap();
        fs::write(w.join("real/ok.txt"), "ok").unwrap();
        symlink(outside.path(), w.join("abs")).unwrap();
        symlink("../../../../../../..", w.join("up")).unwrap();
        symlink("/proc/self", w.join("self")).unwrap();
        symlink("/proc/1", w.join("p")).unwrap();
        symlink("real", w.join("rel")).unwrap();
        symlink(outside.path().join("secret"), w.join("real/link.txt")).unwrap();
        let got = run(
            w,
            &[
                "abs/secret",
                "abs/*",
                "up/etc/passwd",
                "up/**/secret",
                "self/environ",
                "self/fd/*",
                "p/maps",
                "p/auxv",
                "rel/ok.txt",
                "*/ok.txt",
                "**/*",
                "real/link.txt",
            ],
            1 << 20,
        );
        assert_eq!(got.files.keys().collect::<Vec<_>>(), ["real/ok.txt"]);
        assert_eq!(got.error, None);
    }

    #[test]
    fn mounts_are_not_crossed() {
        // /proc is a mount of its own: opened as the working directory it is a directory
        // whose entries are mount-crossing or magic links.
        let got = collect(
            work_fd(Path::new("/")).as_fd(),
            &["proc/self/status".into()],
            1 << 20,
        );
        assert!(got.files.is_empty(), "{got:?}");
    }

    #[test]
    fn reads_stop_at_the_cap_whatever_size_a_file_reports() {
        let proc_self = work_fd(Path::new("/proc/self"));
        // /proc files report a size of 0; the read stops at the cap all the same. (pagemap,
        // read only in multiples of 8 bytes, may fail instead: left out and said.)
        for name in ["maps", "environ", "smaps", "status"] {
            let got = collect(proc_self.as_fd(), &[name.into()], 100);
            assert!(got.files.contains_key(name), "{name}: {got:?}");
            let len = bytes(&got, name).len();
            assert_eq!(len, 100 - name.len() - ENTRY_COST as usize, "{name}");
            assert_eq!(got.truncated, [name]);
        }
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), vec![b'a'; 100]).unwrap();
        fs::write(dir.path().join("b"), vec![b'b'; 100]).unwrap();
        fs::write(dir.path().join("c"), vec![b'c'; 100]).unwrap();
        let cap = 2 * (1 + ENTRY_COST) + 150;
        let got = run(dir.path(), &["*"], cap);
        assert_eq!(bytes(&got, "a").len(), 100);
        assert_eq!(bytes(&got, "b"), vec![b'b'; 50]);
        assert!(!got.files.contains_key("c"));
        assert_eq!(got.truncated, ["b"]);
        let error = got.error.unwrap();
        assert!(
            error.contains("1 cut short") && error.contains("1 more left out"),
            "{error}"
        );
        // Exactly the cap is not truncation.
        let got = run(dir.path(), &["a"], 100 + 1 + ENTRY_COST);
        assert_eq!((bytes(&got, "a").len(), got.truncated.len()), (100, 0));
        assert_eq!(got.error, None);
    }

    #[test]
    fn non_regular_files_and_bad_patterns() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        fs::write(dir.path().join("f"), "x").unwrap();
        let got = run(dir.path(), &["*", "[", "../x"], 1000);
        assert_eq!(got.files.keys().collect::<Vec<_>>(), ["f"]);
        let error = got.error.unwrap();
        assert!(
            error.contains("\"[\"") && error.contains("\"../x\""),
            "{error}"
        );
    }

    #[test]
    fn the_encoding_stays_within_its_bound() {
        assert_eq!(encode(b"hi".to_vec()), FileData::Text("hi".into()));
        assert!(matches!(encode(vec![0u8; 30]), FileData::Base64(_)));
        assert_eq!(json_len("a\"\u{1}"), 2 + 1 + 2 + 6);
        for content in [
            vec![0u8; 3000],
            vec![b'"'; 3000],
            vec![0xff; 3000],
            vec![b'a'; 3000],
        ] {
            let dir = tempfile::tempdir().unwrap();
            for i in 0..50 {
                fs::write(dir.path().join(format!("\"\\{i}")), &content).unwrap();
            }
            for cap in [100, 5000, 1 << 20] {
                let got = run(dir.path(), &["*"], cap);
                let len = serde_json::to_vec(&got).unwrap().len() as u64;
                assert!(len <= encoded_bound(cap), "{len} > bound for cap {cap}");
                let expected = serde_json::to_string(&got.files.values().next()).unwrap();
                assert!(!expected.is_empty());
            }
        }
    }
}
