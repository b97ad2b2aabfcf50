//! A verification in a process of its own. ONNX Runtime runs a model's
//! ops as native code, and on inputs a model does not define some of its
//! kernels end the process instead of returning an error (a Longformer
//! export run at sizes it was not traced for raises SIGFPE inside ONNX
//! Runtime). The run forks, the child verifies and sends back what the
//! run reports (verdict, text, JSON), and a child that a signal ends is
//! one error of the run: the tool itself never ends with it.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{anyhow, Result};
use serde::{Serialize, Serializer};

use super::{verify, Options};
use crate::onnx::ModelProto;
use crate::usage::internal_error;

/// A verification as a run reports it: its verdict, its text and its JSON
/// (those of `Verification`), computed in the process that verified.
#[derive(Debug, Clone)]
pub struct Verified {
    pub passed: bool,
    text: String,
    json: serde_json::Value,
}

impl Verified {
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl Serialize for Verified {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

/// `verify`, in a child process where one can be started (else in this
/// one). The child's error comes back as the message it printed; a child
/// ended by a signal is an error naming the signal.
pub fn verify_apart(
    original: (&ModelProto, &Path),
    rewritten: (&ModelProto, &Path),
    options: &Options,
) -> Result<Verified> {
    // (What the child sends: the verdict, text and JSON, or the error.)
    type Sent = std::result::Result<(bool, String, serde_json::Value), String>;
    let here = || -> Result<(bool, String, serde_json::Value)> {
        let v = verify(original, rewritten, options)?;
        Ok((v.passed, v.text(), serde_json::to_value(&v)?))
    };
    let verified = |(passed, text, json)| Verified { passed, text, json };
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors this process then owns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return here().map(verified);
    }
    // SAFETY: as above: each end is owned once.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child runs only this thread's code (the verification,
    // which takes no lock another thread of the run holds: nothing else
    // runs ONNX Runtime) and leaves by `_exit`, running no destructor or
    // handler of the parent's.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return here().map(verified);
    }
    if pid == 0 {
        drop(read_end);
        child_setup();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            here().map_err(|e: anyhow::Error| format!("{e:#}"))
        }));
        let sent: Sent = outcome.unwrap_or_else(|payload| Err(format!("{:#}", internal_error(payload.as_ref()))));
        let mut out = std::fs::File::from(write_end);
        let ok = serde_json::to_vec(&sent).ok().is_some_and(|bytes| out.write_all(&bytes).is_ok());
        // SAFETY: ends the child at once, as `fork`'s child must.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }
    drop(write_end);
    let mut bytes = Vec::new();
    let read = std::fs::File::from(read_end).read_to_end(&mut bytes);
    let status = wait(pid);
    match serde_json::from_slice::<Sent>(&bytes) {
        Ok(sent) if read.is_ok() => sent.map(verified).map_err(|message| anyhow!(message)),
        _ => Err(anyhow!("{}", ended(status, options))),
    }
}

/// The child's signals: those the run blocks for its clean-up thread
/// (`io::cleanup_on_signals`) taken as by default again, and the child
/// ended with the thread that forked it. A panic prints nothing there (the
/// lock of standard error may be held by a thread that is not in the
/// child, the progress spinner's): its message is sent back instead.
fn child_setup() {
    std::panic::set_hook(Box::new(|_| {}));
    // SAFETY: plain libc calls on a local signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

/// The child's status, once it has ended.
fn wait(pid: libc::pid_t) -> Option<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waits for this run's own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Some(status);
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return None;
        }
    }
}

/// Why a child sent no verification.
fn ended(status: Option<libc::c_int>, options: &Options) -> String {
    let how = match status {
        Some(s) if libc::WIFSIGNALED(s) => {
            let sig = libc::WTERMSIG(s);
            let name = match sig {
                libc::SIGFPE => " (SIGFPE: an integer division its kernel does not check)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGKILL => " (SIGKILL: out of memory?)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("ended with signal {sig}{name}")
        }
        Some(s) if libc::WIFEXITED(s) => format!("exited with code {}", libc::WEXITSTATUS(s)),
        _ => "ended unseen".to_string(),
    };
    let inputs = match &options.inputs {
        Some(file) => format!("the inputs of {}: the model may not compute at those values", file.display()),
        None => "inputs onnx-fuse chose: the model may not compute at those sizes or values; give them with --dim \
                 NAME=VALUE or --inputs FILE.npz"
            .to_string(),
    };
    format!("ONNX Runtime's process {how} while running the models, on {inputs}")
}
