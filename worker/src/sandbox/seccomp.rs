//! The seccomp policy: one declarative deny list, compiled once per zygote.
//!
//! Everything not listed is allowed, so programs run unmodified; what is listed either changes
//! the kernel's view of the world (mounts, namespaces, modules, clocks, keyrings), or opens a
//! large attack surface that untrusted code has no business with (bpf, io_uring, userfaultfd,
//! perf). Denied calls fail with EPERM, so programs see an ordinary error. Syscalls from a
//! foreign ABI (i386 via `int 0x80`, x32 numbers with bit 30 set) fail with EPERM too: the
//! filter only allows the native ABI, so no deny rule can be bypassed through a twin number.

use std::io::{Read, Seek};

use libseccomp::{ScmpAction, ScmpFilterContext, ScmpSyscall};

use super::sys::SockFilter;

/// Syscalls denied with EPERM inside every sandbox.
pub const DENIED: &[&str] = &[
    // Mount table and root changes.
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    // Namespaces.
    "unshare",
    "setns",
    // Other processes' memory.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    // Kernel attack surface.
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "lookup_dcookie",
    // Keyrings are not namespaced.
    "keyctl",
    "add_key",
    "request_key",
    // File handles bypass path-based confinement.
    "open_by_handle_at",
    "name_to_handle_at",
    // Machine-wide state.
    "reboot",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "iopl",
    "ioperm",
    "quotactl",
    "vhangup",
];

/// Why the policy could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: unknown syscall {0:?} in the deny list")]
    UnknownSyscall(&'static str),
    #[error("seccomp: {0}")]
    Libseccomp(#[from] libseccomp::error::SeccompError),
    #[error("seccomp: exporting the BPF program: {0}")]
    Export(#[from] std::io::Error),
    #[error("seccomp: exported program has {0} bytes, not a whole number of instructions")]
    Malformed(usize),
}

/// Compiles [`DENIED`] into a BPF program for the native architecture.
pub fn compile() -> Result<Vec<SockFilter>, SeccompError> {
    let mut ctx = ScmpFilterContext::new_filter(ScmpAction::Allow)?;
    ctx.set_act_badarch(ScmpAction::Errno(libc::EPERM))?;
    // The sandbox sets no_new_privs itself, just before loading the program.
    ctx.set_ctl_nnp(false)?;
    // A binary search over syscall numbers instead of one comparison per denied call: the
    // kernel runs the program once per syscall number when it is loaded (to cache the calls
    // it always allows), inside every sandbox, so its length is paid on every spawn. Where
    // libseccomp or the kernel lacks the option, the linear program enforces the same policy.
    let _ = ctx.set_ctl_optimize(2);
    for name in DENIED {
        let call = ScmpSyscall::from_name(name).map_err(|_| SeccompError::UnknownSyscall(name))?;
        ctx.add_rule(ScmpAction::Errno(libc::EPERM), call)?;
    }
    let fd = nix::sys::memfd::memfd_create(
        c"forkbox-seccomp",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut file = std::fs::File::from(fd);
    ctx.export_bpf(&mut file)?;
    file.rewind()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    const INSN: usize = std::mem::size_of::<SockFilter>();
    if bytes.is_empty() || bytes.len() % INSN != 0 {
        return Err(SeccompError::Malformed(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(INSN)
        .map(|c| SockFilter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_denied_name_is_a_real_syscall_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for name in DENIED {
            assert!(
                ScmpSyscall::from_name(name).is_ok(),
                "{name} is not a syscall"
            );
            assert!(seen.insert(name), "{name} listed twice");
        }
    }

    #[test]
    fn design_minimum_is_covered() {
        let required = "mount umount2 pivot_root ptrace bpf reboot kexec_load kexec_file_load \
            init_module finit_module delete_module unshare setns keyctl add_key request_key \
            perf_event_open userfaultfd open_by_handle_at name_to_handle_at process_vm_readv \
            process_vm_writev swapon swapoff acct settimeofday clock_settime clock_adjtime adjtimex \
            syslog iopl ioperm quotactl io_uring_setup io_uring_enter io_uring_register \
            lookup_dcookie vhangup fsopen fsmount move_mount open_tree fspick mount_setattr";
        for name in required.split_whitespace() {
            assert!(DENIED.contains(&name), "{name} missing from the deny list");
        }
    }

    /// Runs a classic BPF seccomp program over (arch, nr); returns the action and the number
    /// of instructions executed. Only the instructions a libseccomp export uses are known.
    fn run(prog: &[SockFilter], arch: u32, nr: u32) -> (u32, usize) {
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let i = prog[pc];
            steps += 1;
            let jump = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
            pc = match i.code {
                0x20 => {
                    acc = match i.k {
                        0 => nr,
                        4 => arch,
                        k => panic!("load of seccomp_data offset {k}"),
                    };
                    pc + 1
                }
                0x15 => jump(acc == i.k),
                0x25 => jump(acc > i.k),
                0x35 => jump(acc >= i.k),
                0x45 => jump(acc & i.k != 0),
                0x05 => pc + 1 + i.k as usize,
                0x06 => return (i.k, steps),
                c => panic!("instruction {c:#x} at {pc}"),
            };
        }
    }

    #[test]
    fn program_denies_exactly_the_list_in_a_few_steps() {
        const X86_64: u32 = 0xc000_003e;
        const ALLOW: u32 = 0x7fff_0000;
        const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
        let prog = compile().unwrap();
        let denied: Vec<u32> = DENIED
            .iter()
            .map(|n| i32::from(ScmpSyscall::from_name(n).unwrap()) as u32)
            .collect();
        let mut longest = 0;
        for nr in 0..1024 {
            let (action, steps) = run(&prog, X86_64, nr);
            let want = if denied.contains(&nr) { EPERM } else { ALLOW };
            assert_eq!(action, want, "syscall {nr}");
            longest = longest.max(steps);
            // The x32 twin of every number, and any other architecture, are refused.
            assert_eq!(run(&prog, X86_64, nr | 0x4000_0000).0, EPERM);
            assert_eq!(run(&prog, 0x4000_0003, nr).0, EPERM);
        }
        // A binary search: a linear list would walk past every denied number.
        assert!(
            longest < DENIED.len() / 2,
            "{longest} instructions for one syscall"
        );
    }

    #[test]
    fn program_compiles_and_checks_the_architecture_first() {
        let prog = compile().unwrap();
        assert!(prog.len() > DENIED.len());
        // First instruction loads seccomp_data.arch (offset 4).
        assert_eq!(prog[0].code, 0x20);
        assert_eq!(prog[0].k, 4);
        // The x32 guard: a comparison against 0x40000000 somewhere in the program.
        assert!(prog.iter().any(|i| i.k == 0x4000_0000), "no x32 guard");
    }
}
