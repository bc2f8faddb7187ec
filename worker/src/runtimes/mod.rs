//! The runtime catalogue: which languages a node can run, and how.
//!
//! The catalogue is data (`catalogue.toml`, shipped in the binary, overridable by the operator
//! with `--runtimes FILE`): for each language its names, the file its source goes in, the
//! compile and run commands, the command that prints its version, and its warm runtime where
//! one exists. A node probes every entry at start, in a sandbox as a job would run it
//! ([`probe`]), and publishes what answered with its heartbeat; `forkbox runtimes` reads what
//! the fleet published. Front ends (the HTTP gateway) use [`Catalogue::find`],
//! [`select`] and [`Language::expand`] to turn (language, version, source) into a staged job.

pub mod probe;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use forkbox_queue::schema::{
    CompileStage, FileData, Job, Limits, Runtime, StageLimits, MAX_TIMEOUT_MS,
};
use serde::{Deserialize, Serialize};

/// The catalogue shipped with the node.
pub const BUILTIN: &str = include_str!("catalogue.toml");

/// One language of the catalogue (one `[[language]]` table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Language {
    /// The name clients ask for.
    pub name: String,
    /// Other names it answers to.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The file the program's source is written to.
    pub source_file: String,
    /// Java's rule: the public class decides the source file's name (`Foo` → `Foo.java`).
    #[serde(default)]
    pub class_rule: bool,
    /// The compile stage's argv, if the language has one.
    #[serde(default)]
    pub compile: Option<Vec<String>>,
    /// The run stage's argv; a program's own arguments follow it.
    pub run: Vec<String>,
    /// The argv that prints the version (its first dotted number).
    pub version: Vec<String>,
    /// The warm runtime that runs `run`, if any.
    #[serde(default)]
    pub warm: Option<Runtime>,
    /// The compile stage's limits when a request sets none of its own.
    #[serde(default, skip_serializing_if = "CompileLimits::is_empty")]
    pub compile_limits: CompileLimits,
}

/// A language's default limits for its compile stage (`compile_limits = { ... }`): compilers
/// differ (g++ on `<bits/stdc++.h>` takes seconds, javac and rustc hundreds of MB), so each
/// language may say what its compiler needs. A request's own compile limits override these,
/// and a front end holds both to its ceilings; a limit left out is the front end's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompileLimits {
    /// The stage's wall-clock limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Processes and threads the compiler may have at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// The most output (per stream) the compiler may write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
}

impl CompileLimits {
    pub fn is_empty(&self) -> bool {
        *self == CompileLimits::default()
    }

    /// The stage's limits besides its timeout, as a job carries them.
    pub fn stage_limits(&self) -> StageLimits {
        StageLimits {
            memory_mb: self.memory_mb,
            pids: self.pids,
            output_bytes: self.output_bytes,
            cpu_ms: None,
        }
    }

    /// Each limit set is within the range a job accepts (the schema's), else which is not.
    fn check(&self) -> Result<(), String> {
        let ranges = Limits::ranges();
        let range = |name: &str| {
            ranges
                .iter()
                .find(|(n, _, _)| *n == name)
                .map_or((1, u64::MAX), |&(_, min, max)| (min, max))
        };
        for (field, value, (min, max)) in [
            ("timeout_ms", self.timeout_ms, (1, MAX_TIMEOUT_MS)),
            ("memory_mb", self.memory_mb, range("memory_mb")),
            ("pids", self.pids, range("pids")),
            ("output_bytes", self.output_bytes, range("output_bytes")),
        ] {
            match value {
                Some(v) if v < min.max(1) || v > max => {
                    return Err(format!("{field}: {v} is not within {}..={max}", min.max(1)))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for CompileLimits {
    /// `timeout=20s,memory=2048MB,pids=64,output=1048576B`, or `-` when none is set.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(ms) = self.timeout_ms {
            parts.push(format!("timeout={}s", ms as f64 / 1000.0));
        }
        if let Some(mb) = self.memory_mb {
            parts.push(format!("memory={mb}MB"));
        }
        if let Some(n) = self.pids {
            parts.push(format!("pids={n}"));
        }
        if let Some(b) = self.output_bytes {
            parts.push(format!("output={b}B"));
        }
        if parts.is_empty() {
            return f.write_str("-");
        }
        f.write_str(&parts.join(","))
    }
}

/// A catalogue file: `[[language]]` tables, read one by one so that an error names its entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    #[serde(default, rename = "language")]
    languages: Vec<toml::Table>,
}

/// A set of languages with unique names and aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalogue {
    languages: Vec<Language>,
}

/// Why a catalogue could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error("reading the runtime catalogue {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("runtime catalogue {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("runtime catalogue {origin}: language {name:?}: {reason}")]
    Invalid {
        origin: String,
        name: String,
        reason: String,
    },
}

/// A language a node (or the fleet) can run, with the version it found.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Available {
    pub language: String,
    pub version: String,
}

/// Why no runtime answers a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("language: {0:?} is not a known language")]
    UnknownLanguage(String),
    #[error("version: {language} {version} is not available (available: {available})")]
    NoVersion {
        language: String,
        version: String,
        available: String,
    },
}

/// Why a program could not be made into a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    #[error("files: no file given")]
    NoFiles,
    #[error("files[{0}]: a file other than the first needs a name")]
    Unnamed(usize),
    #[error("files[{index}]: {reason}")]
    BadName { index: usize, reason: String },
}

impl Catalogue {
    /// The catalogue shipped with the node.
    pub fn builtin() -> Catalogue {
        Catalogue::parse(BUILTIN, "(built in)").expect("the built-in catalogue is valid")
    }

    /// Parses a catalogue file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Catalogue, CatalogueError> {
        let file: CatalogueFile = toml::from_str(text).map_err(|e| CatalogueError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        let languages = file
            .languages
            .into_iter()
            .enumerate()
            .map(|(index, table)| {
                let name = match table.get("name") {
                    Some(toml::Value::String(name)) => name.clone(),
                    _ => format!("#{}", index + 1),
                };
                serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                    let field = e.path().to_string();
                    let message = e.inner().message().trim_end().to_owned();
                    CatalogueError::Invalid {
                        origin: origin.to_owned(),
                        name,
                        reason: if field == "." {
                            message
                        } else {
                            format!("{field}: {message}")
                        },
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        let catalogue = Catalogue { languages };
        catalogue.check(origin)?;
        Ok(catalogue)
    }

    /// The built-in catalogue with the operator's file (if any) over it: an entry of the file
    /// replaces the built-in one of the same name, a new name adds a language.
    pub fn load(overrides: Option<&Path>) -> Result<Catalogue, CatalogueError> {
        let builtin = Catalogue::builtin();
        let Some(path) = overrides else {
            return Ok(builtin);
        };
        let text = std::fs::read_to_string(path).map_err(|source| CatalogueError::Read {
            path: path.to_owned(),
            source,
        })?;
        let origin = path.display().to_string();
        let file = Catalogue::parse(&text, &origin)?;
        let merged = builtin.overridden_by(file);
        merged.check(&origin)?;
        Ok(merged)
    }

    /// This catalogue with `other`'s entries replacing or adding to its own.
    pub fn overridden_by(self, other: Catalogue) -> Catalogue {
        let mut languages = self.languages;
        for lang in other.languages {
            match languages.iter_mut().find(|l| l.name == lang.name) {
                Some(slot) => *slot = lang,
                None => languages.push(lang),
            }
        }
        Catalogue { languages }
    }

    pub fn languages(&self) -> &[Language] {
        &self.languages
    }

    /// The language named `name` or with `name` as an alias (case-insensitive).
    pub fn find(&self, name: &str) -> Option<&Language> {
        let name = name.trim();
        self.languages.iter().find(|l| {
            l.name.eq_ignore_ascii_case(name)
                || l.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
    }

    fn check(&self, origin: &str) -> Result<(), CatalogueError> {
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for lang in &self.languages {
            let bad = |reason: String| CatalogueError::Invalid {
                origin: origin.to_owned(),
                name: lang.name.clone(),
                reason,
            };
            if lang.name.trim().is_empty() {
                return Err(bad("the name is empty".into()));
            }
            for name in std::iter::once(&lang.name).chain(&lang.aliases) {
                if let Some(other) = seen.insert(name.to_ascii_lowercase(), &lang.name) {
                    return Err(bad(format!("{name:?} also names language {other:?}")));
                }
            }
            check_file_name(&lang.source_file).map_err(|r| bad(format!("source_file: {r}")))?;
            for (field, argv) in [
                ("run", Some(&lang.run)),
                ("version", Some(&lang.version)),
                ("compile", lang.compile.as_ref()),
            ] {
                if let Some(argv) = argv {
                    if argv.first().is_none_or(|a| a.is_empty()) {
                        return Err(bad(format!("{field}: needs a program")));
                    }
                }
            }
            if !lang.compile_limits.is_empty() && lang.compile.is_none() {
                return Err(bad(
                    "compile_limits: the language has no compile stage (compile)".into(),
                ));
            }
            lang.compile_limits
                .check()
                .map_err(|r| bad(format!("compile_limits.{r}")))?;
            if lang.warm.is_some() && lang.compile.is_some() {
                return Err(bad(
                    "warm: a language with a compile stage runs its program exec'd".into(),
                ));
            }
        }
        Ok(())
    }
}

/// A file name a program may be written to: relative, inside the working directory.
fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.starts_with('/') || name.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err(format!("{name:?} must be a relative path without '..'"));
    }
    if name.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    Ok(())
}

/// Whether `version` satisfies `wanted`: `*` (or empty) takes any; otherwise `wanted`'s
/// dotted components are a prefix of `version`'s (`3` and `3.11` take `3.11.2`, `3.1` does
/// not), an `x` or `*` component taking any value.
pub fn version_matches(version: &str, wanted: &str) -> bool {
    let wanted = wanted.trim();
    if wanted.is_empty() || wanted == "*" {
        return true;
    }
    let have: Vec<&str> = version.split('.').collect();
    let want: Vec<&str> = wanted.split('.').collect();
    want.len() <= have.len()
        && want
            .iter()
            .zip(&have)
            .all(|(w, h)| *w == "*" || w.eq_ignore_ascii_case("x") || w == h)
}

/// The runtime of `available` that answers (`name`, `version`): the language by name or
/// alias, then the highest of its available versions that matches.
pub fn select<'a>(
    catalogue: &'a Catalogue,
    available: &[Available],
    name: &str,
    version: &str,
) -> Result<(&'a Language, Available), LookupError> {
    let lang = catalogue
        .find(name)
        .ok_or_else(|| LookupError::UnknownLanguage(name.to_owned()))?;
    let versions: BTreeSet<&str> = available
        .iter()
        .filter(|a| a.language == lang.name)
        .map(|a| a.version.as_str())
        .collect();
    let best = versions
        .iter()
        .filter(|v| version_matches(v, version))
        .max_by(|a, b| compare_versions(a, b));
    match best {
        Some(v) => Ok((
            lang,
            Available {
                language: lang.name.clone(),
                version: (*v).to_owned(),
            },
        )),
        None => Err(LookupError::NoVersion {
            language: lang.name.clone(),
            version: version.to_owned(),
            available: if versions.is_empty() {
                "none".into()
            } else {
                versions.into_iter().collect::<Vec<_>>().join(", ")
            },
        }),
    }
}

/// Orders dotted versions by their numeric components (`1.10` after `1.9`).
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b))
}

/// The version a probe printed: the first dotted number of `text` (`Python 3.11.2` → 3.11.2,
/// `go1.19.8` → 1.19.8, `v20.1.0` → 20.1.0), else its first number (Erlang's `25`).
pub fn parse_version(text: &str) -> Option<String> {
    let mut runs = Vec::new();
    let mut current = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() || (c == '.' && !current.is_empty()) {
            current.push(c);
        } else if !current.is_empty() {
            runs.push(current.trim_end_matches('.').to_owned());
            current.clear();
        }
    }
    runs.iter()
        .find(|r| r.contains('.'))
        .or_else(|| runs.first())
        .cloned()
}

/// A file of a program: its name (optional for the first, the main one) and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub name: Option<String>,
    pub content: FileData,
}

impl Language {
    /// The file name a program's main source goes in: the catalogue's, or with the class rule
    /// `<Class>.java` after the source's public class (else its first class).
    pub fn source_name(&self, source: &str) -> String {
        if !self.class_rule {
            return self.source_file.clone();
        }
        let ext = Path::new(&self.source_file)
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        match main_class(source) {
            Some(class) => format!("{class}{ext}"),
            None => self.source_file.clone(),
        }
    }

    /// A staged job for a program of this language: its files (the first is the main one,
    /// named by [`Language::source_name`] when it has no name), the compile stage if the
    /// language has one (with the catalogue's compile limits), and the run command followed by
    /// `args`. Stdin, the run's timeout and limits are the caller's to set on the returned job.
    pub fn expand(&self, files: &[SourceFile], args: &[String]) -> Result<Job, ExpandError> {
        let first = files.first().ok_or(ExpandError::NoFiles)?;
        let main = match &first.name {
            Some(name) => name.clone(),
            None => {
                let text = first.content.to_bytes().unwrap_or_default();
                self.source_name(&String::from_utf8_lossy(&text))
            }
        };
        let mut out = BTreeMap::new();
        for (index, file) in files.iter().enumerate() {
            let name = match (index, &file.name) {
                (0, _) => main.clone(),
                (_, Some(name)) => name.clone(),
                (_, None) => return Err(ExpandError::Unnamed(index)),
            };
            check_file_name(&name).map_err(|reason| ExpandError::BadName { index, reason })?;
            out.insert(name, file.content.clone());
        }
        let stem = Path::new(&main)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| main.clone());
        let fill = |argv: &[String]| -> Vec<String> {
            argv.iter()
                .map(|a| a.replace("{source}", &main).replace("{stem}", &stem))
                .collect()
        };
        let mut argv = fill(&self.run);
        argv.extend(args.iter().cloned());
        Ok(Job {
            argv: Some(argv),
            files: out,
            compile: self.compile.as_ref().map(|c| CompileStage {
                timeout_ms: self.compile_limits.timeout_ms,
                limits: self.compile_limits.stage_limits(),
                ..CompileStage::argv(fill(c))
            }),
            runtime: self.warm,
            ..Job::default()
        })
    }
}

/// The class a Java source is run by: its public class, else its first class.
fn main_class(source: &str) -> Option<String> {
    const MODIFIERS: [&str; 5] = ["final", "abstract", "static", "strictfp", "sealed"];
    let words: Vec<&str> = source
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut first = None;
    for (i, w) in words.iter().enumerate() {
        if *w != "class" {
            continue;
        }
        let Some(name) = words.get(i + 1).filter(|n| is_java_identifier(n)) else {
            continue;
        };
        first.get_or_insert(*name);
        let public = words[..i]
            .iter()
            .rev()
            .take_while(|m| MODIFIERS.contains(m) || **m == "public")
            .any(|m| *m == "public");
        if public {
            return Some((*name).to_owned());
        }
    }
    first.map(str::to_owned)
}

fn is_java_identifier(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests;
