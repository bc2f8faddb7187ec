//! The error of a set-up step that failed before the program ran, in any process of the
//! sandbox tree: which step, on which path, why, and whose fault it was. It crosses processes
//! inside the messages of `wire` (and the launcher's exec note), so it is plain data.

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::limits::RlimitError;

/// Whose fault a failed set-up step is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The sandbox's or the host's: the job did not run, and may run elsewhere (`error`).
    #[default]
    Sandbox,
    /// The job's own input (its files, its working directory): running it again would fail
    /// the same way (`invalid`).
    Job,
}

/// Why a set-up step failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A system call's errno, shown as nix shows it (`ENOENT: No such file or directory`).
    Errno(i32),
    /// The errno of a standard library I/O error, shown as it shows it (`No such file or
    /// directory (os error 2)`).
    Io(i32),
    /// What no errno tells.
    Text(String),
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Errno(n) => Errno::from_raw(*n).fmt(f),
            Cause::Io(n) => std::io::Error::from_raw_os_error(*n).fmt(f),
            Cause::Text(t) => f.write_str(t),
        }
    }
}

/// A set-up step that failed before the program ran: which step, on which path, why, and
/// whose fault it was. Shown as `<step>[ <path>][: <cause>]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupError {
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    #[serde(default)]
    pub fault: Fault,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.step)?;
        if let Some(path) = &self.path {
            write!(f, " {path}")?;
        }
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SetupError {}

impl SetupError {
    /// A failure that its step's name says all about.
    pub fn new(step: impl Into<String>) -> SetupError {
        SetupError {
            step: step.into(),
            path: None,
            cause: None,
            fault: Fault::Sandbox,
        }
    }

    /// A system call of `step` failed with `errno`.
    pub fn errno(step: impl Into<String>, errno: Errno) -> SetupError {
        SetupError {
            cause: Some(Cause::Errno(errno as i32)),
            ..SetupError::new(step)
        }
    }

    /// An I/O operation of `step` failed.
    pub fn io(step: impl Into<String>, error: &std::io::Error) -> SetupError {
        let cause = match error.raw_os_error() {
            Some(n) => Cause::Io(n),
            None => Cause::Text(error.to_string()),
        };
        SetupError {
            cause: Some(cause),
            ..SetupError::new(step)
        }
    }

    /// `step` failed for a reason no errno tells.
    pub fn text(step: impl Into<String>, reason: impl std::fmt::Display) -> SetupError {
        SetupError {
            cause: Some(Cause::Text(reason.to_string())),
            ..SetupError::new(step)
        }
    }

    /// The path the step worked on.
    pub fn at(self, path: impl Into<String>) -> SetupError {
        SetupError {
            path: Some(path.into()),
            ..self
        }
    }

    /// Caused by the job's own input.
    pub fn of_job(self) -> SetupError {
        SetupError {
            fault: Fault::Job,
            ..self
        }
    }

    /// The errno behind it, if a system call's.
    pub fn errno_value(&self) -> Option<Errno> {
        match self.cause {
            Some(Cause::Errno(n) | Cause::Io(n)) => Some(Errno::from_raw(n)),
            _ => None,
        }
    }
}

impl From<RlimitError> for SetupError {
    fn from(e: RlimitError) -> SetupError {
        SetupError::errno(e.name, e.errno)
    }
}
