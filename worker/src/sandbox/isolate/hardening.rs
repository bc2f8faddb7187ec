//! Hardening: the isolation steps every program (and every collect) takes before it touches
//! any of the job's input, in the order the kernel requires.

use super::setup_error::SetupError;
use crate::sandbox::kernel::sys::SockFilter;
use crate::sandbox::kernel::syscalls::{Host, Syscalls};

/// What the zygote prepares once for every program: the compiled seccomp filter and the
/// capability range to drop (read from /proc before any sandbox exists).
pub struct Hardening {
    pub seccomp: Vec<SockFilter>,
    pub last_capability: libc::c_ulong,
}

/// The isolation steps that do not depend on the job, taken by the launcher before it
/// announces itself ready. Order: no_new_privs before seccomp (the kernel requires it
/// unprivileged) and before exec; capabilities dropped before seccomp, which may deny capset;
/// the filter last. Loading the filter (the kernel compiles it) is the costliest of them, and
/// none of it is on the spawn path. From here on the launcher handles the job's input (files,
/// paths, the working directory) with no capabilities and under the filter.
pub(crate) fn harden(hardening: &Hardening) -> Result<(), SetupError> {
    harden_with(&Host, hardening)
}

/// [`harden`], its calls made through `k`.
pub(super) fn harden_with(k: &impl Syscalls, hardening: &Hardening) -> Result<(), SetupError> {
    k.set_no_new_privs()
        .map_err(|e| SetupError::errno("no_new_privs", e))?;
    k.drop_all_capabilities(hardening.last_capability)
        .map_err(|e| SetupError::errno("drop capabilities", e))?;
    k.install_seccomp(&hardening.seccomp)
        .map_err(|e| SetupError::errno("seccomp", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::kernel::syscalls::recording::{Call, Recorder};

    fn hardening() -> Hardening {
        Hardening {
            seccomp: vec![
                SockFilter {
                    code: 0,
                    jt: 0,
                    jf: 0,
                    k: 0,
                };
                3
            ],
            last_capability: 40,
        }
    }

    /// no_new_privs before seccomp (the kernel requires it unprivileged), capabilities dropped
    /// before seccomp (which may deny capset), the filter last.
    #[test]
    fn no_new_privs_then_capabilities_then_seccomp() {
        let k = Recorder::default();
        harden_with(&k, &hardening()).unwrap();
        assert_eq!(
            k.calls(),
            [
                Call::NoNewPrivs,
                Call::DropCapabilities(40),
                Call::Seccomp(3)
            ]
        );
    }

    /// A refused step stops the rest (fail closed) and names itself.
    #[test]
    fn a_refused_step_stops_the_rest() {
        let k = Recorder {
            fail: Some(|c| matches!(c, Call::DropCapabilities(_))),
            ..Recorder::default()
        };
        let err = harden_with(&k, &hardening()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "drop capabilities: EPERM: Operation not permitted"
        );
        assert_eq!(k.calls(), [Call::NoNewPrivs, Call::DropCapabilities(40)]);
    }
}
