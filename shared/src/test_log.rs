//! For unit tests: what a subscriber wrote, read back.

use std::sync::{Arc, Mutex};

/// A writer into a shared buffer; clones write to the same one.
#[derive(Clone, Default)]
pub(crate) struct Logged(Arc<Mutex<Vec<u8>>>);

impl Logged {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Makes every thread's first use of a callsite count as interested, before a test sets
/// a subscriber for its own thread. `tracing` caches each callsite's interest for the
/// whole process, computed by the thread that reaches it first; with only one subscriber
/// registered, a sibling test's thread with none caches "never", and the test's own
/// subscriber then misses those events (tokio-rs/tracing#3611). A global default that
/// writes nothing keeps them interested; each test's thread-local subscriber still gets
/// its events.
pub(crate) fn keep_callsites_interested() {
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
}
