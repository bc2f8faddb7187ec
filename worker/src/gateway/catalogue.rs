//! The languages the gateway offers: the runtime catalogue's languages (`crate::runtimes`)
//! that the fleet's workers published with their heartbeats, each with its version and the
//! names the three foreign APIs know it by (Piston's name, SandboxFusion's, Judge0 CE's ids).
//!
//! How a language is compiled and run is the runtime catalogue's alone
//! ([`crate::runtimes::Language::expand`]); this module only adds the foreign names.

use forkbox_queue::schema::FileData;

use crate::runtimes::{self, compare_versions, Available, SourceFile};

/// How the foreign APIs name one catalogue language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignNames {
    /// Piston's name (what `piston-client` matches exactly).
    pub piston: &'static str,
    /// SandboxFusion's names.
    pub fusion: &'static [&'static str],
    /// Judge0 CE 1.13.1 ids that run on it.
    pub judge0_ids: &'static [u32],
    /// Judge0's label before the version (`C++ (GCC` in `C++ (GCC 12.2.0)`).
    pub judge0_label: &'static str,
}

/// The foreign names of the catalogue's language `name`; a language not listed here is
/// offered to Piston and SandboxFusion under its own name and has no Judge0 id.
#[rustfmt::skip]
pub fn foreign_names(name: &str) -> Option<ForeignNames> {
    let f = |piston, fusion, judge0_ids, judge0_label| ForeignNames { piston, fusion, judge0_ids, judge0_label };
    Some(match name {
        "python3" => f("python", &["python"][..], &[71][..], "Python ("),
        "javascript" => f("javascript", &["nodejs"], &[63], "JavaScript (Node.js"),
        "typescript" => f("typescript", &["typescript"], &[74], "TypeScript ("),
        "c" => f("c", &["c"], &[50, 49, 48], "C (GCC"),
        "c++" => f("c++", &["cpp"], &[54, 53, 52], "C++ (GCC"),
        "java" => f("java", &["java"], &[62], "Java (OpenJDK"),
        "go" => f("go", &["go"], &[60], "Go ("),
        "rust" => f("rust", &["rust"], &[73], "Rust ("),
        "ruby" => f("ruby", &["ruby"], &[72], "Ruby ("),
        "perl" => f("perl", &["perl"], &[85], "Perl ("),
        "bash" => f("bash", &["bash"], &[46], "Bash ("),
        "erlang" => f("erlang", &["erlang"], &[58], "Erlang (OTP"),
        "lua" => f("lua", &["lua"], &[64], "Lua ("),
        _ => return None,
    })
}

/// One language the gateway offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Language {
    /// The catalogue's entry: names, files, compile and run commands.
    pub runtime: runtimes::Language,
    /// The version the fleet runs (the highest published).
    pub version: String,
    pub piston: String,
    pub fusion: Vec<String>,
    pub judge0_ids: Vec<u32>,
    pub judge0_label: String,
}

impl Language {
    /// Offers catalogue entry `runtime` at `version`.
    pub fn new(runtime: runtimes::Language, version: String) -> Language {
        let names = foreign_names(&runtime.name);
        Language {
            piston: names.map_or_else(|| runtime.name.clone(), |n| n.piston.to_owned()),
            fusion: names.map_or_else(
                || vec![runtime.name.clone()],
                |n| n.fusion.iter().map(|s| (*s).to_owned()).collect(),
            ),
            judge0_ids: names.map_or_else(Vec::new, |n| n.judge0_ids.to_vec()),
            judge0_label: names.map_or_else(
                || format!("{} (", runtime.name),
                |n| n.judge0_label.to_owned(),
            ),
            runtime,
            version,
        }
    }

    pub fn name(&self) -> &str {
        &self.runtime.name
    }

    /// Whether this language has a compile stage.
    pub fn is_compiled(&self) -> bool {
        self.runtime.compile.is_some()
    }

    /// The file a program's main source goes in (Java's class rule applied).
    pub fn source_name(&self, source: &str) -> String {
        self.runtime.source_name(source)
    }

    /// The compile and run commands for a main file named `file`, as argv.
    pub fn commands(&self, file: &str) -> (Option<Vec<String>>, Vec<String>) {
        let job = self
            .runtime
            .expand(
                &[SourceFile {
                    name: Some(file.to_owned()),
                    content: FileData::Text(String::new()),
                }],
                &[],
            )
            .unwrap_or_default();
        (
            job.compile.and_then(|c| c.argv),
            job.argv.unwrap_or_default(),
        )
    }

    /// Whether `name` (case-insensitive) names this language: its catalogue name or aliases,
    /// or a foreign API's name for it.
    pub fn is_called(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        self.runtime.name == name
            || self.runtime.aliases.contains(&name)
            || self.piston == name
            || self.fusion.contains(&name)
    }
}

/// The languages this gateway offers, with their versions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalogue {
    languages: Vec<Language>,
}

impl Catalogue {
    /// A catalogue of exactly these languages.
    pub fn new(languages: Vec<Language>) -> Catalogue {
        Catalogue { languages }
    }

    /// The entries of `catalogue` that some worker published in `available`, each at the
    /// highest version published for it.
    pub fn offered(catalogue: &runtimes::Catalogue, available: &[Available]) -> Catalogue {
        let languages = catalogue
            .languages()
            .iter()
            .filter_map(|l| {
                let version = available
                    .iter()
                    .filter(|a| a.language == l.name)
                    .map(|a| a.version.as_str())
                    .max_by(|a, b| compare_versions(a, b))?;
                Some(Language::new(l.clone(), version.to_owned()))
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
    pub fn judge0_ids(&self) -> std::collections::BTreeMap<u32, &Language> {
        self.languages
            .iter()
            .flat_map(|l| l.judge0_ids.iter().map(move |&id| (id, l)))
            .collect()
    }
}

/// Every built-in language at version `version`: the catalogue the translation tests use.
#[cfg(test)]
pub fn all_at(version: &str) -> Catalogue {
    let builtin = runtimes::Catalogue::builtin();
    let available: Vec<Available> = builtin
        .languages()
        .iter()
        .map(|l| Available {
            language: l.name.clone(),
            version: version.to_owned(),
        })
        .collect();
    Catalogue::offered(&builtin, &available)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_language_has_foreign_names() {
        for l in runtimes::Catalogue::builtin().languages() {
            assert!(foreign_names(&l.name).is_some(), "{}", l.name);
        }
    }

    #[test]
    fn the_fleet_decides_what_is_offered_and_at_which_version() {
        let builtin = runtimes::Catalogue::builtin();
        let a = |language: &str, version: &str| Available {
            language: language.into(),
            version: version.into(),
        };
        let cat = Catalogue::offered(
            &builtin,
            &[
                a("python3", "3.9.2"),
                a("python3", "3.11.7"),
                a("c++", "12.2.0"),
            ],
        );
        let names: Vec<&str> = cat.languages().iter().map(Language::name).collect();
        assert_eq!(names, ["python3", "c++"]);
        assert_eq!(cat.find("python").unwrap().version, "3.11.7");
        assert!(cat.find("java").is_none());
    }

    #[test]
    fn every_foreign_name_finds_its_language() {
        let cat = all_at("1.0.0");
        for (name, want) in [
            ("python", "python3"),
            ("Python3", "python3"),
            ("c++", "c++"),
            ("cpp", "c++"),
            ("nodejs", "javascript"),
            ("js", "javascript"),
            ("go", "go"),
            ("rust", "rust"),
            ("erlang", "erlang"),
        ] {
            assert_eq!(cat.find(name).map(Language::name), Some(want), "{name}");
        }
        assert!(cat.find("cobol").is_none());
        assert_eq!(cat.by_judge0_id(54).map(Language::name), Some("c++"));
        assert_eq!(cat.by_judge0_id(71).map(Language::name), Some("python3"));
        assert!(cat.by_judge0_id(70).is_none());
        let ids: usize = cat.languages().iter().map(|l| l.judge0_ids.len()).sum();
        assert_eq!(
            cat.judge0_ids().len(),
            ids,
            "each Judge0 id belongs to one language"
        );
    }

    #[test]
    fn commands_come_from_the_runtime_catalogue() {
        let cat = all_at("1.0.0");
        let java = cat.find("java").unwrap();
        let file = java.source_name("public final class Solution { }");
        assert_eq!(file, "Solution.java");
        let (compile, run) = java.commands(&file);
        assert!(compile.unwrap().contains(&"Solution.java".to_owned()));
        assert!(run.contains(&"Solution".to_owned()), "{run:?}");
        let (compile, run) = cat.find("python").unwrap().commands("main.py");
        assert_eq!(
            (compile, run),
            (None, vec!["python3".to_owned(), "main.py".to_owned()])
        );
    }
}
