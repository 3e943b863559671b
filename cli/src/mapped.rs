//! The checkpoint files this process maps, watched: [`check_unchanged`]
//! before the maps are read again, and a SIGBUS handler that names the
//! file when a read faults all the same.
//!
//! A file truncated while mapped faults on the next read past its new end
//! (SIGBUS), which kills the process without a word. The CPU backend reads
//! its weights from the maps on every forward pass, and streamed experts
//! are read from them during decode, so the commands check the files
//! before each pass (one `fstat` a file); a truncation during a pass still
//! faults, and the handler then writes which file it was and exits 1, as
//! every other error does.

use std::sync::{Arc, Mutex};

use turbospark::model::checkpoint::MappedFile;
use turbospark::model::Checkpoint;

/// Every checkpoint file mapped so far. Held for the process's life: the
/// maps stay mapped, so an address the handler finds in one is that file's
/// and no other mapping's.
static WATCHED: Mutex<Vec<Arc<MappedFile>>> = Mutex::new(Vec::new());

/// Watches `ck`'s mapped files: [`check_unchanged`] checks them, and a
/// fault in their maps is reported by name.
pub fn watch(ck: &Checkpoint) {
    let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    watched.extend(ck.mapped_files());
    #[cfg(unix)]
    sigbus::publish(&watched);
}

/// An error naming the first watched file that was truncated or rewritten
/// since it was mapped ([`MappedFile::check_unchanged`]).
pub fn check_unchanged() -> turbospark::Result<()> {
    let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    watched.iter().try_for_each(|f| f.check_unchanged())
}

/// Installs the SIGBUS handler (Unix; elsewhere a file cannot shrink under
/// a map).
pub fn install_fault_handler() {
    #[cfg(unix)]
    sigbus::install();
}

/// The handler. `libc` supplies `sigaction` and `siginfo_t`, whose layouts
/// differ between Linux and macOS and between architectures (a declaration
/// of our own would have to get each right); it is already in the build,
/// through memmap2.
#[cfg(unix)]
mod sigbus {
    use std::ops::Range;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::Arc;

    use turbospark::model::checkpoint::MappedFile;

    /// What the handler reads: each map's addresses and the message naming
    /// its file, made before any fault (a handler may not allocate).
    struct Registry {
        maps: Vec<(Range<usize>, Vec<u8>)>,
    }

    /// The current registry; each is leaked, never freed: a handler may be
    /// reading an older one while a newer one is published.
    static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(std::ptr::null_mut());
    /// The disposition before ours (Rust's own, which reports a stack
    /// overflow), restored for a fault outside the maps.
    static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

    pub fn message(path: &std::path::Path) -> String {
        format!(
            "error: checkpoint {}: truncated or changed on disk while this run read it \
             through a memory map (SIGBUS): a checkpoint must not change while it is in use\n",
            path.display()
        )
    }

    pub fn publish(files: &[Arc<MappedFile>]) {
        let maps = files
            .iter()
            .map(|f| (f.address_range(), message(f.path()).into_bytes()))
            .collect();
        let reg = Box::into_raw(Box::new(Registry { maps }));
        REGISTRY.store(reg, Ordering::Release);
    }

    pub fn install() {
        // SAFETY: a zeroed sigaction is a valid value of the C struct; the
        // handler has the three-argument signature SA_SIGINFO asks for, and
        // the old disposition is written to memory we own (leaked, so the
        // handler may read it at any time).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigbus;
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            let previous = Box::into_raw(Box::new(std::mem::zeroed::<libc::sigaction>()));
            if libc::sigaction(libc::SIGBUS, &action, previous) == 0 {
                PREVIOUS.store(previous, Ordering::Release);
            } else {
                drop(Box::from_raw(previous));
            }
        }
    }

    /// Only async-signal-safe calls: atomic loads, `write`, `_exit`,
    /// `sigaction`.
    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO; a
        // published registry is never freed.
        unsafe {
            let addr = (*info).si_addr() as usize;
            let reg = REGISTRY.load(Ordering::Acquire);
            if let Some(reg) = reg.as_ref() {
                if let Some((_, msg)) = reg.maps.iter().find(|(r, _)| r.contains(&addr)) {
                    let mut rest: &[u8] = msg;
                    while !rest.is_empty() {
                        let n = libc::write(2, rest.as_ptr().cast(), rest.len());
                        if n <= 0 {
                            break;
                        }
                        rest = &rest[n as usize..];
                    }
                    libc::_exit(1);
                }
            }
            // Not a checkpoint's map: the disposition before ours takes the
            // fault when the instruction runs again.
            let previous = PREVIOUS.load(Ordering::Acquire);
            if previous.is_null() {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            } else {
                libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const CHILD_DIR: &str = "TURBOSPARK_SIGBUS_TEST_DIR";

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text")
    }

    fn copy_fixture(dir: &Path) {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
        }
    }

    /// Run by [`a_fault_in_a_map_names_its_file`] in a child process: maps
    /// a checkpoint, truncates it, and reads a tensor (the fault must end
    /// the process before the panic).
    #[test]
    #[ignore = "run in a child process by a_fault_in_a_map_names_its_file"]
    fn sigbus_child() {
        let dir = PathBuf::from(std::env::var_os(CHILD_DIR).expect("run by the parent test"));
        let ck = Checkpoint::open(&dir).unwrap();
        watch(&ck);
        install_fault_handler();
        check_unchanged().unwrap();
        let t = ck.tensor("norm.weight").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("model.safetensors"))
            .unwrap()
            .set_len(0)
            .unwrap();
        assert!(check_unchanged().is_err());
        let bytes = t.bytes.as_slice();
        // SAFETY: inside the map's bounds; the read faults (the file is
        // empty now), which is what is tested.
        let b = unsafe { std::ptr::read_volatile(bytes.as_ptr()) };
        panic!("read {b} from a truncated map without a fault");
    }

    /// A read of a map whose file was truncated ends the process with a
    /// message naming the file and exit status 1, not a silent SIGBUS.
    #[test]
    fn a_fault_in_a_map_names_its_file() {
        let dir = std::env::temp_dir().join(format!("turbospark-sigbus-{}", std::process::id()));
        copy_fixture(&dir);
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "mapped::tests::sigbus_child"])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, &dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{:?}: {err}", out.status);
        let want = sigbus::message(&dir.join("model.safetensors"));
        assert!(err.contains(&want), "{err}");
        assert!(!err.contains("without a fault"), "{err}");
    }
}
