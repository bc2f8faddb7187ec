//! The Lua scripts the queue operations run ([`SCRIPTS`], loaded from `lua/`), and the
//! conventions their headers declare.
//!
//! Each Lua script's header comment is its calling convention: the `KEYS[n]` and `ARGV[n]` it
//! takes, in order (`ARGV[n..]` for a variable tail). Clients in other languages write their
//! calls from these headers, so a script that reads a slot its header does not name, or a
//! header that names a slot the script never reads, fails here.
//!
//! The check is textual: the header is the script's leading block of `--` lines; the body is
//! the rest without comments and string literals. A body that reads `ARGV[i]` or `#ARGV` needs
//! a variable tail in its header. A script that binds a `local KEYS` (its key names come as
//! arguments) must declare no `KEYS`.
//!
//! The Rust side is held to the same headers where it calls: in debug builds (every test run)
//! each call a pipeline or a [`ScriptInvocation`] sends is checked against its script's header
//! ([`check_calls`], [`CheckedCall`]), and a call with the wrong number of keys or arguments
//! panics, naming the script.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use redis::{Arg, Pipeline, Script, ScriptInvocation};

pub(crate) struct Scripts {
    pub enqueue: Script,
    pub complete: Script,
    pub refresh_claims: Script,
    pub hand_back: Script,
    pub remove_consumer: Script,
    pub dlq_requeue: Script,
    pub job_state: Script,
    pub rights: Script,
    pub session_open: Script,
    pub session_call: Script,
    pub session_end: Script,
    pub session_fork: Script,
    pub session_lost: Script,
}

/// Every script's name and source: what [`SCRIPTS`] loads, and whose headers the calls are
/// held to.
pub(crate) const SOURCES: [(&str, &str); 13] = [
    ("enqueue", include_str!("../lua/enqueue.lua")),
    ("complete", include_str!("../lua/complete.lua")),
    ("refresh_claims", include_str!("../lua/refresh_claims.lua")),
    ("hand_back", include_str!("../lua/hand_back.lua")),
    (
        "remove_consumer",
        include_str!("../lua/remove_consumer.lua"),
    ),
    ("dlq_requeue", include_str!("../lua/dlq_requeue.lua")),
    ("job_state", include_str!("../lua/job_state.lua")),
    ("rights", include_str!("../lua/rights.lua")),
    ("session_open", include_str!("../lua/session_open.lua")),
    ("session_call", include_str!("../lua/session_call.lua")),
    ("session_end", include_str!("../lua/session_end.lua")),
    ("session_fork", include_str!("../lua/session_fork.lua")),
    ("session_lost", include_str!("../lua/session_lost.lua")),
];

fn source(name: &str) -> &'static str {
    SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .expect("every script is in SOURCES")
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: Script::new(source("enqueue")),
    complete: Script::new(source("complete")),
    refresh_claims: Script::new(source("refresh_claims")),
    hand_back: Script::new(source("hand_back")),
    remove_consumer: Script::new(source("remove_consumer")),
    dlq_requeue: Script::new(source("dlq_requeue")),
    job_state: Script::new(source("job_state")),
    rights: Script::new(source("rights")),
    session_open: Script::new(source("session_open")),
    session_call: Script::new(source("session_call")),
    session_end: Script::new(source("session_end")),
    session_fork: Script::new(source("session_fork")),
    session_lost: Script::new(source("session_lost")),
});

/// The slots one table (`KEYS` or `ARGV`) of a script names.
#[derive(Debug, Default, PartialEq, Eq)]
struct Slots {
    /// `NAME[n]` with a literal `n`.
    fixed: BTreeSet<u32>,
    /// `NAME[n..]` in a header; `NAME[i]` or `#NAME` in a body.
    tail: Option<u32>,
    /// `NAME[a..b]` named in a header: a group a call may leave out.
    groups: Vec<u32>,
}

/// The header (leading `--` lines) and the body of a script.
fn split(script: &str) -> (String, String) {
    let mut header = String::new();
    let mut body = String::new();
    let mut in_header = true;
    for line in script.lines() {
        let trimmed = line.trim_start();
        if in_header && trimmed.starts_with("--") {
            header.push_str(trimmed.trim_start_matches('-'));
            header.push('\n');
            continue;
        }
        in_header = false;
        body.push_str(&code(line));
        body.push('\n');
    }
    (header, body)
}

/// A line of Lua without its `--` comment and the contents of its string literals.
fn code(line: &str) -> String {
    let mut out = String::new();
    let mut quote = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                if c == '\\' {
                    chars.next();
                } else if c == q {
                    quote = None;
                    out.push(c);
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '-' && chars.peek() == Some(&'-') => break,
            None => out.push(c),
        }
    }
    out
}

/// What `text` says of the table `name`. In a header, `name[a..b]` (a range named in prose) is
/// not a declaration; `name[a..]` is a tail. In a body, any index that is not a literal is a
/// tail use, and so is `#name`.
fn slots(text: &str, name: &str, header: bool) -> Slots {
    let mut found = Slots::default();
    let open = format!("{name}[");
    let mut rest = text;
    while let Some(at) = rest.find(&open) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + open.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.') {
            continue; // another identifier ending in `name`
        }
        let Some(close) = rest.find(']') else { break };
        let index = rest[..close].trim();
        if let Ok(n) = index.parse::<u32>() {
            found.fixed.insert(n);
        } else if let Some(from) = index.strip_suffix("..").and_then(|n| n.parse().ok()) {
            found.tail = Some(from);
        } else if let Some(from) = header
            .then(|| index.split_once(".."))
            .flatten()
            .and_then(|(a, _)| a.parse().ok())
        {
            found.groups.push(from);
        } else if !header || !index.contains("..") {
            found.tail = Some(found.tail.unwrap_or(0));
        }
    }
    if !header && text.contains(&format!("#{name}")) {
        found.tail = Some(found.tail.unwrap_or(0));
    }
    found
}

/// How many keys and arguments a script's header lets a call pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Convention {
    keys: Counts,
    argv: Counts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Counts {
    /// The numbered slots, `1..=all`.
    all: u32,
    /// A call may stop before each of these (an optional group's first slot).
    optional_from: Vec<u32>,
    /// A call may pass any number from `n - 1` up (`NAME[n..]`).
    tail: Option<u32>,
}

impl Counts {
    fn of(slots: &Slots) -> Counts {
        Counts {
            all: slots.fixed.iter().next_back().copied().unwrap_or(0),
            optional_from: slots.groups.clone(),
            tail: slots.tail,
        }
    }

    /// The counts a call may pass, in words: `11 or more`, `5 or 3`.
    fn allowed(&self) -> String {
        if let Some(t) = self.tail {
            return format!("{} or more", t.saturating_sub(1));
        }
        let mut counts = vec![self.all.to_string()];
        counts.extend(
            self.optional_from
                .iter()
                .map(|a| a.saturating_sub(1).to_string()),
        );
        counts.join(" or ")
    }

    fn accepts(&self, n: u32) -> bool {
        n == self.all
            || self.optional_from.iter().any(|a| n + 1 == *a)
            || self.tail.is_some_and(|t| n + 1 >= t)
    }
}

impl Convention {
    /// The convention a script's header declares.
    pub(crate) fn of(script: &str) -> Convention {
        let (header, _) = split(script);
        Convention {
            keys: Counts::of(&slots(&header, "KEYS", true)),
            argv: Counts::of(&slots(&header, "ARGV", true)),
        }
    }

    /// Whether a call passing `keys` keys and `args` arguments fits; else what is wrong.
    fn check(&self, name: &str, keys: u32, args: u32) -> Result<(), String> {
        if !self.keys.accepts(keys) {
            return Err(format!(
                "a call of {name} passes {keys} keys; its header takes {}",
                self.keys.allowed()
            ));
        }
        if !self.argv.accepts(args) {
            return Err(format!(
                "a call of {name} passes {args} arguments; its header takes {}",
                self.argv.allowed()
            ));
        }
        Ok(())
    }
}

/// Each script's convention, by the SHA1 its calls name.
static CONVENTIONS: LazyLock<HashMap<String, (&'static str, Convention)>> = LazyLock::new(|| {
    SOURCES
        .iter()
        .map(|(name, source)| {
            let sha = Script::new(source).get_hash().to_owned();
            (sha, (*name, Convention::of(source)))
        })
        .collect()
});

/// Checks every `EVALSHA` of `pipe` that calls one of this crate's scripts against its header.
pub(crate) fn check_calls(pipe: &Pipeline) -> Result<(), String> {
    for cmd in pipe.cmd_iter() {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                Arg::Simple(b) => Some(b),
                Arg::Cursor => None,
            })
            .collect();
        let [verb, sha, numkeys, rest @ ..] = args.as_slice() else {
            continue;
        };
        if !verb.eq_ignore_ascii_case(b"EVALSHA") {
            continue;
        }
        let Some((name, convention)) = std::str::from_utf8(sha)
            .ok()
            .and_then(|sha| CONVENTIONS.get(sha))
        else {
            continue;
        };
        let keys = std::str::from_utf8(numkeys)
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| format!("a call of {name} gives no key count"))?;
        let args = u32::try_from(rest.len())
            .ok()
            .and_then(|n| n.checked_sub(keys))
            .ok_or_else(|| format!("a call of {name} passes fewer values than its {keys} keys"))?;
        convention.check(name, keys, args)?;
    }
    Ok(())
}

/// A script call checked against its script's header in debug builds, before it is sent.
pub(crate) trait CheckedCall {
    fn checked(&mut self) -> &mut Self;
}

impl CheckedCall for ScriptInvocation<'_> {
    fn checked(&mut self) -> &mut Self {
        if cfg!(debug_assertions) {
            let mut pipe = redis::pipe();
            pipe.invoke_script(self);
            if let Err(e) = check_calls(&pipe) {
                panic!("{e}");
            }
        }
        self
    }
}

#[cfg(test)]
/// The mismatches between a script's header and its uses of `KEYS` and `ARGV`; none when they
/// agree.
fn mismatches(script: &str) -> Vec<String> {
    let (header, body) = split(script);
    let mut out = Vec::new();
    let keys_are_local = body.contains("local KEYS");
    for name in ["KEYS", "ARGV"] {
        let declared = slots(&header, name, true);
        let used = if name == "KEYS" && keys_are_local {
            if !declared.fixed.is_empty() || declared.tail.is_some() {
                out.push("KEYS: declared, but the script binds a local KEYS".to_owned());
            }
            continue;
        } else {
            slots(&body, name, false)
        };
        let last = declared.fixed.iter().next_back().copied().unwrap_or(0);
        let end = declared
            .tail
            .map_or(last, |t| t.saturating_sub(1).max(last));
        for n in 1..=end {
            if !declared.fixed.contains(&n) {
                out.push(format!("{name}[{n}]: missing from the header"));
            }
        }
        if let Some(tail) = declared.tail {
            if tail != end + 1 {
                out.push(format!("{name}[{tail}..]: does not follow {name}[{end}]"));
            }
        }
        for n in &used.fixed {
            let in_tail = declared.tail.is_some_and(|t| *n >= t);
            if !declared.fixed.contains(n) && !in_tail {
                out.push(format!("{name}[{n}]: used, but not in the header"));
            }
        }
        for n in &declared.fixed {
            if !used.fixed.contains(n) {
                out.push(format!("{name}[{n}]: in the header, but never used"));
            }
        }
        match (declared.tail, used.tail) {
            (None, Some(_)) => out.push(format!(
                "{name}: read by a computed index or #{name}, but the header has no {name}[n..]"
            )),
            (Some(t), None) if !used.fixed.iter().any(|n| *n >= t) => {
                out.push(format!("{name}[{t}..]: in the header, but never read"))
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripts() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "lua"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn every_script_uses_what_its_header_declares() {
        let scripts = scripts();
        assert!(scripts.len() >= 8, "{} scripts found", scripts.len());
        let wrong: Vec<String> = scripts
            .iter()
            .flat_map(|(name, text)| {
                mismatches(text)
                    .into_iter()
                    .map(move |m| format!("{name}: {m}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    fn script(name: &str) -> String {
        scripts()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, text)| text)
            .unwrap()
    }

    /// Broken copies of real scripts: each mismatch is named.
    #[test]
    fn a_broken_copy_is_caught() {
        let complete = script("complete.lua");
        // The body reads a key the header does not name.
        let extra_key = complete.replace(
            "redis.call('XDEL', KEYS[5], ARGV[6])",
            "redis.call('XDEL', KEYS[10], ARGV[6])",
        );
        assert_ne!(extra_key, complete);
        let found = mismatches(&extra_key);
        assert!(
            found.contains(&"KEYS[10]: used, but not in the header".to_owned()),
            "{found:?}"
        );
        assert!(!found.iter().any(|m| m.starts_with("KEYS[5]")), "{found:?}");

        // The header drops an argument the body reads.
        let enqueue = script("enqueue.lua");
        let dropped = enqueue.replace("ARGV[2] marker/batch TTL in seconds", "");
        let found = mismatches(&dropped);
        assert_eq!(
            found,
            [
                "ARGV[2]: missing from the header",
                "ARGV[2]: used, but not in the header"
            ],
        );

        // The header names a key the body never reads.
        let remove = script("remove_consumer.lua");
        let unused = remove.replace(
            "KEYS[2] the consumer's heartbeat key",
            "KEYS[2] heartbeat KEYS[3] spare",
        );
        assert_eq!(
            mismatches(&unused),
            ["KEYS[3]: in the header, but never used"]
        );

        // A computed index without a variable tail in the header.
        let refresh = script("refresh_claims.lua");
        let no_tail = refresh.replace("ARGV[3..] entry ids", "");
        assert_eq!(
            mismatches(&no_tail),
            ["ARGV: read by a computed index or #ARGV, but the header has no ARGV[n..]"]
        );

        // A script with its own local KEYS declares none.
        let rights = script("rights.lua");
        let declared = format!("-- KEYS[1] jobs stream\n{rights}");
        assert_eq!(
            mismatches(&declared),
            ["KEYS: declared, but the script binds a local KEYS"]
        );
    }

    #[test]
    fn every_script_file_is_loaded() {
        let loaded: Vec<String> = SOURCES
            .iter()
            .map(|(name, _)| format!("{name}.lua"))
            .collect();
        for (file, text) in scripts() {
            let name = file.trim_end_matches(".lua");
            assert!(loaded.contains(&file), "{file} is not in queue::SOURCES");
            let source = SOURCES.iter().find(|(n, _)| *n == name);
            assert_eq!(source.map(|(_, s)| *s), Some(text.as_str()), "{file}");
        }
    }

    /// Calls as the queue sends them: the right shapes pass, a key or argument too many or
    /// too few is named.
    #[test]
    fn calls_are_held_to_the_headers() {
        let s = &SCRIPTS;
        let call = |inv: &ScriptInvocation| {
            let mut pipe = redis::pipe();
            pipe.invoke_script(inv);
            check_calls(&pipe)
        };
        // remove_consumer: 2 keys, 2 arguments.
        let mut ok = s.remove_consumer.key("jobs");
        ok.key("hb").arg("g").arg("c");
        assert_eq!(call(&ok), Ok(()));
        ok.arg("extra");
        let e = call(&ok).unwrap_err();
        assert!(
            e.starts_with("a call of remove_consumer passes 3 arguments"),
            "{e}"
        );
        let mut short = s.remove_consumer.key("jobs");
        short.arg("g").arg("c");
        let e = call(&short).unwrap_err();
        assert!(
            e.starts_with("a call of remove_consumer passes 1 keys"),
            "{e}"
        );
        // enqueue: its cancel group (KEYS[4..5], ARGV[4..7]) may be left out, not cut short.
        let mut bare = s.enqueue.key("jobs");
        bare.key("idem").key("batch").arg("{}").arg(60).arg("0");
        assert_eq!(call(&bare), Ok(()));
        bare.key("ahead").key("cancelled");
        bare.arg("id").arg(1).arg("PUBLISH").arg("ch");
        assert_eq!(call(&bare), Ok(()));
        let mut cut = s.enqueue.key("jobs");
        cut.key("idem").key("batch").key("ahead");
        cut.arg("{}").arg(60).arg("0");
        let e = call(&cut).unwrap_err();
        assert_eq!(
            e,
            "a call of enqueue passes 4 keys; its header takes 5 or 3"
        );
        // refresh_claims: any number of entry ids after its two arguments.
        let mut none = s.refresh_claims.key("jobs");
        none.arg("g");
        let e = call(&none).unwrap_err();
        assert_eq!(
            e,
            "a call of refresh_claims passes 1 arguments; its header takes 2 or more"
        );
        let mut many = s.refresh_claims.key("jobs");
        many.arg("g").arg("c");
        assert_eq!(call(&many), Ok(()));
        many.arg("1-0").arg("2-0");
        assert_eq!(call(&many), Ok(()));
        // Commands that call no script of ours are not checked.
        let mut other = redis::pipe();
        other.cmd("EVALSHA").arg("0000").arg(9);
        other.cmd("GET").arg("k");
        assert_eq!(check_calls(&other), Ok(()));
    }

    #[test]
    #[should_panic(expected = "a call of job_state passes 3 keys")]
    fn a_checked_call_of_the_wrong_shape_panics_in_debug_builds() {
        let mut inv = SCRIPTS.job_state.key("done");
        inv.key("idem")
            .key("jobs")
            .arg("id")
            .arg("g")
            .arg("result")
            .arg("done");
        inv.checked();
    }

    #[test]
    fn comments_and_strings_are_not_uses() {
        let text = "-- KEYS[1] a\n-- ARGV[1] b\nredis.call('GET', KEYS[1], ARGV[1]) -- ARGV[2]\n\
                    return 'ARGV[3]'";
        assert!(mismatches(text).is_empty(), "{:?}", mismatches(text));
    }
}
