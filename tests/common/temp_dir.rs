//! A directory of its own under the system's temporary directory, removed
//! when dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory named for `tag`, this process and a counter.
    pub fn new(tag: &str) -> TempDir {
        let d = TempDir::unmade(tag);
        std::fs::create_dir_all(&d.0).unwrap();
        d
    }

    /// [`TempDir::new`]'s path, not made (for a writer that must make it
    /// itself, or refuse to).
    pub fn unmade(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "turbospark-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }

    /// A new directory holding a copy of every file of `dir` (a fixture
    /// checkpoint to truncate or rewrite).
    pub fn copy_of(dir: &Path, tag: &str) -> TempDir {
        let d = TempDir::new(tag);
        for f in std::fs::read_dir(dir).unwrap() {
            let f = f.unwrap().path();
            if f.is_file() {
                std::fs::copy(&f, d.0.join(f.file_name().unwrap())).unwrap();
            }
        }
        d
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
