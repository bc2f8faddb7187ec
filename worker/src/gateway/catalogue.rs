//! The languages the gateway offers: for each, the names the three foreign APIs know it by,
//! the source file it expects, the compile and run commands, and how its version is found.
//!
//! The entries are data; [`Catalogue::probe`] keeps those whose toolchain answers its version
//! command on this host, with the version it printed. A client asks for a language by any of
//! its names ([`Catalogue::find`]), and what it gets is a [`Language`], from which
//! [`crate::gateway::exec`] builds the staged job.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// One language, as the gateway runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Language {
    /// The catalogue's own name (`python3`, `cpp`, ...).
    pub name: &'static str,
    /// Other names a client may use (Piston aliases, SandboxFusion names).
    pub aliases: &'static [&'static str],
    /// Piston's name for it (what `piston-client` matches exactly).
    pub piston: &'static str,
    /// SandboxFusion's names for it.
    pub fusion: &'static [&'static str],
    /// Judge0 CE 1.13.1 ids that run on it; the first is the one `/languages` names first.
    pub judge0_ids: &'static [u32],
    /// Judge0's label before the version (`C++ (GCC` in `C++ (GCC 12.2.0)`).
    pub judge0_label: &'static str,
    /// The source file's name in the working directory ([`Language::source_name`] applies
    /// Java's class rule).
    pub source: &'static str,
    /// Shell command of the compile stage, if the language has one.
    pub compile: Option<&'static str>,
    /// Shell command of the run stage; the client's arguments follow it.
    pub run: &'static str,
    /// The program and arguments that print the version.
    pub version_cmd: &'static [&'static str],
    /// The version found on this host (empty until probed).
    pub version: String,
}

impl Language {
    /// The source file name for `source`: Java's public class gives its file its name.
    pub fn source_name(&self, source: &str) -> String {
        if self.name == "java" {
            if let Some(class) = java_public_class(source) {
                return format!("{class}.java");
            }
        }
        self.source.to_owned()
    }

    /// The run command for a source file named `file` (Java runs the class of that name).
    pub fn run_command(&self, file: &str) -> String {
        if self.name == "java" {
            let class = file.strip_suffix(".java").unwrap_or(file);
            return format!("java -cp . {class}");
        }
        self.run.to_owned()
    }

    /// The compile command for a source file named `file`.
    pub fn compile_command(&self, file: &str) -> Option<String> {
        let cmd = self.compile?;
        Some(if self.name == "java" {
            format!("javac -encoding UTF-8 {file}")
        } else {
            cmd.to_owned()
        })
    }

    /// Whether `name` (case-insensitive) names this language.
    pub fn is_called(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        self.name == name
            || self.piston == name
            || self.aliases.contains(&name.as_str())
            || self.fusion.contains(&name.as_str())
    }
}

/// The identifier after `public class` (or `public final class`), if any.
fn java_public_class(source: &str) -> Option<String> {
    let mut words = source.split(|c: char| c.is_whitespace() || c == '{');
    while let Some(w) = words.next() {
        if w != "public" {
            continue;
        }
        let mut next = words.by_ref().filter(|w| !w.is_empty());
        let mut kind = next.next()?;
        while matches!(kind, "final" | "abstract" | "static") {
            kind = next.next()?;
        }
        if kind == "class" {
            let name = next.next()?;
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '$');
            return valid.then(|| name.to_owned());
        }
    }
    None
}

/// The languages the gateway knows, before probing (one row each).
#[rustfmt::skip]
pub fn builtin() -> Vec<Language> {
    let l = |name, aliases, piston, fusion, judge0_ids, judge0_label, source, compile, run, version_cmd| {
        Language {
            name,
            aliases,
            piston,
            fusion,
            judge0_ids,
            judge0_label,
            source,
            compile,
            run,
            version_cmd,
            version: String::new(),
        }
    };
    vec![
        l("python3", &["py", "py3", "python"][..], "python", &["python"][..], &[71][..], "Python (", "main.py", None, "python3 main.py", &["python3", "--version"][..]),
        l("javascript", &["js", "node", "node-js", "node-javascript"], "javascript", &["nodejs"], &[63], "JavaScript (Node.js", "main.js", None, "node main.js", &["node", "--version"]),
        l("typescript", &["ts"], "typescript", &["typescript"], &[74], "TypeScript (", "main.ts", Some("tsc --outDir . main.ts"), "node main.js", &["tsc", "--version"]),
        l("c", &["gcc"], "c", &["c"], &[50, 49, 48], "C (GCC", "main.c", Some("gcc -O2 -o main main.c -lm"), "./main", &["gcc", "-dumpfullversion"]),
        l("cpp", &["c++", "g++", "cxx"], "c++", &["cpp"], &[54, 53, 52], "C++ (GCC", "main.cpp", Some("g++ -O2 -o main main.cpp"), "./main", &["g++", "-dumpfullversion"]),
        l("java", &[], "java", &["java"], &[62], "Java (OpenJDK", "Main.java", Some("javac Main.java"), "java -cp . Main", &["javac", "-version"]),
        l("go", &["golang"], "go", &["go"], &[60], "Go (", "main.go", Some("GOCACHE=/tmp/go-cache go build -o main main.go"), "./main", &["go", "version"]),
        l("rust", &["rs"], "rust", &["rust"], &[73], "Rust (", "main.rs", Some("rustc -O -o main main.rs"), "./main", &["rustc", "--version"]),
        l("ruby", &["rb"], "ruby", &["ruby"], &[72], "Ruby (", "main.rb", None, "ruby main.rb", &["ruby", "--version"]),
        l("perl", &["pl"], "perl", &["perl"], &[85], "Perl (", "main.pl", None, "perl main.pl", &["perl", "-e", "print $^V"]),
        l("bash", &["sh"], "bash", &["bash"], &[46], "Bash (", "main.sh", None, "bash main.sh", &["bash", "--version"]),
        l("erlang", &["erl", "escript"], "erlang", &["erlang"], &[58], "Erlang (OTP", "main.erl", None, "escript main.erl", &["erl", "-noshell", "-eval", "io:format(\"~s\", [erlang:system_info(otp_release)]), halt()."]),
        l("lua", &[], "lua", &["lua"], &[64], "Lua (", "main.lua", None, "lua main.lua", &["lua", "-v"]),
    ]
}

/// The first dotted number in `text` (`Python 3.11.7` gives `3.11.7`; `v18.19.0` gives
/// `18.19.0`; `26` gives `26`).
pub fn version_in(text: &str) -> Option<String> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    Some(rest[..end].trim_end_matches('.').to_owned())
}

/// The languages this gateway offers, with their versions.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    languages: Vec<Language>,
}

impl Catalogue {
    /// A catalogue of exactly these languages (their versions already set).
    pub fn new(languages: Vec<Language>) -> Catalogue {
        Catalogue { languages }
    }

    /// The built-in languages whose version command answers on this host within a few
    /// seconds, with the version it printed; the others are left out.
    pub fn probe() -> Catalogue {
        let languages = builtin()
            .into_iter()
            .filter_map(|mut lang| {
                lang.version = probe_version(lang.version_cmd)?;
                Some(lang)
            })
            .collect();
        Catalogue { languages }
    }

    pub fn languages(&self) -> &[Language] {
        &self.languages
    }

    /// The language called `name` (any of its names, case-insensitive).
    pub fn find(&self, name: &str) -> Option<&Language> {
        self.languages.iter().find(|l| l.is_called(name))
    }

    /// The language with Judge0 id `id`.
    pub fn by_judge0_id(&self, id: u32) -> Option<&Language> {
        self.languages.iter().find(|l| l.judge0_ids.contains(&id))
    }

    /// Judge0 ids in ascending order, each with its language.
    pub fn judge0_ids(&self) -> BTreeMap<u32, &Language> {
        self.languages
            .iter()
            .flat_map(|l| l.judge0_ids.iter().map(move |&id| (id, l)))
            .collect()
    }
}

/// Runs `cmd` and reads a version from its output (stdout, else stderr: `javac -version`
/// prints on stderr in older JDKs).
fn probe_version(cmd: &[&str]) -> Option<String> {
    let (program, args) = cmd.split_first()?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    version_in(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_toolchains_print() {
        for (text, want) in [
            ("Python 3.11.7\n", "3.11.7"),
            ("v18.19.0\n", "18.19.0"),
            ("12.2.0\n", "12.2.0"),
            ("javac 17.0.13\n", "17.0.13"),
            ("go version go1.19.8 linux/amd64\n", "1.19.8"),
            ("rustc 1.83.0 (90b35a623 2024-11-26)\n", "1.83.0"),
            ("v5.36.0", "5.36.0"),
            ("25", "25"),
            ("GNU bash, version 5.2.15(1)-release", "5.2.15"),
        ] {
            assert_eq!(version_in(text).as_deref(), Some(want), "{text}");
        }
        assert_eq!(version_in("no digits"), None);
    }

    #[test]
    fn java_takes_its_file_name_from_the_public_class() {
        let java = builtin().into_iter().find(|l| l.name == "java").unwrap();
        let src = "import java.util.*;\npublic final class Solution {\n public static void main(String[] a) {}\n}";
        assert_eq!(java.source_name(src), "Solution.java");
        assert_eq!(java.run_command("Solution.java"), "java -cp . Solution");
        assert_eq!(java.source_name("class Main { }"), "Main.java");
        assert_eq!(java.source_name("public class{ }"), "Main.java");
        let cpp = builtin().into_iter().find(|l| l.name == "cpp").unwrap();
        assert_eq!(cpp.source_name("public class X {}"), "main.cpp");
    }

    #[test]
    fn every_foreign_name_finds_its_language() {
        let cat = Catalogue::new(builtin());
        for (name, want) in [
            ("python", "python3"),
            ("Python3", "python3"),
            ("c++", "cpp"),
            ("cpp", "cpp"),
            ("nodejs", "javascript"),
            ("js", "javascript"),
            ("go", "go"),
            ("rust", "rust"),
            ("erlang", "erlang"),
        ] {
            assert_eq!(cat.find(name).map(|l| l.name), Some(want), "{name}");
        }
        assert!(cat.find("cobol").is_none());
        assert_eq!(cat.by_judge0_id(54).map(|l| l.name), Some("cpp"));
        assert_eq!(cat.by_judge0_id(71).map(|l| l.name), Some("python3"));
        assert!(cat.by_judge0_id(70).is_none());
        // Each Judge0 id belongs to one language.
        let ids: usize = cat.languages().iter().map(|l| l.judge0_ids.len()).sum();
        assert_eq!(cat.judge0_ids().len(), ids);
    }
}
